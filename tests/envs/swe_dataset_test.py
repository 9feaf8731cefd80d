"""Published SWE datasets: one loader for every file format and row format, reversed bug
patches checked against git, malformed rows and missing images reported together."""

import json
import os
import subprocess
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thundersync_jax.envs.images import build, store
from thundersync_jax.envs.swe import dataset, repo

OLD = "a\nb\nc\nd\ne\nf\ng\nh\n"
NEW = "a\nB\nc\nd\ne\nf\nG\nh\nextra"  # two hunks, and no newline at the end


def _git(cwd, *args, stdin=None):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, input=stdin, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def _tree(path):
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, path)] = open(full, "rb").read()
    return out


def test_reverse_patch_undoes_what_git_applied(tmp_path):
    """Edits, a new file, a deleted file and a rename: applying the patch then its reversal
    (`git apply`, not -R) gives back the tree git had before."""
    r = tmp_path / "r"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "x.txt").write_text(OLD)
    (r / "gone.txt").write_text("bye\n")
    (r / "old_name.txt").write_text("same\n" * 5)
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "base")
    before = _tree(r)
    (r / "x.txt").write_text(NEW)
    (r / "new.txt").write_text("--- a/looks like a header\n+++ b/too\n")
    (r / "gone.txt").unlink()
    _git(r, "mv", "old_name.txt", "new_name.txt")
    _git(r, "add", "-A")
    patch = _git(r, "diff", "--cached", "-M")
    after = _tree(r)
    _git(r, "commit", "-qm", "change")
    back = repo.reverse_patch(patch)
    _git(r, "apply", "--index", "-", stdin=back)
    assert _tree(r) == before
    _git(r, "apply", "--index", "-", stdin=repo.reverse_patch(back))
    assert _tree(r) == after
    with pytest.raises(ValueError, match="binary"):
        repo.reverse_patch("diff --git a/b b/b\nGIT binary patch\nliteral 1\n")


def _row(i, **over):
    bug = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    row = dict(
        instance_id=f"o__r.{i}", repo="o/r", patch=bug, FAIL_TO_PASS=["t.py::a"],
        PASS_TO_PASS=["t.py::b"], image_name=f"org/swesmith.x86_64.r.{i % 2}",
        problem_statement="x is wrong",
    )  # fmt: skip
    return {**row, **over}


def _image_store(root, tags):
    layer = build.write_layer([build.file_bytes("etc/hi", b"hi")], str(root))
    config = build.image_config([layer], {})
    root.joinpath("store").mkdir(exist_ok=True)
    for i, tag in enumerate(tags):
        if i % 2:
            build.write_oci_layout(str(root / "store" / f"img{i}"), [layer], config, tag)
        else:
            build.write_docker_archive(str(root / "store" / f"img{i}.tar"), [layer], config, tag)
    return str(root / "store")


def _write_all_formats(root, rows):
    """The same rows as .jsonl, .json, .parquet and a save_to_disk directory."""
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "d.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), root / "d.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "disk"))
    return [str(root / n) for n in ("d.jsonl", "d.json", "d.parquet", "disk")]


def test_every_file_format_gives_the_same_smith_instances(tmp_path):
    rows = [_row(i) for i in range(4)]
    images = _image_store(tmp_path, ["org/swesmith.x86_64.r.0:latest",
                                     "docker.io/org/swesmith.x86_64.r.1"])  # fmt: skip
    loaded = [dataset.load(p, images=images) for p in _write_all_formats(tmp_path, rows)]
    assert all(got == loaded[0] for got in loaded[1:])
    inst = loaded[0][1]
    assert inst.setup_patch == rows[1]["patch"] and inst.base_commit == "HEAD"
    assert inst.patch == repo.reverse_patch(rows[1]["patch"]) and "+x = 1" in inst.patch
    assert inst.fail_to_pass == ("t.py::a",) and inst.pass_to_pass == ("t.py::b",)
    assert inst.image == os.path.join(images, "img1") + ":docker.io/org/swesmith.x86_64.r.1"
    assert loaded[0][0].image.startswith(os.path.join(images, "img0.tar") + ":")
    assert [i.instance_id for i in dataset.load(str(tmp_path / "d.parquet"), images=images,
                                                limit=2)] == ["o__r.0", "o__r.1"]  # fmt: skip


def test_swebench_rows_find_their_image_by_the_harness_name(tmp_path):
    rec = dict(instance_id="django__django-11099", repo="django/django", base_commit="abc",
               problem_statement="p", patch="", test_patch="", FAIL_TO_PASS='["t::a"]',
               PASS_TO_PASS="[]", version="3.0")  # fmt: skip
    gym = dict(rec, instance_id="pydata__xarray-1")
    name = store.swebench_image_name("django__django-11099")
    assert name == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    images = _image_store(tmp_path, [name, "xingyaoww/sweb.eval.x86_64.pydata_1776_xarray-1"])
    pq.write_table(pa.Table.from_pylist([rec, gym]), tmp_path / "v.parquet")
    a, b = dataset.load(str(tmp_path / "v.parquet"), images=images)
    assert a.fail_to_pass == ("t::a",) and a.pass_to_pass == () and not a.setup_patch
    assert a.image.endswith("img0.tar:" + name) and a.extra["version"] == "3.0"
    assert b.image.endswith("img1:xingyaoww/sweb.eval.x86_64.pydata_1776_xarray-1")


def test_malformed_rows_are_one_error_naming_each_row_and_field(tmp_path):
    rows = [_row(0), _row(1, FAIL_TO_PASS=None), _row(2), _row(3, patch="not a diff")]
    rows[2]["PASS_TO_PASS"] = "[not json"
    rows[2]["base_commit"] = "abc"  # a SWE-bench row (has base_commit) missing test_patch
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as e:
        dataset.load(str(tmp_path / "bad.jsonl"))
    msg = str(e.value)
    assert "3 malformed row(s)" in msg
    assert "row 1 (o__r.1): missing field(s) ['FAIL_TO_PASS']" in msg
    assert "row 2 (o__r.2)" in msg and "test_patch" in msg
    assert "row 3 (o__r.3): field patch" in msg


def test_missing_images_are_listed_together(tmp_path):
    rows = [_row(i) for i in range(5)]
    images = _image_store(tmp_path, ["org/swesmith.x86_64.r.0:latest"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    with pytest.raises(ValueError) as e:
        dataset.load(str(tmp_path / "d.parquet"), images=images)
    msg = str(e.value)
    assert "1 image(s) not found" in msg and "org/swesmith.x86_64.r.1 (rows" in msg
    assert "o__r.1, o__r.3" in msg and "r.0" not in msg.split("not found")[1]
    with pytest.raises(ValueError, match="no image store"):
        dataset.load(str(tmp_path / "d.parquet"))


def test_hub_dataset_is_read_offline_from_the_cache(tmp_path):
    """hf:ORG/NAME:SPLIT from a hub-cache snapshot (what `snapshot_download` leaves), with
    HF_HUB_OFFLINE=1, in a fresh process (the hub's settings are read at import)."""
    rows = [_row(i) for i in range(3)]
    repo = tmp_path / "hf" / "hub" / "datasets--org--smith"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee")
    (repo / "snapshots" / "c0ffee" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), repo / "snapshots/c0ffee/data/train-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), repo / "snapshots/c0ffee/data/test-0.parquet")
    images = _image_store(tmp_path, ["org/swesmith.x86_64.r.0", "org/swesmith.x86_64.r.1"])
    code = (
        "from thundersync_jax.envs.swe import dataset\n"
        f"print([i.instance_id for i in dataset.load('hf:org/smith:train', images={images!r})])"
    )
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['o__r.0', 'o__r.1', 'o__r.2']"
    code = "from thundersync_jax.envs.swe import dataset\ndataset.read_rows('hf:org/smith')"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "name a split (test, train)" in res.stderr or "name a split (train, test)" in res.stderr
