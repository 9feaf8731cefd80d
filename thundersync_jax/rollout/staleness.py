"""Zero-staleness check: a trajectory may only be trained on by the policy version that sampled it.

Streaming gradients equal the batch-synchronous update only if every trajectory was sampled by the
weights the learner is differentiating (DESIGN §2, invariants). The `sync`, `group` and `stream`
schedules call `check_version` on every result before its gradient is taken; `async` is the
deliberate exception and records the lag instead.
"""

from __future__ import annotations


class StalePolicyError(RuntimeError):
    """A result was sampled by a different policy version than the learner's."""


def check_version(result_version: int, learner_version: int, *, what: str = "result") -> None:
    """Raises StalePolicyError unless `result_version == learner_version`.

    Args:
      result_version: the `policy_version` a GenerateResult (or a turn) carries.
      learner_version: the version of the parameters the learner is about to differentiate.
      what: names the offending item in the message (e.g. a request id).
    """
    if int(result_version) != int(learner_version):
        lag = int(learner_version) - int(result_version)
        raise StalePolicyError(
            f"{what} was sampled by policy version {result_version} but the learner is at version "
            f"{learner_version} (lag {lag}); sync/group/stream schedules need lag 0 — publish the "
            "learner's weights to every engine (and wait for the acknowledgements) before sampling"
        )
