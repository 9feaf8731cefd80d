"""Never-crash verifier wrapper, with process-wide failure counters for the metrics.

A verifier that raises, hangs, or returns a reward that is not a finite number in range
must not take the trainer down, and must not feed NaN into the advantages. `run_verifier`
turns each such case into `VerifierResult(reward=0.0, reason=..., error=...)` and counts
it by reason; the trainer logs `failure_metrics()` each step.

Usage inside an `Environment`:

    def verify(self) -> VerifierResult:
        return run_verifier(self._check, timeout_s=60, name=self.task_id)
"""

from __future__ import annotations

import math
import numbers
import threading
import traceback
from collections.abc import Callable

from thundersync_jax.envs.base import VerifierResult

# Why a verification was turned into reward 0 (also the metric name suffixes).
EXCEPTION = "exception"  # the verifier raised
TIMEOUT = "timeout"  # it did not return within timeout_s
INVALID_REWARD = "invalid_reward"  # NaN, inf, not a number, or outside reward_range
REPORTED_ERROR = "reported_error"  # it returned a VerifierResult with `error` set
REASONS = (EXCEPTION, TIMEOUT, INVALID_REWARD, REPORTED_ERROR)

_lock = threading.Lock()
_failures = dict.fromkeys(REASONS, 0)


def run_verifier(
    fn: Callable[[], VerifierResult | float],
    *,
    timeout_s: float | None = None,
    name: str = "",
    reward_range: tuple[float, float] | None = (0.0, 1.0),
) -> VerifierResult:
    """Calls `fn()` and returns its result, or reward 0 with the reason it failed.

    Args:
      fn: the verifier; returns a VerifierResult or a bare reward.
      timeout_s: wall-clock limit. The call then runs in a daemon thread, which cannot
        be killed: a verifier that runs commands should also pass a timeout to
        `Sandbox.run`, which does kill them. None runs `fn` in the calling thread.
      name: what is being verified (task id), prefixed to error messages.
      reward_range: inclusive bounds a reward must lie in; None accepts any finite value.

    Returns:
      A VerifierResult; never raises (except KeyboardInterrupt).
    """
    label = f"verifier {name!r}" if name else "verifier"
    try:
        value = fn() if timeout_s is None else _call_with_timeout(fn, timeout_s)
    except _Timeout:
        return _failure(TIMEOUT, f"{label} did not finish within {timeout_s} s")
    except (Exception, SystemExit) as e:  # a verifier calling sys.exit must not end the run
        return _failure(
            EXCEPTION,
            f"{label} raised {type(e).__name__}: {e}",
            details={"traceback": traceback.format_exc(limit=20)},
        )
    result = value if isinstance(value, VerifierResult) else VerifierResult(reward=value)
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        return _failure(INVALID_REWARD, f"{label} returned a non-numeric reward {reward!r}")
    if not math.isfinite(reward):
        return _failure(INVALID_REWARD, f"{label} returned a non-finite reward {reward!r}")
    if reward_range is not None and not reward_range[0] <= reward <= reward_range[1]:
        return _failure(
            INVALID_REWARD, f"{label} returned reward {reward!r} outside {list(reward_range)}"
        )
    if result.error is not None:
        return _failure(
            REPORTED_ERROR, f"{label} reported an error: {result.error}", details=result.details
        )
    return result if isinstance(reward, float) else _with_float_reward(result)


def failure_counts() -> dict[str, int]:
    """How many verifications failed in this process, by reason (a snapshot)."""
    with _lock:
        return dict(_failures)


def failure_metrics() -> dict[str, int]:
    """Flat metrics: `verifier_failures` (total) and `verifier_failures/<reason>` per reason."""
    counts = failure_counts()
    return {"verifier_failures": sum(counts.values())} | {
        f"verifier_failures/{reason}": n for reason, n in counts.items()
    }


def reset_failure_counts() -> None:
    """Zeroes the counters (tests; a trainer that wants per-step rather than cumulative)."""
    with _lock:
        for reason in REASONS:
            _failures[reason] = 0


class _Timeout(Exception):
    pass


def _call_with_timeout(fn: Callable[[], VerifierResult | float], timeout_s: float):
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread below
            outcome["error"] = e

    thread = threading.Thread(target=target, name="verifier", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Timeout
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _failure(reason: str, message: str, details: dict | None = None) -> VerifierResult:
    with _lock:
        _failures[reason] += 1
    return VerifierResult(reward=0.0, reason=reason, details=dict(details or {}), error=message)


def _with_float_reward(result: VerifierResult) -> VerifierResult:
    return VerifierResult(
        reward=float(result.reward), reason=result.reason, details=result.details, error=None
    )
