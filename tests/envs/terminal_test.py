"""Generated terminal tasks: demonstrations solve them, doing nothing or the wrong thing fails."""

import shutil

import pytest

from thundersync_jax.envs import terminal
from thundersync_jax.envs.base import ToolCall

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

TASKS = terminal.generate_tasks(12, seed=0)


@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
def test_demonstration_scores_one_and_no_action_scores_zero(task):
    with terminal.TerminalEnv(task) as env:
        env.reset()
        observations = [env.step(call) for call in env.demonstration()]
        solved = env.verify()
        env.reset()  # a fresh workspace: submitting at once must not pass
        assert env.step(terminal.submit()).done
        idle = env.verify()
    assert all(not o.observation.startswith("error") for o in observations)
    assert observations[-1].done
    assert solved.reward == 1.0 and solved.error is None, solved
    assert idle.reward == 0.0 and idle.error is None, idle


def test_tasks_cover_every_family_and_level():
    tasks = terminal.generate_tasks(21, seed=1)
    assert {(t.family, t.difficulty) for t in tasks} == {
        (f, d) for f in terminal.FAMILIES for d in (1, 2, 3)
    }
    # Uneven episodes: setup sizes and demonstration lengths differ across tasks.
    assert max(len(t.setup_script) for t in tasks) > 10 * min(len(t.setup_script) for t in tasks)
    assert len({len(t.demonstration) for t in tasks}) > 1
    assert len({t.task_id for t in tasks}) == 21


def test_generation_is_deterministic_per_seed():
    assert terminal.generate_tasks(7, seed=3) == terminal.generate_tasks(7, seed=3)
    assert terminal.generate_tasks(7, seed=3) != terminal.generate_tasks(7, seed=4)
    with pytest.raises(ValueError, match="unknown terminal task families"):
        terminal.generate_tasks(1, families=("nope",))


def _task(family, difficulty):
    tasks = terminal.generate_tasks(1, seed=5, families=(family,), difficulties=(difficulty,))
    return tasks[0]


def test_wrong_answer_scores_zero():
    task = _task("count_matching", 2)
    with terminal.TerminalEnv(task) as env:
        env.reset()
        for call in env.demonstration()[:-1]:
            env.step(call)
        assert env.verify().reward == 1.0
        env.step(terminal.bash("echo $(( $(cat answer.txt) + 1 )) > answer.txt"))
        wrong = env.verify()
    assert wrong.reward == 0.0 and wrong.error is None


def test_partial_credit_counts_checks():
    task = _task("organize_by_extension", 2)
    with terminal.TerminalEnv(task, partial_credit=True) as env:
        env.reset()
        # Move only the .txt files: some checks pass, and inbox/ is not yet empty (gate).
        env.step(terminal.bash("mkdir -p sorted/txt && mv inbox/*.txt sorted/txt/ 2>/dev/null"))
        gated = env.verify()
        env.step(terminal.bash("mkdir -p moved && mv inbox/* moved/"))  # inbox empty now
        partial = env.verify()
    assert gated.reward == 0.0
    assert 0.0 < partial.reward < 1.0, partial
    assert partial.details["passed"] < partial.details["total"]


def test_tool_errors_are_observations():
    task = _task("csv_sum", 1)
    with terminal.TerminalEnv(task, sandbox_kwargs={"timeout_s": 1.0}) as env:
        assert "reset" in env.step(terminal.bash("ls")).observation
        env.reset()
        unknown = env.step(ToolCall("python", {"code": "1"}))
        missing = env.step(ToolCall("bash", {}))
        failing = env.step(terminal.bash("ls no_such_file"))
        slow = env.step(terminal.bash("sleep 5"))
        env.step(terminal.submit())
        after = env.step(terminal.bash("ls"))
    assert "unknown tool 'python'" in unknown.observation and not unknown.done
    assert "command" in missing.observation
    assert "[exit code 2]" in failing.observation
    assert "timed out" in slow.observation
    assert after.done and "over" in after.observation
    assert env.workspace is None  # close removed it


def test_verify_without_reset_is_a_counted_failure():
    env = terminal.TerminalEnv(_task("top_words", 1))
    result = env.verify()
    assert result.reward == 0.0 and result.reason == "exception"
