"""SweEnvironment tool errors and limits on one mini-SWE task (sandboxed)."""

import dataclasses
import os

import pytest

from thundersync_jax.envs import verify
from thundersync_jax.envs.base import ToolCall
from thundersync_jax.envs.swe import mini_swe, verifier
from thundersync_jax.envs.swe.environment import SweEnvironment


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    cache = tmp_path_factory.mktemp("env_cache")
    return mini_swe.make_instance(5, 0, "easy", str(cache), max_sleep_s=0)


def test_tool_errors_are_observations(task, tmp_path):
    env = SweEnvironment(task, str(tmp_path), {"timeout_s": 20}, command_timeout_s=1.5)
    assert env.step(ToolCall("bash", {"command": "ls"})).observation.startswith(
        "error: the episode"
    )
    with env:
        statement = env.reset()
        assert statement == task.problem_statement and statement.startswith("Fix p/")
        path = statement.split()[1].rstrip(":")

        def obs(name, **args):
            return env.step(ToolCall(name, args)).observation

        assert obs("bash", command="ls") == "conftest.py\np\npytest.ini\ntests"
        assert obs("bash", command="echo hi; exit 3") == "hi\n(exit 3)"
        assert obs("bash", command="sleep 5") == "(timed out after 1.5 s)"
        assert obs("bash", command="") == "error: command must be a non-empty string, got ''"
        assert obs("bash") == "error: command must be a non-empty string, got None"
        assert obs("view", path=f"/task/{path}").lstrip().startswith("1 def ")
        assert obs("view", path="/etc/passwd").startswith(
            "error: /etc/passwd is outside the repository"
        )
        assert obs("edit", path=path, old="no such text", new="x") == (
            f"error: old text not found in {path}"
        )
        assert obs("edit", path=path, old="def ", new="def  ").startswith(
            f"error: old text occurs 2 times in {path}"
        )
        assert obs("frobnicate").startswith("error: unknown tool 'frobnicate'; tools: bash, view")
        # the agent's files are its own: a file made in the box is in the model patch
        assert obs("bash", command="echo x > new.txt && cat new.txt") == "x"
        assert "+++ b/new.txt" in env.model_patch()
        assert env.step(ToolCall("submit", {})).done
        result = env.verify()
        assert result.reward == 0.0 and result.error is None
        assert result.details["model_patch"].count("diff --git") == 1
    assert env._episode_dir is None and not os.listdir(tmp_path / "eval")


def test_verifier_crash_is_reward_zero_with_a_counter(task, tmp_path):
    before = verify.failure_counts()[verify.EXCEPTION]
    with SweEnvironment(task, str(tmp_path)) as env:
        env.reset()
        env._workspace = env._workspace.__class__("/nonexistent", env._workspace.git_dir, "HEAD")
        result = env.verify()
    assert result.reward == 0.0 and result.reason == verify.EXCEPTION
    assert "GitError" in result.error or "FileNotFoundError" in result.error
    assert verify.failure_counts()[verify.EXCEPTION] == before + 1


def test_hanging_tests_time_out_to_reward_zero(task, tmp_path):
    with SweEnvironment(task, str(tmp_path), {"timeout_s": 20}, verify_timeout_s=2) as env:
        env.reset()
        module = task.problem_statement.split()[1].rstrip(":")
        env.step(ToolCall("bash", {"command": f"echo 'while True: pass' >> {module}"}))
        result = env.verify()
    assert result.reward == 0.0 and result.error is None
    assert result.details["timed_out"] and "timed out" in result.reason


# A conftest.py that reports every test as passed: the reward hack editable_paths blocks.
FAKE_PASS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def test_edits_outside_editable_paths_are_ignored(task, tmp_path):
    with SweEnvironment(task, str(tmp_path)) as env:
        env.reset()
        env.step(
            ToolCall("edit", {"path": "conftest.py", "old": "def ", "new": FAKE_PASS + "def "})
        )
        hack = env.model_patch()
    assert task.extra["editable_paths"] == ["p/"]
    unguarded = dataclasses.replace(task, extra={**task.extra, "editable_paths": []})
    # Without the guard the hack "resolves" the task; with it the hack is dropped.
    assert verifier.evaluate_patch(unguarded, hack, str(tmp_path)).reward == 1.0
    guarded = verifier.evaluate_patch(task, hack, str(tmp_path))
    assert guarded.reward == 0.0 and guarded.details["ignored_paths"] == ["conftest.py"]
    both = verifier.evaluate_patch(task, hack + task.patch, str(tmp_path))
    assert both.reward == 1.0 and both.details["ignored_paths"] == ["conftest.py"]
