"""SWE instances scored and played inside container images (OCI layout, docker save).

The instance is the real bug-fix commit of swe_real_repo_test.py. Its images hold the
host interpreter with pytest, a "trap" layer (a sitecustomize.py that kills every
interpreter start, a directory of junk) and an upper layer that removes both with a
whiteout and an opaque directory: the gold patch can only resolve when the whiteouts
are applied and the tests really run in the image.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import sys

import pytest

from thundersync_jax.envs import swe_eval
from thundersync_jax.envs.base import ToolCall
from thundersync_jax.envs.images import __main__ as images_cli
from thundersync_jax.envs.images import build, python_image
from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe.environment import SweEnvironment

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
TRAP = "import sys\nsys.exit('trap layer still present: whiteout not applied')\n"


def _load(name, filename):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).with_name(filename)
        )
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


fixtures = _load("tsj_images_test_fixtures", "images_fixtures.py")
real_repo = _load("tsj_swe_real_repo_test", "swe_real_repo_test.py")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """{"oci": JSONL whose image is an OCI layout holding the repository (no repo_path),
    "docker": JSONL whose image is a docker-save tarball (tag given), repo_path kept}."""
    root = tmp_path_factory.mktemp("swe-images")
    jsonl = real_repo.make_calc_instances(root)
    (inst,) = instance_lib.load_jsonl(jsonl)
    base, env = fixtures.base_layers()
    site = os.path.join(
        python_image.interpreter_info(sys.executable, [])["stdlib"], "site-packages"
    )
    work = str(root / "layers")
    trap = build.write_layer(
        [
            build.file_bytes(f"{site}/sitecustomize.py", TRAP.encode()),
            build.directory("opt/junk"),
            build.file_bytes("opt/junk/old.txt", b"lower"),
        ],
        work,
    )
    cover = build.write_layer(
        [
            build.whiteout(f"{site}/sitecustomize.py"),
            build.opaque("opt/junk"),
            build.file_bytes("opt/junk/new.txt", b"upper"),
        ],
        work,
    )
    repo_layer = python_image.repository_layer(inst.repo_path, work)
    oci_layers = [*base, trap, cover, repo_layer]
    oci = build.write_oci_layout(
        str(root / "calc.oci"),
        oci_layers,
        build.image_config(oci_layers, env, "/testbed"),
        "calc:1",
    )
    docker_layers = [*base, trap, cover]
    tar = build.write_docker_archive(
        str(root / "calc.tar"), docker_layers, build.image_config(docker_layers, env), "calc:1"
    )
    out = {}
    for name, image, repo_path in [("oci", oci, ""), ("docker", tar + ":calc:1", inst.repo_path)]:
        path = root / f"{name}.jsonl"
        instance_lib.dump_jsonl([dataclasses.replace(inst, image=image, repo_path=repo_path)], path)
        out[name] = str(path)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["oci", "docker"])
def test_gold_resolves_and_empty_does_not_inside_the_image(images, fmt, tmp_path):
    (inst,) = instance_lib.load_jsonl(images[fmt])
    assert inst.image and bool(inst.repo_path) == (fmt == "docker")
    preds = {inst.instance_id: inst.patch}
    kw = dict(
        workers=1, progress=False, image_cache=fixtures.cache(), sandbox_config={"timeout_s": 60}
    )
    gold = swe_eval.evaluate([inst], preds, str(tmp_path / "g"), **kw)[inst.instance_id]
    empty = swe_eval.evaluate([inst], {inst.instance_id: ""}, str(tmp_path / "e"), **kw)
    empty = empty[inst.instance_id]
    assert gold["resolved"] and gold["reward"] == 1.0, gold
    assert set(gold["tests"].values()) == {"PASSED"} and len(gold["tests"]) == 7
    assert not empty["resolved"] and empty["error"] is None, empty
    assert [empty["tests"][t] for t in inst.fail_to_pass] == ["FAILED"] * 3
    assert [empty["tests"][t] for t in inst.pass_to_pass] == ["PASSED"] * 4


@pytest.mark.slow
def test_episode_runs_in_the_image(images, tmp_path):
    (inst,) = instance_lib.load_jsonl(images["oci"])
    with SweEnvironment(
        inst, str(tmp_path), {"timeout_s": 60}, image_cache=fixtures.cache()
    ) as env:
        env.reset()
        probe = "python -c 'import sys, calc.core; print(sys.prefix)'; pwd; ls /opt/junk; ls /"
        out = env.step(ToolCall("bash", {"command": probe})).observation.split("\n")
        # The image's interpreter, the repository at /testbed, the whiteouts applied, and
        # nothing of the host's filesystem (no /work, no /home).
        assert out[0] == sys.base_prefix and out[1] == "/testbed" and out[2] == "new.txt"
        assert "work" not in out[3:] and "home" not in out[3:] and "testbed" in out[3:]
        for call in env.demonstration():
            assert not env.step(call).observation.startswith("error"), call
        result = env.verify()
        reset_again = env.reset()  # a fresh workspace, not a copy of the rootfs
        clean = env.step(
            ToolCall("bash", {"command": "git status --short 2>&1; cat src/calc/core.py"})
        )
    assert result.reward == 1.0, result
    assert reset_again == inst.problem_statement
    assert 'split("=")' in clean.observation  # the edit of the previous episode is gone


def test_build_command_writes_images_and_instances(tmp_path, capsys):
    jsonl = real_repo.make_calc_instances(tmp_path)
    out = images_cli.build_from_instances(
        jsonl, str(tmp_path / "out"), ("oci", "docker"), base=fixtures.base_layers()
    )
    (record,) = [json.loads(line) for line in open(out)]
    assert record["image"] == "calc__calc" and record["repo_path"] == ""
    (inst,) = instance_lib.load_jsonl(out)
    assert inst.image == str(tmp_path / "out" / "calc__calc")
    assert os.path.isfile(tmp_path / "out" / "calc__calc.tar")
    cache_dir = str(tmp_path / "cache")
    assert images_cli.main(["inspect", inst.image, "--cache", cache_dir, "--unpack"]) == 0
    text = capsys.readouterr().out
    assert "format   oci" in text and text.count("\nlayer ") == 4 and "unpacked in" in text
    assert f"{cache_dir}/entries/" in text and "WorkingDir" not in text
    assert (
        images_cli.main(["inspect", str(tmp_path / "out" / "calc__calc.tar"), "--cache", cache_dir])
        == 0
    )
    assert "format   docker-archive" in capsys.readouterr().out
    assert images_cli.main(["inspect", str(tmp_path / "missing")]) == 2


@pytest.mark.slow
def test_mini_swe_family_runs_from_an_image(tmp_path, monkeypatch):
    from configs import common
    from thundersync_jax.envs.swe import factory

    monkeypatch.setenv("TSJ_IMAGE_CACHE", fixtures.cache().root)  # the default cache
    cfg = common.get_base_config().env
    cfg.num_tasks, cfg.image = 1, fixtures.python_oci()
    (task,) = factory.load_instances(cfg, str(tmp_path), seed=3)
    assert task.image == fixtures.python_oci() and task.repo_dir == "/testbed"
    with factory.make_environment(task, str(tmp_path), cfg) as env:
        env.reset()
        where = env.step(
            ToolCall("bash", {"command": "pwd; python -c 'import sys; print(sys.prefix)'"})
        )
        assert where.observation.split("\n") == ["/testbed", sys.base_prefix]
        for call in env.demonstration():
            env.step(call)
        result = env.verify()
    assert result.reward == 1.0, result


def test_swe_eval_command_line_scores_in_the_image(images, tmp_path):
    out = tmp_path / "R.json"
    argv = ["--instances", images["docker"], "--predictions", "gold", "--out", str(out)]
    argv += ["--workers", "1", "--no-progress", "--image-cache", fixtures.cache().root]
    assert swe_eval.main(argv) == 0
    (result,) = json.loads(out.read_text()).values()
    assert result["resolved"] and result["error"] is None, result
