"""The algorithms the one training loop runs, by `rl.algorithm` name.

    from thundersync_jax import algorithms
    algo = algorithms.get(config.rl.algorithm)     # an `algorithms.base.Algorithm`

To add one: write a module with an `ALGORITHM = Algorithm(...)` (see `grpo.py`, `opd.py`)
and register it in `ALGORITHMS`.
"""

from __future__ import annotations

from thundersync_jax.algorithms import grpo, opd
from thundersync_jax.algorithms._opd_trajectories import GRANULARITIES as OPD_GRANULARITIES
from thundersync_jax.algorithms.base import Algorithm, BatchLearner, LearnerSetup

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (grpo.ALGORITHM, opd.ALGORITHM)}
NAMES = tuple(ALGORITHMS)


def get(name: str) -> Algorithm:
    """The algorithm registered as `name`; ValueError naming the valid ones otherwise."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"rl.algorithm={name!r} is not valid; choose one of: {', '.join(NAMES)}"
        ) from None


__all__ = [
    "ALGORITHMS",
    "NAMES",
    "OPD_GRANULARITIES",
    "Algorithm",
    "BatchLearner",
    "LearnerSetup",
    "get",
]
