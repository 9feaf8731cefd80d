"""One measured step: a trace replayed onto the real learner loop, on a wall clock.

A feeder thread stands in for the rollout fleet: it sleeps until each
trajectory's arrival time and puts its `WorkItem` on the queue, costing the
learner nothing but a thread wake-up. The learner thread runs the training
run's own `run_learner_batch` with a `Planner`, then finalize and the optimizer
step. The step time is batch start → optimizer step done (no publication).
"""

from __future__ import annotations

import dataclasses
import queue
import statistics
import threading
import time
from collections.abc import Sequence

import jax
import numpy as np

from thundersync_jax.bench.schedules._gc import collector_paused
from thundersync_jax.bench.schedules._learner import BenchLearner, CalibrationSamples
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What one replayed step measured (seconds from batch start).

    Attributes:
      step_time_s: batch start → optimizer step done.
      rollout_span_s: batch start → last trajectory put on the queue.
      learner_busy_s: chunk work + finalize and optimizer step.
      learner_idle_frac: 1 − busy / step time.
      tail_s: step time − rollout span.
      chunks: (rows, longest sequence, start, end) of every chunk.
      chunk_items: the item ids of every chunk, in the same order.
      grads: ∇L of the step (for comparing schedules).
    """

    step_time_s: float
    rollout_span_s: float
    learner_busy_s: float
    learner_idle_frac: float
    tail_s: float
    chunks: list[tuple[int, int, float, float]]
    grads: object
    chunk_items: list[tuple[str, ...]] = dataclasses.field(default_factory=list)


def replay_step(
    learner: BenchLearner,
    items: Sequence[WorkItem],
    schedule: str,
    num_groups: int,
    group_size: int,
    max_chunk_tokens: int,
    advance: bool,
    max_chunk_items: int | None = None,
) -> RoundResult:
    """Replays `items` (arrival order) under `schedule`; see the module docstring.

    The cyclic garbage collector is off during the replay (`collector_paused`).
    """
    with collector_paused():
        planner = Planner(
            schedule, num_groups, group_size, max_chunk_tokens, max_chunk_items=max_chunk_items
        )
        return _replay(learner, items, planner, num_groups, group_size, advance)


def _replay(learner, items, planner, num_groups, group_size, advance):
    sizes: dict[int, int] = {}
    for it in items:  # members: an OPD turn item closes its member only on the last turn
        sizes[it.group] = sizes.get(it.group, 0) + int(it.closes_member)
    for k in range(num_groups):
        for _ in range(group_size - sizes.get(k, 0)):
            planner.drop_member(k)  # recorded traces may hold short groups
    learner.begin(num_groups, group_size)
    arrivals: queue.Queue = queue.Queue()
    put_times: list[float] = []
    chunk_log: list[tuple[int, int, float, float]] = []
    chunk_items: list[tuple[str, ...]] = []

    def log_chunk(chunk, start, end):
        chunk_log.append((len(chunk), max(it.num_tokens for it in chunk), start, end))
        chunk_items.append(tuple(it.item_id for it in chunk))

    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731

    def feed() -> None:
        for it in items:
            wait = it.arrival_s - clock()
            if wait > 0:
                time.sleep(wait)
            arrivals.put(it)
            put_times.append(clock())

    feeder = threading.Thread(target=feed, name="trace-replay", daemon=True)
    feeder.start()
    _, stats = run_learner_batch(
        planner,
        arrivals,
        learner.batch,
        learner.process,
        clock=clock,
        on_chunk=log_chunk,
        timeout_s=600.0,
    )
    opt_start = clock()
    grads = learner.finish(advance)
    step_time = clock()
    feeder.join()
    busy = stats.learner_busy_s + (step_time - opt_start)
    span = max(put_times)
    return RoundResult(
        step_time_s=step_time,
        rollout_span_s=span,
        learner_busy_s=busy,
        learner_idle_frac=1.0 - busy / step_time,
        tail_s=step_time - span,
        chunks=chunk_log,
        grads=grads,
        chunk_items=chunk_items,
    )


def calibration_pass(
    learner: BenchLearner,
    items: Sequence[WorkItem],
    num_groups: int,
    group_size: int,
    max_chunk_tokens: int,
) -> CalibrationSamples:
    """Times the batch's own chunks: a `sync` replay with every trajectory already arrived.

    Each chunk is timed from the end of the previous one to its own end, so its
    sample holds what the learner loop spends around it in a replay (the planner's
    pick, the queue poll) besides the score gradient: ~0.1 ms a chunk, 1-2% of a
    step. The first chunk is timed alone (before it the loop drains the queue,
    which a replay does while it waits for arrivals). The optimizer step is timed
    from the last chunk's end to the step's end.
    """
    at_once = [dataclasses.replace(it, arrival_s=0.0) for it in items]
    res = replay_step(
        learner, at_once, "sync", num_groups, group_size, max_chunk_tokens, advance=False
    )
    out = CalibrationSamples()
    prev_end = res.chunks[0][2]  # the first chunk's own start
    for rows, longest, _, end in res.chunks:
        out.add_chunk(*learner.padded_shape(rows, longest), end - prev_end)
        prev_end = end
    out.opt.append(res.step_time_s - prev_end)
    return out


def rel_diff(a, b) -> float:
    """‖a − b‖ / ‖b‖ over all leaves of two gradient pytrees."""
    num = sum(
        float(np.sum((np.asarray(x) - np.asarray(y)) ** 2))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    den = sum(float(np.sum(np.asarray(y) ** 2)) for y in jax.tree.leaves(b))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def schedule_summary(rs, pred, paired, at_start, affine_step_s: float) -> dict:
    """One schedule's bench.json entry: medians of the measured rounds beside the predictions
    (pooled, paired with each round, from the start calibration, affine prices)."""
    return {
        "step_time_s": statistics.median(x.step_time_s for x in rs),
        "predicted_step_time_s": pred.step_time_s,
        "predicted_paired_step_time_s": statistics.median(p.step_time_s for p in paired),
        "predicted_at_start_step_time_s": at_start.step_time_s,
        "predicted_affine_step_time_s": affine_step_s,
        "learner_idle_frac": statistics.median(x.learner_idle_frac for x in rs),
        "predicted_learner_idle_frac": pred.learner_idle_frac,
        "tail_s": statistics.median(x.tail_s for x in rs),
        "predicted_tail_s": pred.tail_s,
        "rounds_step_time_s": [x.step_time_s for x in rs],
        "rounds_predicted_paired_step_time_s": [p.step_time_s for p in paired],
    }
