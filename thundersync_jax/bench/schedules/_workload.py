"""The benchmark's workload: one batch of trajectories to replay, and its token sequences.

Arrival times and lengths come from a trace (synthetic lognormal, or a JSONL trace
recorded by a training run). Every trajectory becomes a real token sequence of
its trace length: token 0 plays the prompt, the rest are scored, so the learner's
cost is that of a real score-gradient chunk of that shape. Token ids are random;
learner cost does not depend on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from thundersync_jax.schedule.planner import WorkItem
from thundersync_jax.sim import Arrival, lognormal_trace, read_trace, split_steps


@dataclasses.dataclass(frozen=True)
class ReplayTrajectory:
    """What `GrpoLearner.process` reads from a work item's payload.

    Attributes:
      tokens: int32 [n] token ids, token 0 the prompt.
      loss_mask: float32 [n], 0 at position 0 and 1 elsewhere.
      policy_versions: the policy version of every turn (one turn here).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    policy_versions: tuple[int, ...]


def load_trace(
    trace: str,
    *,
    num_groups: int,
    group_size: int,
    sigma: float,
    group_icc: float,
    mean_tokens: int,
    seed: int,
    step: int = -1,
) -> list[Arrival]:
    """One step's arrivals: `trace="lognormal"` draws them, anything else is a JSONL path.

    For a recorded trace, `step` picks the step (-1: the last one) and the
    synthetic parameters are ignored.
    """
    if trace == "lognormal":
        return lognormal_trace(
            num_groups, group_size, sigma, group_icc, mean_s=1.0, seed=seed, mean_tokens=mean_tokens
        )
    steps = split_steps(read_trace(trace))
    if not steps:
        raise ValueError(f"trace={trace!r} holds no records")
    keys = list(steps)
    if step == -1:
        step = keys[-1]
    if step not in steps:
        raise ValueError(f"trace {trace!r} has no step {step}; steps: {keys}")
    return steps[step]


def fit_lengths(trace: Sequence[Arrival], max_len: int) -> tuple[list[Arrival], int]:
    """Clips trace lengths to [2, max_len] (a sequence needs a prompt and one scored token).

    Returns the clipped trace and how many records were changed.
    """
    out = [a._replace(tokens=int(min(max(a.tokens, 2), max_len))) for a in trace]
    return out, sum(a.tokens != b.tokens for a, b in zip(trace, out, strict=True))


def group_shape(trace: Sequence[Arrival]) -> tuple[int, int]:
    """(num_groups, group_size) a planner needs for this trace (largest group's size)."""
    sizes: dict[int, int] = {}
    for a in trace:
        sizes[a.group] = sizes.get(a.group, 0) + 1
    return max(sizes) + 1, max(sizes.values())


def work_items(trace: Sequence[Arrival], vocab_size: int, seed: int) -> list[WorkItem]:
    """One `WorkItem` per trajectory, arrival order, payload a random token sequence.

    `num_tokens` is the sequence length (the learner's cost driver, and what the
    simulator is given as `Arrival.tokens`).
    """
    rng = np.random.default_rng(seed)
    items = []
    for a in sorted(trace, key=lambda a: (a.arrival_s, a.traj_id)):
        mask = np.ones(a.tokens, np.float32)
        mask[0] = 0.0
        payload = ReplayTrajectory(
            tokens=rng.integers(1, vocab_size, size=a.tokens, dtype=np.int32),
            loss_mask=mask,
            policy_versions=(0,),
        )
        items.append(
            WorkItem(
                item_id=f"{a.traj_id:09d}",  # as sim's planner ids: same tie-breaks
                group=a.group,
                reward=a.reward,
                num_tokens=a.tokens,
                arrival_s=a.arrival_s,
                payload=payload,
                member=a.member,
            )
        )
    return items
