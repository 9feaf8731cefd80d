"""Trace-driven step-time model: replays one batch's arrivals through a schedule.

The learner is one serial worker. The scheduling policy is not re-implemented
here: the orchestrator's own `schedule.planner.Planner` runs on a virtual clock.
Whenever the learner is free, every trajectory that arrived by then is pushed
and the planner picks the next chunk (or none: the clock jumps to the next
arrival); the chunk then occupies the learner for `CostModel.chunk_cost`
seconds. This is what `schedule.learner_loop.run_learner_batch` does on a wall
clock, so a prediction differs from a real run only by the cost model.

Policy summary (the planner's docstring is authoritative): sync and async run
the whole batch in (group, member) order; group runs groups in the order they
completed; stream prefers closed groups, then open groups whose rewards
already differ, then the rest, oldest first. Chunks pack one (group, reward)
slot up to `max_chunk_tokens`; `max_open_groups` applies backpressure.

After the last chunk the optimizer step (opt_s) and publication (pub_s) run
back to back; for async they wait for the rollout span too (see `simulate`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.planner import Planner, WorkItem
from thundersync_jax.schedule.schedules import STREAM_RANKS, Schedule
from thundersync_jax.sim._cost import CostModel
from thundersync_jax.sim._trace import Arrival, validate_trace

SCHEDULES = schedules.NAMES
# Chunk kinds: why the scheduler ran it (`Schedule.chunk_kind`): sync/async chunks are
# "batch", group chunks "group"; stream chunks carry the rank of their group when picked.
LEARNER_KINDS = ("batch", "group", *STREAM_RANKS, "opt", "publish")


class Chunk(NamedTuple):
    """One interval of the learner row: a chunk of trajectories, the opt step or publication.

    Attributes:
      start: seconds from batch start.
      end: seconds from batch start.
      kind: one of LEARNER_KINDS.
      ids: traj_ids processed (empty for "opt" and "publish").
    """

    start: float
    end: float
    kind: str
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Predicted timing of one step.

    Attributes:
      schedule: the schedule simulated.
      step_time_s: batch start → weights published.
      rollout_span_s: batch start → last reward (R).
      learner_work_s: seconds of chunk work (excludes opt and publish).
      learner_busy_s: chunk work + optimizer step + publication.
      learner_idle_frac: (step_time_s − learner_busy_s) / step_time_s.
      tail_s: last reward → weights published (step_time_s − R).
      open_groups_peak: most groups holding a partial tally after any chunk hand-out.
      chunks: the learner row in time order, opt and publish included.
    """

    schedule: str
    step_time_s: float
    rollout_span_s: float
    learner_work_s: float
    learner_busy_s: float
    learner_idle_frac: float
    tail_s: float
    open_groups_peak: int
    chunks: list[Chunk]


def _work_item(a: Arrival) -> WorkItem:
    # Zero-padded ids make the planner's last tie-break (item_id) follow traj_id order.
    return WorkItem(
        item_id=f"{a.traj_id:09d}",
        group=a.group,
        reward=a.reward,
        num_tokens=a.tokens,
        arrival_s=a.arrival_s,
        payload=a,
        member=a.member,
    )


def _planner_for(
    trace: Sequence[Arrival], schedule: Schedule, max_chunk_tokens: int, cap
) -> Planner:
    """A planner sized for the trace; groups smaller than the largest are shrunk up front."""
    sizes = Counter(a.group for a in trace)
    num_groups = max(sizes) + 1
    group_size = max(sizes.values())
    planner = Planner(schedule, num_groups, group_size, max_chunk_tokens, cap)
    for k in range(num_groups):
        for _ in range(group_size - sizes.get(k, 0)):
            planner.drop_member(k)
    return planner


def _run_learner(
    trace: Sequence[Arrival],
    schedule: Schedule,
    cost: CostModel,
    max_chunk_tokens: int,
    max_open_groups: int | None,
) -> tuple[list[Chunk], float, int]:
    """The orchestrator's Planner on a virtual clock; returns (chunks, work end, open peak)."""
    planner = _planner_for(trace, schedule, max_chunk_tokens, max_open_groups)
    items = [_work_item(a) for a in trace]
    return run_planner(
        planner, items, lambda c: cost.chunk_cost([it.num_tokens for it in c]), schedule.pipelined
    )


def run_planner(
    planner: Planner,
    items: Sequence[WorkItem],
    chunk_cost: Callable[[list[WorkItem]], float],
    pipelined: bool = False,
) -> tuple[list[Chunk], float, int]:
    """Drives `planner` over `items` on a virtual clock; returns (chunks, work end, open peak).

    Mirrors `schedule.learner_loop.run_learner_batch`: whenever the learner is free,
    every arrival so far is pushed, then the planner picks the next chunk, which takes
    `chunk_cost(chunk)` seconds; with nothing ready the clock jumps to the next arrival.
    A pipelined schedule (async) starts with the whole (previous) batch in hand. Chunk
    ids are the items' `payload.traj_id`.
    """
    by_arrival = sorted(items, key=lambda it: (it.arrival_s, it.item_id))
    chunks: list[Chunk] = []
    t, i = 0.0, 0
    if pipelined:
        for it in by_arrival:
            planner.push(it)
        i = len(by_arrival)
    while not planner.done():
        while i < len(by_arrival) and by_arrival[i].arrival_s <= t:
            planner.push(by_arrival[i])
            i += 1
        picked = planner.next_chunk()
        if not picked:
            if i == len(by_arrival):
                raise RuntimeError("learner blocked with nothing left to arrive (planner bug)")
            t = by_arrival[i].arrival_s  # idle until the next item arrives
            continue
        kind = planner.chunk_kind(picked[0].group)  # what the group looked like when picked
        end = t + chunk_cost(picked)
        chunks.append(Chunk(t, end, kind, tuple(it.payload.traj_id for it in picked)))
        t = end
    return chunks, t, planner.open_groups_peak


def simulate(
    trace: Sequence[Arrival],
    schedule: str | Schedule,
    cost: CostModel,
    max_chunk_tokens: int,
    max_open_groups: int | None = None,
) -> SimResult:
    """Predicts one step's timeline under `schedule`.

    Group sizes are the member counts found in the trace. The optimizer step
    starts when the learner work ends — for async, when both the learner work on
    the previous batch and this batch's rollouts are done (one-step off-policy
    with a barrier at the weight swap), so its steady-state step time is
    max(R, L) + opt_s + pub_s with L the learner work.

    Args:
      trace: one step's arrivals.
      schedule: one of "sync", "group", "stream", "async".
      cost: the learner cost model.
      max_chunk_tokens: token budget of one packed chunk (before padding).
      max_open_groups: cap on groups holding a partial tally; None for no cap.
        Only stream can hold more than one such group, so only it is affected.
    """
    schedule = schedules.get(schedule)
    if max_chunk_tokens < 1:
        raise ValueError(f"max_chunk_tokens={max_chunk_tokens} must be >= 1")
    if max_open_groups is not None and max_open_groups < 1:
        raise ValueError(f"max_open_groups={max_open_groups} must be >= 1 or None")
    validate_trace(trace)
    span = max(a.arrival_s for a in trace)
    chunks, work_end, open_peak = _run_learner(
        trace, schedule, cost, max_chunk_tokens, max_open_groups
    )
    return step_result(schedule, span, chunks, work_end, open_peak, cost.opt_s, cost.pub_s)


def step_result(
    schedule: Schedule,
    span: float,
    chunks: list[Chunk],
    work_end: float,
    open_peak: int,
    opt_s: float,
    pub_s: float,
) -> SimResult:
    """The step's `SimResult` from its learner chunks: opt and publish appended."""
    work = sum(c.end - c.start for c in chunks)
    # A pipelined schedule's weight swap waits for the next batch's rollouts (a barrier).
    opt_start = max(work_end, span) if schedule.pipelined else work_end
    opt_end = opt_start + opt_s
    step_time = opt_end + pub_s
    chunks = [
        *chunks,
        Chunk(opt_start, opt_end, "opt", ()),
        Chunk(opt_end, step_time, "publish", ()),
    ]
    busy = work + opt_s + pub_s
    return SimResult(
        schedule=schedule.name,
        step_time_s=step_time,
        rollout_span_s=span,
        learner_work_s=work,
        learner_busy_s=busy,
        learner_idle_frac=(step_time - busy) / step_time if step_time > 0 else 0.0,
        tail_s=step_time - span,
        open_groups_peak=open_peak,
        chunks=chunks,
    )
