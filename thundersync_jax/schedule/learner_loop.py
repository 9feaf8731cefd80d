"""The learner side of one batch: take arrivals, run chunks as the planner allows.

Rollout threads (or a trace replayer) put `Arrival`s on a queue; this loop,
running on the learner's thread, moves them into the planner and runs whatever
chunk the planner says is ready, draining the queue between chunks so priority
decisions always see every arrival so far. The learner's per-batch state is
threaded through `process(state, chunk) -> state` (an algorithm's pure learner
function, `algorithms.base.BatchLearner.process`); the loop returns the final
state once the planner has handed out the whole batch.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable
from typing import Any, TypeVar

from thundersync_jax.schedule.planner import Planner, WorkItem

State = TypeVar("State")


@dataclasses.dataclass(frozen=True)
class MemberFailed:
    """A rollout that will never deliver (its retries ran out): the group shrinks.

    Attributes:
      group: its group.
      reason: why, for the log.
      member: its index in the group, when known (frees its open-trajectory slot).
    """

    group: int
    reason: str
    member: int | None = None


@dataclasses.dataclass
class BatchStats:
    """What the learner loop measured for one batch."""

    chunks: int = 0
    learner_busy_s: float = 0.0
    first_arrival_s: float | None = None
    last_arrival_s: float | None = None
    failures: list[str] = dataclasses.field(default_factory=list)
    failed_groups: set[int] = dataclasses.field(default_factory=set)


def run_learner_batch(
    planner: Planner,
    arrivals: queue.Queue,
    state: State,
    process_chunk: Callable[[State, list[WorkItem]], State],
    *,
    clock: Callable[[], float] = time.perf_counter,
    on_chunk: Callable[[list[WorkItem], float, float], Any] | None = None,
    timeout_s: float = 3600.0,
) -> tuple[State, BatchStats]:
    """Runs the batch's learner work; returns (final state, stats) once every item ran.

    Args:
      planner: decides readiness and chunk order for this batch.
      arrivals: queue of `WorkItem` or `MemberFailed`.
      state: the learner's per-batch state at the batch start.
      process_chunk: (state, chunk) -> state, the learner work for one chunk (score
        gradient + accumulate); it returns when the work is done (timings measure it).
      clock: time source (the benchmark passes its own epoch-relative clock).
      on_chunk: called with (chunk, start, end) after each chunk, for the timeline.
      timeout_s: longest wait for a single arrival before giving up with an error.
    """
    stats = BatchStats()

    def take(item) -> None:
        if isinstance(item, MemberFailed):
            planner.drop_member(item.group, item.member)
            stats.failures.append(item.reason)
            stats.failed_groups.add(item.group)
            return
        now = clock()
        stats.first_arrival_s = now if stats.first_arrival_s is None else stats.first_arrival_s
        stats.last_arrival_s = now
        planner.push(item)

    while not planner.done():
        while True:  # everything that arrived so far, without blocking
            try:
                take(arrivals.get_nowait())
            except queue.Empty:
                break
        chunk = planner.next_chunk()
        if not chunk:
            if planner.done():
                break
            try:
                take(arrivals.get(timeout=timeout_s))
            except queue.Empty:
                raise TimeoutError(
                    f"no rollout arrived for {timeout_s:.0f} s with the batch incomplete"
                ) from None
            continue
        start = clock()
        state = process_chunk(state, chunk)
        end = clock()
        stats.chunks += 1
        stats.learner_busy_s += end - start
        if on_chunk is not None:
            on_chunk(chunk, start, end)
    return state, stats
