"""mini-SWE: the library is sound, generation is deterministic, and every generated task
is solved by its demonstration (through the tools) and failed by an empty submission."""

import concurrent.futures
import dataclasses
import subprocess

import pytest

from thundersync_jax.envs.swe import mini_swe, verifier
from thundersync_jax.envs.swe.environment import SweEnvironment
from thundersync_jax.envs.swe.mini_swe_library import MODULES

# 12 tasks, 4 of each difficulty.
NUM_TASKS = 12
LEVELS = ("easy", "medium", "hard")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mini_cache")
    return mini_swe.generate(
        NUM_TASKS, seed=3, cache_dir=str(cache), difficulty=LEVELS, max_sleep_s=0.2
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_library_bugs_break_at_least_two_checks(module):
    for func in MODULES[module]:
        assert mini_swe.failing_checks(func, None) == [], func.name
        for bug in func.bugs:
            # one failing check is shown, another goes to the hidden test
            assert len(mini_swe.failing_checks(func, bug)) >= 2, (func.name, bug)
            assert mini_swe.inject(func, bug) != func.source


def test_generation_is_deterministic_and_cached(tmp_path, tasks):
    again = mini_swe.generate(
        3, seed=3, cache_dir=str(tmp_path), difficulty=LEVELS, max_sleep_s=0.2
    )
    for a, b in zip(again, tasks[:3], strict=True):
        # Same content and fixed commit dates: the same commit hash in another cache.
        assert dataclasses.replace(a, repo_path="") == dataclasses.replace(b, repo_path="")
    other = mini_swe.generate(3, seed=4, cache_dir=str(tmp_path), difficulty=LEVELS)
    assert [t.patch for t in other] != [t.patch for t in tasks[:3]]
    # Second call reuses the cached repositories.
    assert (
        mini_swe.generate(3, seed=3, cache_dir=str(tmp_path), difficulty=LEVELS, max_sleep_s=0.2)
        == again
    )


def test_tasks_are_short_and_shaped_by_difficulty(tasks):
    for t in tasks:
        level = t.extra["difficulty"]
        assert len(t.problem_statement) < 120, t.problem_statement
        listing = subprocess.run(
            ["git", "ls-tree", "-r", "-l", t.base_commit],
            cwd=t.repo_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sizes = {line.split()[-1]: int(line.split()[3]) for line in listing.splitlines()}
        assert "p/__init__.py" in sizes and "pytest.ini" in sizes
        assert max(sizes.values()) <= 400, sizes  # every file fits a tiny model's context
        changed_files = t.patch.count("diff --git")
        changed_lines = sum(
            1
            for line in t.patch.splitlines()
            if line.startswith("-") and not line.startswith("---")
        )
        if level == "easy":
            assert "p/" in t.problem_statement and changed_lines == 1
        elif level == "medium":
            assert "p/" not in t.problem_statement and changed_lines == 1
        else:
            assert changed_lines == 2 and changed_files in (1, 2)
        assert len(t.fail_to_pass) == 2 * (2 if level == "hard" else 1)
        assert set(t.fail_to_pass).isdisjoint(t.pass_to_pass)


def test_invalid_difficulty(tmp_path):
    with pytest.raises(ValueError, match="difficulty must be one of"):
        mini_swe.make_instance(0, 0, "expert", str(tmp_path))


def _solve_and_fail(task, workdir):
    """(demonstration episode result, empty-patch result) of one task."""
    with SweEnvironment(task, workdir, {"timeout_s": 30}) as env:
        env.reset()
        observations = [env.step(call) for call in env.demonstration()]
        demo = env.verify()
    empty = verifier.evaluate_patch(task, "", workdir, {"timeout_s": 30})
    return observations, demo, empty


@pytest.mark.slow  # 12 tasks x 4 sandboxed pytest runs: ~15-25 s on 2 busy cores
def test_demonstration_solves_and_empty_patch_fails_every_task(tasks, tmp_path):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda t: _solve_and_fail(t, str(tmp_path)), tasks))
    for task, (observations, demo, empty) in zip(tasks, outcomes, strict=True):
        first_run, last_run = observations[0].observation, observations[-2].observation
        assert "failed" in first_run and "(exit 1)" in first_run, first_run
        assert "failed" not in last_run and " passed" in last_run, last_run
        assert observations[-1].done
        assert all(not o.observation.startswith("error") for o in observations)
        # Short enough for a ~1.5 kB context: the whole demonstration's tool output.
        sizes = [len(o.observation) for o in observations]
        budget = 1200 if task.extra["difficulty"] == "hard" else 700
        assert max(sizes) <= 400 and sum(sizes) <= budget, (task.instance_id, sizes)
        # The demonstration's edits are exactly the gold patch, which resolves the task.
        assert demo.details["model_patch"] == task.patch
        assert demo.reward == 1.0 and demo.details["resolved"], (task.instance_id, demo)
        assert empty.reward == 0.0 and not empty.details["resolved"]
        for test_id in task.fail_to_pass:
            assert empty.details["tests"][test_id] == "FAILED", (task.instance_id, test_id)
        for test_id in task.pass_to_pass:
            assert empty.details["tests"][test_id] == "PASSED", (task.instance_id, test_id)
