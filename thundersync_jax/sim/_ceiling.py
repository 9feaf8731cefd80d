"""Analytic bounds: how much any start-early schedule can gain over sync, and balancing traces."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from thundersync_jax.sim._cost import CostModel
from thundersync_jax.sim._simulate import simulate
from thundersync_jax.sim._trace import Arrival, validate_trace


class Ceiling(NamedTuple):
    """Sync step time and lower bounds on the step time of group or stream.

    Attributes:
      rollout_span_s: R, batch start → last reward.
      learner_work_s: L, the chunk work of sync (maximal packing).
      learner_work_lb_s: a lower bound on the chunk work of any packing: one
        fixed cost per chunk that must exist plus per_token_s per unpadded token.
      sync_s: R + L + O with O = opt + pub (what `simulate(..., "sync")` returns).
      lower_bound_s: max over arrival times t of (t + lower bound on the work of
        the trajectories arriving at or after t) + O. No schedule that starts a
        trajectory's work after its arrival can be faster. t = R gives R + the
        cheapest chunk holding the last trajectory; t = 0 gives L_lb.
      max_speedup: sync_s / lower_bound_s, at most 1 + L/R (= 2 at balance 1).
      balance_speedup: (R + L + O) / (max(R, L) + O), the ceiling of the
        balance argument when learner work stays L; it is exactly what async
        reaches (it hides the whole of min(R, L)).
    """

    rollout_span_s: float
    learner_work_s: float
    learner_work_lb_s: float
    sync_s: float
    lower_bound_s: float
    max_speedup: float
    balance_speedup: float


def learner_work_s(trace: Sequence[Arrival], cost: CostModel, max_chunk_tokens: int) -> float:
    """L: the chunk work of the sync schedule (every slot packed as densely as allowed)."""
    return simulate(trace, "sync", cost, max_chunk_tokens).learner_work_s


def _min_chunks(tokens: int, longest: int, max_chunk_tokens: int) -> int:
    # A chunk is one trajectory (any length) or several within the budget, so it
    # holds at most max(budget, longest trajectory of its slot) tokens.
    return max(1, math.ceil(tokens / max(max_chunk_tokens, longest)))


def _release_bound(trace: Sequence[Arrival], cost: CostModel, max_chunk_tokens: int):
    """(max_t [t + work lower bound of arrivals >= t], work lower bound of all) for a trace."""
    slot_tokens: dict[tuple[int, float], int] = {}
    slot_longest: dict[tuple[int, float], int] = {}
    chunks = tokens = 0
    best = 0.0
    ordered = sorted(trace, key=lambda a: a.arrival_s, reverse=True)
    for i, a in enumerate(ordered):
        slot = (a.group, a.reward)
        if slot in slot_tokens:
            chunks -= _min_chunks(slot_tokens[slot], slot_longest[slot], max_chunk_tokens)
        slot_tokens[slot] = slot_tokens.get(slot, 0) + a.tokens
        slot_longest[slot] = max(slot_longest.get(slot, 0), a.tokens)
        chunks += _min_chunks(slot_tokens[slot], slot_longest[slot], max_chunk_tokens)
        tokens += a.tokens
        if i + 1 < len(ordered) and ordered[i + 1].arrival_s == a.arrival_s:
            continue  # evaluate once all trajectories arriving at this time are counted
        work = cost.fixed_s * chunks + cost.per_token_s * tokens
        best = max(best, a.arrival_s + work)
    return best, work


def ceiling(trace: Sequence[Arrival], cost: CostModel, max_chunk_tokens: int) -> Ceiling:
    """The most any of group/stream can gain over sync on this trace (see `Ceiling`)."""
    validate_trace(trace)
    span = max(a.arrival_s for a in trace)
    work = learner_work_s(trace, cost, max_chunk_tokens)
    release, work_lb = _release_bound(trace, cost, max_chunk_tokens)
    step_extra = cost.opt_s + cost.pub_s
    sync_s = span + work + step_extra
    lower = release + step_extra
    return Ceiling(
        rollout_span_s=span,
        learner_work_s=work,
        learner_work_lb_s=work_lb,
        sync_s=sync_s,
        lower_bound_s=lower,
        max_speedup=sync_s / lower if lower > 0 else 1.0,
        balance_speedup=sync_s / (max(span, work) + step_extra) if sync_s > 0 else 1.0,
    )


def balance(
    trace: Sequence[Arrival], cost: CostModel, ratio: float, max_chunk_tokens: int
) -> list[Arrival]:
    """Rescales arrival times so that learner work / rollout span = `ratio`.

    L does not depend on arrival times (sync packs each slot in traj_id order),
    so one rescale is exact.
    """
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio={ratio} must be finite and > 0")
    validate_trace(trace)
    span = max(a.arrival_s for a in trace)
    work = learner_work_s(trace, cost, max_chunk_tokens)
    if span <= 0 or work <= 0:
        raise ValueError(f"cannot balance: rollout span {span} s and learner work {work} s")
    scale = work / (ratio * span)
    return [a._replace(arrival_s=a.arrival_s * scale) for a in trace]
