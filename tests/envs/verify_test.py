"""The never-crash verifier wrapper: every failure mode becomes reward 0 and is counted."""

import math
import sys
import time

import pytest

from thundersync_jax.envs import verify
from thundersync_jax.envs.base import VerifierResult


@pytest.fixture(autouse=True)
def _zero_counters():
    verify.reset_failure_counts()
    yield
    verify.reset_failure_counts()


def test_good_results_pass_through():
    assert verify.run_verifier(lambda: 1).reward == 1.0
    assert isinstance(verify.run_verifier(lambda: 1).reward, float)
    rich = VerifierResult(reward=0.5, reason="half", details={"passed": 1})
    assert verify.run_verifier(lambda: rich) == rich
    assert verify.run_verifier(lambda: 0.25, timeout_s=5).reward == 0.25
    assert verify.failure_counts() == dict.fromkeys(verify.REASONS, 0)


def test_exception_becomes_reward_zero():
    def broken():
        raise KeyError("missing report")

    res = verify.run_verifier(broken, name="task-7")
    assert res.reward == 0.0 and res.reason == verify.EXCEPTION
    assert "task-7" in res.error and "KeyError" in res.error
    assert "broken" in res.details["traceback"]
    res = verify.run_verifier(lambda: sys.exit(3), timeout_s=5)  # in the worker thread
    assert res.reason == verify.EXCEPTION and "SystemExit" in res.error
    assert verify.failure_counts()[verify.EXCEPTION] == 2


def test_timeout_returns_promptly():
    start = time.monotonic()
    res = verify.run_verifier(lambda: time.sleep(5) or 1.0, timeout_s=0.3)
    assert time.monotonic() - start < 1.0
    assert res.reward == 0.0 and res.reason == verify.TIMEOUT
    assert verify.failure_counts()[verify.TIMEOUT] == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None, "1", True, 1.5, -0.1])
def test_invalid_rewards_are_rejected(bad):
    res = verify.run_verifier(lambda: bad)
    assert res.reward == 0.0 and res.reason == verify.INVALID_REWARD
    assert verify.failure_counts()[verify.INVALID_REWARD] == 1


def test_reward_range_can_be_widened():
    assert verify.run_verifier(lambda: -2.0, reward_range=None).reward == -2.0
    assert verify.run_verifier(lambda: math.nan, reward_range=None).reason == "invalid_reward"


def test_reported_errors_are_counted_and_metrics_are_flat():
    res = verify.run_verifier(lambda: VerifierResult(reward=1.0, error="pytest crashed"))
    assert res.reward == 0.0 and res.reason == verify.REPORTED_ERROR
    verify.run_verifier(lambda: math.nan)
    metrics = verify.failure_metrics()
    assert metrics["verifier_failures"] == 2
    assert metrics["verifier_failures/reported_error"] == 1
    assert metrics["verifier_failures/invalid_reward"] == 1
    assert metrics["verifier_failures/timeout"] == 0
