"""What every algorithm counts over one batch, and the step metrics made from it.

The data-parallel merge (`data_parallel.py`) and every algorithm (`algorithms/base.py`) read
the same tally, so it lives here, below both.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np


class BatchTally(NamedTuple):
    """What every algorithm counts over one batch (plain Python values).

    Attributes:
      tokens: loss-masked tokens folded in.
      rewards: (group, reward) of every finished member.
      lags: per learner item (GRPO trajectory, OPD turn): learner version − the oldest
        version that sampled it.
      verifier_failures: "item: reason" for rewards a failed verifier set.
    """

    tokens: int = 0
    rewards: tuple[tuple[int, float], ...] = ()
    lags: tuple[int, ...] = ()
    verifier_failures: tuple[str, ...] = ()

    def add(self, *, tokens=0, rewards=(), lags=(), verifier_failures=()) -> BatchTally:
        return BatchTally(
            self.tokens + int(tokens),
            self.rewards + tuple(rewards),
            self.lags + tuple(lags),
            self.verifier_failures + tuple(verifier_failures),
        )


def tally_metrics(t: BatchTally) -> dict:
    """The per-step metrics of a batch's tally (DESIGN §6 names plus mixed_groups)."""
    rewards = sorted(r for _, r in t.rewards)  # sorted: the mean must not depend on arrival order
    by_group: dict[int, set[float]] = defaultdict(set)
    for g, r in t.rewards:
        by_group[g].add(r)
    return dict(
        reward_mean=float(np.mean(rewards)) if rewards else 0.0,
        mixed_groups=sum(len(rs) > 1 for rs in by_group.values()),
        tokens=int(t.tokens),
        max_policy_lag=max(t.lags, default=0),
        mean_policy_lag=float(np.mean(t.lags)) if t.lags else 0.0,
        verifier_failures=len(t.verifier_failures),
    )
