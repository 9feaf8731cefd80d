"""SWE-bench format on a real git repository with history: src/ layout, PYTHONPATH=src,
a bug-fix commit split into patch and test_patch, class and parametrized test ids."""

import concurrent.futures
import dataclasses
import json
import os
import subprocess

import pytest

from thundersync_jax.envs.base import ToolCall
from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe import repo, verifier
from thundersync_jax.envs.swe.environment import SweEnvironment

CORE_V1 = '''\
def parse_pair(text):
    """'a=b' -> ('a', 'b')."""
    key, value = text.split("=")
    return key.strip(), value.strip()


def mean(xs):
    return sum(xs) / len(xs)
'''
# commit 2 adds a function (history the fix does not touch)
CORE_V2 = (
    CORE_V1
    + """

def words(text):
    return text.split()
"""
)
# the bug fix: values may contain "=" ("a=b=c" -> ("a", "b=c"))
CORE_FIXED = CORE_V2.replace('text.split("=")', 'text.split("=", 1)')

TESTS_V1 = """\
import pytest

from calc.core import mean, parse_pair


@pytest.mark.parametrize("text, want", [("a=b", ("a", "b")), ("a b = c", ("a b", "c"))])
def test_parse(text, want):
    assert parse_pair(text) == want


class TestMean:
    def test_ints(self):
        assert mean([1, 2, 3]) == 2

    def test_float(self):
        assert mean([1, 2]) == 1.5
"""
TESTS_FIXED = (
    TESTS_V1
    + """

@pytest.mark.parametrize("text", ["k=v=w", "k = v=w"])
def test_parse_value_with_equals(text):
    assert parse_pair(text)[1].replace(" ", "") == "v=w"


class TestMean2:
    def test_equals_in_value(self):
        assert parse_pair("x==")[1] == "="
"""
)
PYPROJECT = """\
[project]
name = "calc"
version = "0.1"

[tool.pytest.ini_options]
testpaths = ["tests"]
"""


def _git(cwd, *args):
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    out = subprocess.run(
        ["git", *ident, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout


def _commit(repo, files, message):
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """A repository with four commits (the third is the bug fix) and its instance JSONL."""
    return make_calc_instances(tmp_path_factory.mktemp("real"))


def make_calc_instances(root):
    """Writes root/calc-repo (four commits, the third the bug fix) and root/instances.jsonl
    (one instance, repo_path relative); returns the JSONL path. Also used by the image
    tests (images_swe_test.py)."""
    repo = root / "calc-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(
        repo,
        {
            "pyproject.toml": PYPROJECT,
            "src/calc/__init__.py": "",
            "src/calc/core.py": CORE_V1,
            "tests/test_core.py": TESTS_V1,
            "README.md": "calc\n",
        },
        "initial",
    )
    base = _commit(repo, {"src/calc/core.py": CORE_V2}, "add words")
    fix = _commit(
        repo,
        {"src/calc/core.py": CORE_FIXED, "tests/test_core.py": TESTS_FIXED},
        "parse_pair: keep '=' in values",
    )
    _commit(repo, {"README.md": "calc, a calculator\n"}, "docs")  # HEAD is past the fix
    patch = _git(repo, "diff", base, fix, "--", "src")
    test_patch = _git(repo, "diff", base, fix, "--", "tests")
    f2p = [
        "tests/test_core.py::test_parse_value_with_equals[k=v=w]",
        "tests/test_core.py::test_parse_value_with_equals[k = v=w]",
        "tests/test_core.py::TestMean2::test_equals_in_value",
    ]
    p2p = [
        "tests/test_core.py::test_parse[a=b-want0]",
        "tests/test_core.py::test_parse[a b = c-want1]",
        "tests/test_core.py::TestMean::test_ints",
        "tests/test_core.py::TestMean::test_float",
    ]
    record = {
        "instance_id": "calc__calc-1",
        "repo": "calc/calc",
        "base_commit": base,
        "problem_statement": "parse_pair('a=b=c') raises ValueError; the value should be 'b=c'.",
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(f2p),  # JSON-encoded strings, as in the SWE-bench dataset
        "PASS_TO_PASS": json.dumps(p2p),
        "repo_path": "calc-repo",  # relative to the JSONL file
        "env": {"PYTHONPATH": "src"},
        "version": "0.1",
    }
    path = root / "instances.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def test_load_resolves_paths_and_json_encoded_lists(jsonl):
    (inst,) = instance_lib.load_jsonl(jsonl)
    assert inst.repo_path == os.path.join(os.path.dirname(jsonl), "calc-repo")
    assert inst.fail_to_pass[1] == "tests/test_core.py::test_parse_value_with_equals[k = v=w]"
    assert len(inst.pass_to_pass) == 4
    assert inst.test_cmd == instance_lib.DEFAULT_TEST_CMD
    assert inst.extra == {"version": "0.1"}


def test_gold_resolves_empty_and_test_tampering_do_not(jsonl, tmp_path):
    (inst,) = instance_lib.load_jsonl(jsonl)
    # Skipping the host interpreter's pytest plugins (hypothesis, ...) saves ~2 s a run;
    # the episode test below runs with them.
    inst = dataclasses.replace(inst, env={**inst.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    # A "fix" that edits the judging test file instead of the code: the harness resets it.
    tamper = inst.test_patch.replace('== "v=w"', '!= "nope"')
    missing_id = dataclasses.replace(
        inst, pass_to_pass=inst.pass_to_pass + ("tests/test_core.py::test_not_there",)
    )
    # Context that no longer matches exactly: git apply refuses, GNU patch --fuzz applies it.
    fuzzy = inst.patch.replace(" def parse_pair(text):", " def parse_pair(txt):")
    assert fuzzy != inst.patch
    jobs = {
        "gold": (inst, inst.patch),
        "fuzzy": (inst, fuzzy),
        "empty": (inst, ""),
        "tamper": (inst, tamper),
        "partial": (dataclasses.replace(inst), ""),
        "missing": (missing_id, inst.patch),
    }

    def run(name):
        task, patch = jobs[name]
        return verifier.evaluate_patch(
            task, patch, str(tmp_path), {"timeout_s": 60}, partial_credit=name == "partial"
        )

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        res = dict(zip(jobs, pool.map(run, jobs), strict=True))

    assert res["gold"].reward == 1.0 and res["gold"].details["resolved"]
    assert res["fuzzy"].reward == 1.0, res["fuzzy"]
    assert set(res["gold"].details["tests"].values()) == {"PASSED"}
    assert len(res["gold"].details["tests"]) == 7
    for name in ("empty", "tamper"):
        r = res[name]
        assert r.reward == 0.0 and not r.details["resolved"], name
        assert [r.details["tests"][t] for t in inst.fail_to_pass] == ["FAILED"] * 3, name
        assert [r.details["tests"][t] for t in inst.pass_to_pass] == ["PASSED"] * 4, name
    assert res["partial"].reward == pytest.approx(4 / 7)
    # pytest refuses a command line naming an unknown id; the files are then run whole.
    missing = res["missing"]
    assert missing.reward == 0.0 and len(missing.details["exit_codes"]) == 2
    assert missing.details["tests"].pop("tests/test_core.py::test_not_there") == "ERROR"
    assert set(missing.details["tests"].values()) == {"PASSED"}


def test_episode_with_patch_demonstration(jsonl, tmp_path):
    (inst,) = instance_lib.load_jsonl(jsonl)
    with SweEnvironment(inst, str(tmp_path), {"timeout_s": 60}) as env:
        assert env.reset() == inst.problem_statement
        out = env.step(
            ToolCall("bash", {"command": "python -c 'import calc.core; print(1+1)'; pwd"})
        )
        assert out.observation == "2\n/task"  # PYTHONPATH=src and the workspace at /task
        demo = env.demonstration()
        assert [c.name for c in demo] == ["view", "edit", "submit"]
        for call in demo:
            assert not env.step(call).observation.startswith("error"), call
        assert (
            env.step(ToolCall("bash", {"command": "ls"})).observation == "error: already submitted"
        )
        result = env.verify()
    assert result.reward == 1.0, result
    assert result.details["model_patch"] == inst.patch


def test_mirror_clones_once_and_serves_checkouts(jsonl, tmp_path):
    (inst,) = instance_lib.load_jsonl(jsonl)
    (tmp_path / "remote" / "calc").mkdir(parents=True)
    os.symlink(inst.repo_path, tmp_path / "remote" / "calc" / "calc")  # a local "GitHub"
    template = str(tmp_path / "remote") + "/{repo}"
    cache = str(tmp_path / "cache")
    mirror = repo.mirror("calc/calc", cache, template)
    assert mirror == os.path.join(cache, "calc__calc.git")
    assert repo.mirror("calc/calc", cache, "unused://{repo}") == mirror  # cloned once
    ws = repo.checkout(mirror, inst.base_commit, str(tmp_path / "ws"), str(tmp_path / "git"))
    assert 'split("=")' in (tmp_path / "ws" / "src" / "calc" / "core.py").read_text()
    assert ws.diff() == ""
    with pytest.raises(repo.GitError, match="owner/name"):
        repo.mirror("../etc", cache)
    with pytest.raises(repo.GitError, match="is not a commit of"):
        repo.checkout(mirror, "f" * 40, str(tmp_path / "ws2"), str(tmp_path / "git2"))
