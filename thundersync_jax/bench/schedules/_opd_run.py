"""The OPD schedule benchmark: multi-turn traces replayed onto the real OPD learner.

Per seed, one multi-turn trace is drawn (`sim.opd_trace`: heavy-tailed turn counts,
lognormal turn durations). The learner's granularity per schedule is `opd.granularity`
("turn", "trajectory", or "auto": whichever the predictor, calibrated at start, says
makes that schedule's step shorter on the balanced trace: `sim.best_granularity`, chosen
again after the warm-up re-balance). Arrival times are scaled
so that sync's calibrated learner work over the rollout span is `balance` (re-scaled after
the warm-up rounds with their passes, as for GRPO). Every replay is preceded by one
calibration pass at its granularity: the batch's own items, all arrived, in sync order,
every segment program call timed alone, each one-shot chunk end to end, the loop's
per-chunk overhead as the rest. The prediction (`sim.simulate_opd`) prices calls with the
counted rounds' passes pooled; the one from the pass right before each replay is kept too.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics

from thundersync_jax import sim
from thundersync_jax.bench.schedules._learner import stall_free_mean
from thundersync_jax.bench.schedules._opd_learner import BenchOpdLearner, payload_fn
from thundersync_jax.bench.schedules._replay import rel_diff, replay_step, schedule_summary

log = logging.getLogger(__name__)


@dataclasses.dataclass
class OpdSamples:
    """Timed calls per `sim.CallKey`, loop overheads per chunk, optimizer steps."""

    calls: dict = dataclasses.field(default_factory=dict)
    overhead: list = dataclasses.field(default_factory=list)
    opt: list = dataclasses.field(default_factory=list)

    def extend(self, other: OpdSamples) -> None:
        for key, ts in other.calls.items():
            self.calls.setdefault(key, []).extend(ts)
        self.overhead.extend(other.overhead)
        self.opt.extend(other.opt)

    def cost(self, learner: BenchOpdLearner) -> sim.SegmentCost:
        fns = learner.fns
        return sim.SegmentCost.fit(
            self.calls,
            self.overhead,
            self.opt,
            fns.seg_buckets,
            fns.cache_buckets,
            learner.seq_buckets,
            price=stall_free_mean,
        )


def _trace(config, seed: int) -> list[sim.OpdTurn]:
    longest = min(config.opd.cache_buckets[-1], config.seq_buckets[-1])
    return sim.opd_trace(
        config.num_groups,
        config.group_size,
        config.sigma,
        config.group_icc,
        config.turns_sigma,
        config.opd.mean_turns,
        config.mean_tokens,
        longest,
        seed,
        max_segment=config.opd.seg_buckets[-1],
    )


def _items(learner, trace, seed):
    return sim.opd_items(trace, payload_fn(trace, learner.vocab_size, seed))


def _replay(learner, trace, items, schedule: str, granularity: str, advance: bool):
    planner = sim.opd_planner(trace, schedule)
    learner.use(granularity)
    return replay_step(
        learner, items, schedule, planner.num_groups, planner.group_size, 1, advance, 1
    )


def calibration_pass(
    learner: BenchOpdLearner, trace, granularity: str, seed: int, arrived: bool = True
) -> OpdSamples:
    """Times the batch's own work at `granularity`: a sync replay, each call or chunk alone.

    `arrived=True`: every turn already in (the at-start passes, before the trace is
    balanced: its raw arrival times are in rollout seconds). `arrived=False`: the turns
    arrive at their trace times and the work runs after the last one, as in a real `sync`
    step: a learner woken by a trickle of arrivals runs the same calls ~3% slower than one
    that was handed the whole batch at once (measured, idle VM), so the counted rounds'
    passes are timed that way.
    """
    at_once = [t._replace(arrival_s=0.0) for t in trace] if arrived else trace
    learner.calls.clear()
    res = _replay(learner, at_once, _items(learner, at_once, seed), "sync", granularity, False)
    out = OpdSamples()
    by_traj = sim.trajectories(trace)
    prev_end = res.chunks[0][2]
    intervals = []
    for (_, _, _, end), ids in zip(res.chunks, res.chunk_items, strict=True):
        intervals.append(end - prev_end)
        if granularity == "trajectory":  # whole chunks: host bookkeeping, or the one-shot
            tid = int(ids[0][:9])
            end_item = ids[0] == sim.end_item_id(tid)
            key = (
                sim.one_shot_call(by_traj[tid], learner.seq_buckets) if end_item else sim._opd.HOLD
            )
            out.calls.setdefault(key, []).append(end - prev_end)
        prev_end = end
    if granularity == "turn":
        for key, seconds in learner.calls:
            out.calls.setdefault(key, []).append(seconds)
        spent = sum(s for _, s in learner.calls)
        out.overhead.append(max(sum(intervals) - spent, 0.0) / len(intervals))
    out.opt.append(res.step_time_s - prev_end)
    return out


def _balanced(config, trace, cost, schedules_) -> tuple[list, dict[str, str]]:
    """The trace at `balance` and each schedule's granularity on that trace.

    `auto` picks sync's granularity first (sync's step is span + all the work, whatever the
    arrival scale), balances the trace with its work, then picks every schedule's on the
    balanced trace: the choice depends on how learner work compares with the rollout span.
    """
    choice = str(config.opd.granularity)
    if choice != "auto":
        fixed = sim._opd.check_granularity(choice)
        gran = {s: fixed for s in schedules_}
        return sim.balance_opd(trace, cost, float(config.balance), fixed), gran
    trace = sim.balance_opd(
        trace, cost, float(config.balance), sim.best_granularity(trace, "sync", cost)
    )
    return trace, {s: sim.best_granularity(trace, s, cost) for s in schedules_}


def run_opd_seed(learner: BenchOpdLearner, config, seed: int) -> dict:
    """Calibration, measured rounds and predictions of every schedule on one OPD workload."""
    trace = _trace(config, seed)
    schedules_ = list(config.schedules)
    start = OpdSamples()
    for g in sim.GRANULARITIES:
        calibration_pass(learner, trace, g, seed)  # compiles every shape of the batch
        for _ in range(int(config.calibration_reps)):
            start.extend(calibration_pass(learner, trace, g, seed))
    cost = start.cost(learner)
    trace, gran = _balanced(config, trace, cost, schedules_)
    warm, pool = OpdSamples(), OpdSamples()
    measured = {s: [] for s in schedules_}
    paired = {s: [] for s in schedules_}
    grad_diffs = []
    for r in range(int(config.warmup) + int(config.rounds)):
        if r == int(config.warmup) and r > 0:  # re-balance at the replays' speed
            trace, gran = _balanced(config, trace, _merged(start, warm).cost(learner), schedules_)
        items = _items(learner, trace, seed)
        order = schedules_[r % len(schedules_) :] + schedules_[: r % len(schedules_)]
        grads = {}
        for i, s in enumerate(order):
            step = calibration_pass(
                learner, trace, gran[s], seed, arrived=not config.calibrate_on_arrivals
            )
            res = _replay(learner, trace, items, s, gran[s], advance=i == len(order) - 1)
            grads[s] = res.grads
            if r < int(config.warmup):
                warm.extend(step)
                continue
            pool.extend(step)
            measured[s].append(res)
            paired_cost = _merged(start, step).cost(learner)
            paired[s].append(sim.simulate_opd(trace, s, paired_cost, gran[s]))
            log.info("opd seed %d round %d %s (%s): %.3f s", seed, r, s, gran[s], res.step_time_s)
        grad_diffs += [rel_diff(grads[s], grads[schedules_[0]]) for s in schedules_[1:]]
    pooled = _merged(start, pool).cost(learner)
    return _seed_result(trace, schedules_, gran, cost, pooled, measured, paired, grad_diffs)


def _merged(base: OpdSamples, counted: OpdSamples) -> OpdSamples:
    """The counted passes' samples, with the start calibration only for shapes they lack."""
    out = OpdSamples(dict(counted.calls), list(counted.overhead), list(counted.opt))
    for key, ts in base.calls.items():
        out.calls.setdefault(key, list(ts))
    out.overhead = out.overhead or list(base.overhead)
    return out


def _seed_result(trace, schedules_, gran, cost, pooled, measured, paired, grad_diffs) -> dict:
    at_start = {s: sim.simulate_opd(trace, s, cost, gran[s]) for s in schedules_}
    predicted = {s: sim.simulate_opd(trace, s, pooled, gran[s]) for s in schedules_}
    other = {s: sim.step_time_by_granularity(trace, s, pooled) for s in schedules_}
    turns = sim.trajectories(trace)
    out = {
        "algorithm": "opd",
        "rollout_span_s": at_start["sync"].rollout_span_s,
        "learner_work_s": at_start["sync"].learner_work_s,
        "realized_balance": predicted["sync"].learner_work_s / at_start["sync"].rollout_span_s,
        "num_trajectories": len(turns),
        "num_turns": len(trace),
        "turns_per_trajectory": sorted(len(v) for v in turns.values()),
        "granularity": gran,
        "predicted_step_time_by_granularity_s": other,
        "max_grad_rel_diff": max(grad_diffs, default=0.0),
        "cost_model": {
            "prices": [[*k, v] for k, v in sorted(pooled.prices.items())],
            "fits": dict(pooled.fits),
            "overhead_s": pooled.overhead_s,
            "opt_s": pooled.opt_s,
        },
        "schedules": {},
        "predicted_async_step_time_s": sim.simulate_opd(
            trace, "async", pooled, gran["sync"]
        ).step_time_s,
        "calibration_spread": 0.0,
    }
    works = [p.learner_work_s for s in schedules_ for p in paired[s] if gran[s] == gran["sync"]]
    if works:
        out["calibration_spread"] = (max(works) - min(works)) / statistics.median(works)
    for s in schedules_:
        rs, pred = measured[s], predicted[s]
        out["schedules"][s] = schedule_summary(
            rs, pred, paired[s], at_start[s],
            sim.simulate_opd(trace, s, pooled.affine(), gran[s]).step_time_s,
        )  # fmt: skip
    return out
