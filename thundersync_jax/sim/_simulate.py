"""Trace-driven step-time model: replays one batch's arrivals through a schedule.

The learner is one serial worker. Whenever it is free it asks "which chunk
next?" of the ready work; if nothing is ready it idles until the next
trajectory becomes ready. The decision rule mirrors the scheduling policy of
the orchestrator (thundersync_jax/schedule/planner.py):

* readiness: sync — every trajectory at the last arrival R; group — each
  trajectory when its group's last member arrives; stream — at its own arrival;
  async — at t = 0 (it trains on the previous batch while this one rolls out).
* choice: the smallest-keyed ready trajectory is the head; the chunk is the
  ready trajectories of the head's (group, reward) slot in key order, cut
  before the first one that would push the chunk past `max_chunk_tokens` (a
  trajectory longer than the budget runs alone). Keys: sync/async
  (group, traj_id) — a fixed order, so the synchronous update is bitwise
  reproducible; group (group ready time, arrival, traj_id); stream
  (rank, arrival, traj_id) with rank 0 for a closed group (every member
  arrived), 1 for an open group whose arrived rewards already differ, 2 otherwise.
* cap: with `max_open_groups=M`, once M groups hold a partial tally (some
  members processed, not all), only work of those groups may run.

After the last chunk the optimizer step (opt_s) and publication (pub_s) run
back to back; for async they wait for the rollout span too (see `simulate`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from thundersync_jax.sim._cost import CostModel
from thundersync_jax.sim._trace import Arrival, validate_trace

SCHEDULES = ("sync", "group", "stream", "async")
# Chunk kinds: why the scheduler ran it. sync/async chunks are "batch", group chunks
# "group"; stream chunks carry the rank of their group when they were picked.
STREAM_RANKS = ("closed", "differing", "open")
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


def _arrival_key(a: Arrival) -> tuple[float, int]:
    return (a.arrival_s, a.traj_id)


def _run_learner(
    trace: Sequence[Arrival],
    schedule: str,
    cost: CostModel,
    max_chunk_tokens: int,
    max_open_groups: int | None,
) -> tuple[list[Chunk], float, int]:
    """Event loop of the serial learner; returns (chunks, time learner work ends, open peak)."""
    group_size = Counter(a.group for a in trace)
    span = max(a.arrival_s for a in trace)
    group_done_at = {}
    for a in trace:
        group_done_at[a.group] = max(group_done_at.get(a.group, 0.0), a.arrival_s)

    def ready_at(a: Arrival) -> float:
        if schedule == "sync":
            return span
        if schedule == "async":
            return 0.0
        if schedule == "group":
            return group_done_at[a.group]
        return a.arrival_s

    by_arrival = sorted(trace, key=_arrival_key)
    by_ready = sorted(trace, key=lambda a: (ready_at(a), *_arrival_key(a)))
    arrived_count: Counter = Counter()
    rewards_seen: dict[int, set[float]] = {k: set() for k in group_size}
    pending: dict[int, list[Arrival]] = {k: [] for k in group_size}  # ready, not taken
    taken: Counter = Counter()
    open_groups: set[int] = set()
    next_arrival = next_ready = 0
    chunks: list[Chunk] = []
    open_peak = 0
    fixed_order = schedule in ("sync", "async")
    t = 0.0
    remaining = len(trace)

    def rank(k: int) -> int:
        if arrived_count[k] == group_size[k]:
            return 0
        return 1 if len(rewards_seen[k]) > 1 else 2

    def head_key(k: int) -> tuple:
        head = pending[k][0]
        if schedule == "stream":
            return (rank(k), *_arrival_key(head))
        if schedule == "group":
            return (group_done_at[k], *_arrival_key(head))
        return (k, head.traj_id)

    while remaining:
        while next_arrival < len(by_arrival) and by_arrival[next_arrival].arrival_s <= t:
            a = by_arrival[next_arrival]
            arrived_count[a.group] += 1
            rewards_seen[a.group].add(a.reward)
            next_arrival += 1
        while next_ready < len(by_ready) and ready_at(by_ready[next_ready]) <= t:
            a = by_ready[next_ready]
            pending[a.group].append(a)
            next_ready += 1
            if fixed_order:
                pending[a.group].sort(key=lambda x: x.traj_id)
            # otherwise admission is in arrival order within a group already
        candidates = [k for k, items in pending.items() if items]
        if max_open_groups is not None and len(open_groups) >= max_open_groups:
            candidates = [k for k in candidates if k in open_groups]
        if not candidates:
            if next_ready == len(by_ready):
                raise RuntimeError("learner blocked with nothing left to arrive (scheduler bug)")
            t = ready_at(by_ready[next_ready])  # idle until the next trajectory is ready
            continue
        k = min(candidates, key=head_key)
        kind = {"stream": STREAM_RANKS[rank(k)], "group": "group"}.get(schedule, "batch")
        reward = pending[k][0].reward
        chunk, tokens = [], 0
        for a in pending[k]:
            if a.reward != reward:
                continue
            if chunk and tokens + a.tokens > max_chunk_tokens:
                break
            chunk.append(a)
            tokens += a.tokens
        chosen = {a.traj_id for a in chunk}
        pending[k] = [a for a in pending[k] if a.traj_id not in chosen]
        taken[k] += len(chunk)
        if taken[k] < group_size[k]:
            open_groups.add(k)
        else:
            open_groups.discard(k)
        open_peak = max(open_peak, len(open_groups))
        end = t + cost.chunk_s(tokens)
        chunks.append(Chunk(t, end, kind, tuple(a.traj_id for a in chunk)))
        t = end
        remaining -= len(chunk)
    return chunks, t, open_peak


def simulate(
    trace: Sequence[Arrival],
    schedule: str,
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
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; valid: {', '.join(SCHEDULES)}")
    if max_chunk_tokens < 1:
        raise ValueError(f"max_chunk_tokens={max_chunk_tokens} must be >= 1")
    if max_open_groups is not None and max_open_groups < 1:
        raise ValueError(f"max_open_groups={max_open_groups} must be >= 1 or None")
    validate_trace(trace)
    span = max(a.arrival_s for a in trace)
    chunks, work_end, open_peak = _run_learner(
        trace, schedule, cost, max_chunk_tokens, max_open_groups
    )
    work = sum(c.end - c.start for c in chunks)
    opt_start = max(work_end, span) if schedule == "async" else work_end
    opt_end = opt_start + cost.opt_s
    step_time = opt_end + cost.pub_s
    chunks += [Chunk(opt_start, opt_end, "opt", ()), Chunk(opt_end, step_time, "publish", ())]
    busy = work + cost.opt_s + cost.pub_s
    return SimResult(
        schedule=schedule,
        step_time_s=step_time,
        rollout_span_s=span,
        learner_work_s=work,
        learner_busy_s=busy,
        learner_idle_frac=(step_time - busy) / step_time if step_time > 0 else 0.0,
        tail_s=step_time - span,
        open_groups_peak=open_peak,
        chunks=chunks,
    )
