"""SWE-smith rows end to end, as published: parquet rows, images found by name, swe_eval CLI.

A real git project with a few commits; each row's `patch` introduces a bug into its clean
tree (written by editing the files and taking git's diff), FAIL_TO_PASS / PASS_TO_PASS are
the tests that bug breaks / leaves alone (lists, as SWE-smith has them). The clean
repository (with its history) is packed into `docker save` images tagged with the rows'
image_name, under an image store; the fixes handed to swe_eval are git's own diffs from the
buggy tree back to the clean one (not `reverse_patch`), so the check is independent of the
loader's reversal. The fixes resolve, the empty patches do not, and the loader's gold
(`--predictions gold`, the reversed bug) resolves too.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thundersync_jax.envs.images import build, python_image

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

SHAPES = """\
def area(w, h):
    return w * h


def perimeter(w, h):
    return 2 * (w + h)
"""
SHAPES_V2 = (
    SHAPES
    + """

def is_square(w, h):
    return w == h
"""
)
TESTS = """\
from geo.shapes import area, is_square, perimeter


def test_area():
    assert area(2, 3) == 6


def test_perimeter():
    assert perimeter(2, 3) == 10


class TestSquare:
    def test_yes(self):
        assert is_square(4, 4)

    def test_no(self):
        assert not is_square(4, 5)
"""
# (image_name, (old, new) edit of geo/shapes.py that introduces the bug, F2P, P2P)
T = "tests/test_shapes.py::"
BUGS = [
    ("jyangballin/swesmith.x86_64.geo.v2", ("w * h", "w + h"), [T + "test_area"],
     [T + "test_perimeter", T + "TestSquare::test_yes", T + "TestSquare::test_no"]),
    ("jyangballin/swesmith.x86_64.geo.v2", ("return w == h", "return w <= h"),
     [T + "TestSquare::test_no"], [T + "test_area", T + "TestSquare::test_yes"]),
    ("docker.io/jyangballin/swesmith.x86_64.geo.v3:latest", ("2 * (w + h)", "2 * w + h"),
     [T + "test_perimeter"], [T + "test_area"]),
]  # fmt: skip


def _load(name, filename):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).with_name(filename)
        )
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


fixtures = _load("tsj_images_test_fixtures", "images_fixtures.py")


def _git(repo, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _commit(repo, files, message):
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


def make_smith_dataset(root):
    """(parquet path, image store dir, {instance_id: fix diff}) for the rows of BUGS."""
    repo = root / "geo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"geo/__init__.py": "", "geo/shapes.py": SHAPES, "README.md": "geo\n"}, "init")
    _commit(repo, {"geo/shapes.py": SHAPES_V2, "tests/test_shapes.py": TESTS}, "squares")
    _commit(repo, {"README.md": "geo: shapes\n"}, "docs")
    rows, fixes = [], {}
    for i, (image_name, (old, new), f2p, p2p) in enumerate(BUGS):
        path = repo / "geo" / "shapes.py"
        path.write_text(SHAPES_V2.replace(old, new, 1))
        bug = _git(repo, "diff")
        fixes[f"geo__{i}"] = _git(repo, "diff", "-R")  # git's diff back to the clean tree
        _git(repo, "checkout", "--", ".")
        rows.append(
            dict(
                instance_id=f"geo__{i}",
                repo="geo/geo",
                patch=bug,
                FAIL_TO_PASS=f2p,
                PASS_TO_PASS=p2p,
                image_name=image_name,
                problem_statement=f"shapes are wrong ({i})",
            )
        )
    store = root / "images"
    store.mkdir()
    base, env = fixtures.base_layers()
    layers = [*base, python_image.repository_layer(str(repo), str(root))]
    config = build.image_config(layers, env, "/testbed")
    for name in sorted({r["image_name"] for r in rows}):
        tag = name.removeprefix("docker.io/")
        tag = tag if ":" in tag.rsplit("/", 1)[-1] else tag + ":latest"
        build.write_docker_archive(str(store / (tag.split("/")[-1] + ".tar")), layers, config, tag)
    parquet = root / "smith.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return str(parquet), str(store), fixes


@pytest.fixture(scope="module")
def smith(tmp_path_factory):
    root = tmp_path_factory.mktemp("smith")
    return root, *make_smith_dataset(root)


def _swe_eval(root, parquet, store, predictions, name):
    out = root / f"{name}.json"
    env = dict(os.environ, TSJ_IMAGE_CACHE=os.path.join(fixtures.scratch(), "cache"))
    res = subprocess.run(
        [sys.executable, "-m", "thundersync_jax.envs.swe_eval", "--instances", parquet,
         "--predictions", predictions, "--images", store, "--out", str(out),
         "--workers", "1", "--timeout", "60", "--no-progress"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fixes_resolve_and_empty_patches_do_not(smith):
    root, parquet, store, fixes = smith
    preds = root / "fixes.jsonl"
    preds.write_text("".join(json.dumps(dict(instance_id=i, model_patch=p)) + "\n"
                             for i, p in fixes.items()))  # fmt: skip
    empty = root / "empty.json"
    empty.write_text(json.dumps([dict(instance_id=i, model_patch="") for i in fixes]))
    got = _swe_eval(root, parquet, store, str(preds), "fixes")
    assert {i: r["resolved"] for i, r in got.items()} == dict.fromkeys(fixes, True), got
    assert all(set(r["tests"].values()) == {"PASSED"} for r in got.values())
    got = _swe_eval(root, parquet, store, str(empty), "empty")
    assert {i: r["resolved"] for i, r in got.items()} == dict.fromkeys(fixes, False), got
    for (_, _, f2p, p2p), (i, r) in zip(BUGS, sorted(got.items()), strict=True):
        assert r["error"] is None and r["patch_applied"], r
        assert [r["tests"][t] for t in f2p] == ["FAILED"] * len(f2p), (i, r["tests"])
        assert [r["tests"][t] for t in p2p] == ["PASSED"] * len(p2p), (i, r["tests"])
    gold = _swe_eval(root, parquet, store, "gold", "gold")
    assert all(r["resolved"] for r in gold.values()) and len(gold) == len(BUGS), gold


@pytest.mark.slow
def test_an_image_without_git_history_is_snapshotted(smith, tmp_path):
    """Some images ship /testbed without .git: its files become one snapshot commit (HEAD),
    the bug is committed on top, and the fix still resolves where no patch does not."""
    from thundersync_jax.envs import swe_eval
    from thundersync_jax.envs.swe import dataset

    root, parquet, _, fixes = smith
    files = {"geo/__init__.py": "", "geo/shapes.py": SHAPES_V2, "tests/test_shapes.py": TESTS}
    entries = [build.directory("testbed"), build.directory("testbed/geo")]
    entries += [build.directory("testbed/tests")]
    entries += [build.file_bytes(f"testbed/{k}", v.encode()) for k, v in files.items()]
    base, env = fixtures.base_layers()
    layers = [*base, build.write_layer(entries, str(tmp_path))]
    store = tmp_path / "images"
    store.mkdir()
    config = build.image_config(layers, env, "/testbed")
    build.write_docker_archive(str(store / "plain.tar"), layers, config, BUGS[0][0])
    (inst,) = [
        i for i in dataset.load(parquet, images=str(store), limit=2) if i.instance_id == "geo__0"
    ]
    kw = dict(workers=1, progress=False, image_cache=fixtures.cache())
    got = swe_eval.evaluate([inst], {"geo__0": fixes["geo__0"]}, str(tmp_path / "f"), **kw)
    assert got["geo__0"]["resolved"], got
    got = swe_eval.evaluate([inst], {"geo__0": ""}, str(tmp_path / "e"), **kw)
    assert not got["geo__0"]["resolved"] and got["geo__0"]["error"] is None, got
