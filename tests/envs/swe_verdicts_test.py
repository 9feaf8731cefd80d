"""Kept verdicts (envs/swe/verdicts.py): a patch already verified on a task is scored from disk,
exactly as the sandboxed verifier scored it; errors, timeouts and unreadable files never are."""

import dataclasses
import json
import os
import threading

import pytest

from thundersync_jax.envs.base import ToolCall, VerifierResult
from thundersync_jax.envs.swe import mini_swe, verdicts, verifier
from thundersync_jax.envs.swe.environment import SweEnvironment


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return mini_swe.make_instance(3, 0, "easy", str(tmp_path_factory.mktemp("tasks")), 0)


@pytest.fixture
def verifications(monkeypatch):
    """The patches the real verifier was run on (it still runs: this only records the calls)."""
    seen = []
    real = verifier.evaluate_patch

    def recorded(instance, patch, *args, **kwargs):
        seen.append(patch)
        return real(instance, patch, *args, **kwargs)

    monkeypatch.setattr(verifier, "evaluate_patch", recorded)
    return seen


def _episode(task, workdir, verdict_dir, fix: bool):
    """One episode that submits the gold fix (fix=True) or nothing; its verdict."""
    with SweEnvironment(task, workdir, {"timeout_s": 30}, verdict_dir=verdict_dir) as env:
        env.reset()
        if fix:
            for call in mini_swe.demonstration(task):
                if call.name == "edit":
                    assert not env.step(call).observation.startswith("error")
        env.step(ToolCall("submit", {}))
        return env.verify()


def test_a_repeated_patch_is_scored_from_its_verdict(task, tmp_path, verifications):
    kept = str(tmp_path / "verdicts")
    first = _episode(task, str(tmp_path / "a"), kept, fix=True)
    again = _episode(task, str(tmp_path / "b"), kept, fix=True)
    empty = _episode(task, str(tmp_path / "c"), kept, fix=False)
    empty_again = _episode(task, str(tmp_path / "d"), kept, fix=False)
    assert verifications == [first.details["model_patch"], ""]  # two distinct patches
    assert first.reward == again.reward == 1.0 and empty.reward == empty_again.reward == 0.0
    assert verdicts.CACHED not in first.details and again.details[verdicts.CACHED] is True
    for fresh, reused in ((first, again), (empty, empty_again)):
        assert reused.reason == fresh.reason and reused.error is None
        assert reused.details["tests"] == fresh.details["tests"]
        assert reused.details["model_patch"] == fresh.details["model_patch"]
    # Without a verdict directory every verification runs.
    none = _episode(task, str(tmp_path / "e"), None, fix=False)
    assert none.reward == 0.0 and len(verifications) == 3


def test_members_finishing_together_verify_once(task, tmp_path, verifications):
    kept, results = str(tmp_path / "verdicts"), [None] * 3

    def member(i):
        results[i] = _episode(task, str(tmp_path / f"m{i}"), kept, fix=True)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(verifications) == 1
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]
    assert sum(verdicts.CACHED in r.details for r in results) == 2


def test_errors_and_timeouts_are_not_kept(task, tmp_path, verifications):
    kept = str(tmp_path / "verdicts")
    broken = dataclasses.replace(
        task, test_patch="--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    for _ in range(2):  # the broken instance raises in the verifier: an error, verified again
        result = _episode(broken, str(tmp_path / "x"), kept, fix=False)
        assert result.reward == 0.0 and result.error is not None
    assert len(verifications) == 2 and not [f for f in os.listdir(kept) if f.endswith(".json")]
    calls = []

    def timed_out():
        calls.append(1)
        return VerifierResult(0.0, "unresolved (test run timed out)", {"timed_out": True})

    for _ in range(2):
        assert verdicts.cached(kept, "k", timed_out).details == {"timed_out": True}
    assert len(calls) == 2 and not os.path.exists(os.path.join(kept, "k.json"))


def test_an_unreadable_verdict_is_verified_again_and_rewritten(tmp_path):
    kept, calls = str(tmp_path), []

    def verify():
        calls.append(1)
        return VerifierResult(1.0, "resolved: all 2 tests pass", {"tests": {"t": "PASSED"}})

    assert verdicts.cached(kept, "k", verify).reward == 1.0
    with open(tmp_path / "k.json", "w") as f:
        f.write('{"reward": 1.0, "rea')  # truncated
    again = verdicts.cached(kept, "k", verify)
    assert len(calls) == 2 and again.reward == 1.0 and verdicts.CACHED not in again.details
    with open(tmp_path / "k.json") as f:
        assert json.load(f)["details"] == {"tests": {"t": "PASSED"}}
    assert verdicts.cached(kept, "k", verify).details[verdicts.CACHED] is True
    assert len(calls) == 2


def test_the_key_covers_the_task_the_patch_and_the_settings(task):
    base = verdicts.key(task, "", {"timeout_s": 20})
    assert verdicts.key(task, "", {"timeout_s": 20}) == base
    assert verdicts.key(task, "x", {"timeout_s": 20}) != base
    assert verdicts.key(task, "", {"timeout_s": 21}) != base
    assert (
        verdicts.key(dataclasses.replace(task, test_cmd="pytest -x"), "", {"timeout_s": 20}) != base
    )
