"""Analytic bounds: how much any start-early schedule can gain over sync, and balancing traces."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from thundersync_jax.sim._cost import CostModel
from thundersync_jax.sim._simulate import simulate
from thundersync_jax.sim._trace import Arrival, validate_trace


class Ceiling(NamedTuple):
    """Sync step time and a lower bound on the step time of group or stream.

    Attributes:
      rollout_span_s: R, batch start → last reward.
      learner_work_s: L, the chunk work of sync (maximal packing).
      learner_work_lb_s: a lower bound on the chunk work of any packing: one
        fixed cost per chunk that must exist plus per_token_s per unpadded token.
      sync_s: R + L + opt + pub (what `simulate(..., "sync")` returns).
      lower_bound_s: max(R + tail_lb, L_lb) + opt + pub, with tail_lb the
        cheapest chunk holding the last-arriving trajectory; no schedule that
        starts a trajectory's work after its arrival can be faster.
      max_speedup: sync_s / lower_bound_s, at most 1 + L/R (= 2 at balance 1).
    """

    rollout_span_s: float
    learner_work_s: float
    learner_work_lb_s: float
    sync_s: float
    lower_bound_s: float
    max_speedup: float


def learner_work_s(trace: Sequence[Arrival], cost: CostModel, max_chunk_tokens: int) -> float:
    """L: the chunk work of the sync schedule (every slot packed as densely as allowed)."""
    return simulate(trace, "sync", cost, max_chunk_tokens).learner_work_s


def ceiling(trace: Sequence[Arrival], cost: CostModel, max_chunk_tokens: int) -> Ceiling:
    """The most any of group/stream can gain over sync on this trace (see `Ceiling`)."""
    validate_trace(trace)
    span = max(a.arrival_s for a in trace)
    work = learner_work_s(trace, cost, max_chunk_tokens)
    slots: dict[tuple[int, float], list[int]] = defaultdict(list)
    for a in trace:
        slots[(a.group, a.reward)].append(a.tokens)
    # A chunk is one trajectory (any length) or several within the budget, so it
    # holds at most max(budget, longest trajectory of its slot) tokens.
    min_chunks = sum(
        max(1, math.ceil(sum(toks) / max(max_chunk_tokens, max(toks)))) for toks in slots.values()
    )
    work_lb = cost.fixed_s * min_chunks + cost.per_token_s * sum(a.tokens for a in trace)
    last_tokens = max(a.tokens for a in trace if a.arrival_s == span)
    tail_lb = cost.fixed_s + cost.per_token_s * last_tokens
    step_extra = cost.opt_s + cost.pub_s
    sync_s = span + work + step_extra
    lower = max(span + tail_lb, work_lb) + step_extra
    return Ceiling(
        rollout_span_s=span,
        learner_work_s=work,
        learner_work_lb_s=work_lb,
        sync_s=sync_s,
        lower_bound_s=lower,
        max_speedup=sync_s / lower if lower > 0 else 1.0,
    )


def balance(
    trace: Sequence[Arrival], cost: CostModel, ratio: float, max_chunk_tokens: int
) -> list[Arrival]:
    """Rescales arrival times so that learner work / rollout span = `ratio`.

    L does not depend on arrival times (sync packs by arrival order, which a
    positive scale keeps), so one rescale is exact.
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
