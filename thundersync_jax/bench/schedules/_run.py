"""The schedule benchmark: every schedule on the same replayed workload, measured and predicted.

Per seed, one trace is drawn (or read), its lengths clipped to the largest
sequence bucket, and its arrival times scaled so that the calibrated learner
work over the rollout span equals `balance`. Each round replays that same
workload once per schedule, the schedule order rotating from round to round so
slow drifts of the machine hit every schedule alike; warm-up rounds are dropped.
The prediction is `sim.simulate` on the same (scaled) trace with a cost model
calibrated on the same learner: at start (which sets the balance, re-set by the
warm-up rounds) and again right before every replay, the counted rounds' passes
pooled (see `_run_seed`). Every timed pass runs with Python's cyclic garbage collector
off (`_gc.py`).

Reported per schedule: the mean over seeds of the median over counted rounds,
measured and predicted alike; every schedule's update is checked to be the same
(`max_grad_rel_diff`: streaming is exact).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Sequence
from typing import NamedTuple

import ml_collections
import numpy as np

from thundersync_jax import sim
from thundersync_jax.bench.schedules import _workload as workload
from thundersync_jax.bench.schedules._gc import frozen_heap
from thundersync_jax.bench.schedules._learner import (
    BenchLearner,
    CalibrationSamples,
    fit_cost,
    learner_from_config,
)
from thundersync_jax.bench.schedules._opd_run import run_opd_seed
from thundersync_jax.bench.schedules._replay import (
    RoundResult,
    calibration_pass,
    rel_diff,
    replay_step,
    schedule_summary,
)
from thundersync_jax.schedule import schedules
from thundersync_jax.sim import CostModel

log = logging.getLogger(__name__)

# A pipelined schedule (async) needs a second batch in flight: predicted only.
MEASURED = tuple(s for s in schedules.NAMES if not schedules.get(s).pipelined)
BENCH_FILE = "bench.json"
ALGORITHMS = ("grpo", "opd")


def _seed_trace(config, seed: int) -> list[sim.Arrival]:
    return workload.load_trace(
        config.trace,
        num_groups=config.num_groups,
        group_size=config.group_size,
        sigma=config.sigma,
        group_icc=config.group_icc,
        mean_tokens=config.mean_tokens,
        seed=seed,
        step=config.trace_step,
    )


def max_rows(config, group_size: int) -> int:
    """Most trajectories one chunk can hold: one group's slot, within the token budget."""
    return max(1, min(group_size, int(config.max_chunk_tokens) // 2))  # >= 2 tokens each


def _run_seed(learner: BenchLearner, config, seed: int) -> dict:
    """Calibration, then measured rounds and predictions of every schedule on one seed's workload.

    Calibration at start: every chunk shape and the batch's own chunks
    (`calibration_pass`) timed `calibration_reps` times each; arrival times are
    scaled so that this learner work over the rollout span is `balance`. The
    warm-up rounds re-scale them with their own passes (the VM runs the learner
    faster in the stop-and-go rhythm of replays than in back-to-back passes).

    Every replay is preceded by one calibration pass (every shape once, the
    batch's chunks once). The prediction prices chunks with the counted rounds'
    passes pooled: the learner's speed moves 20-50% between passes seconds apart
    on the dev VM (`calibration_spread`), and a single pass made the prediction
    noisier than the measurement it predicts (7-8% round-to-round spread of
    single-pass predictions of sync against 4-5% of the measured sync steps). The
    prediction from the pass right before each replay is reported too
    (`predicted_paired_step_time_s`).
    """
    mct = int(config.max_chunk_tokens)
    trace, clipped = workload.fit_lengths(_seed_trace(config, seed), learner.seq_buckets[-1])
    num_groups, group_size = workload.group_shape(trace)
    rows = max_rows(config, group_size)

    def calibration(reps: int, items) -> CalibrationSamples:
        samples = learner.time_shapes(num_groups, group_size, rows, reps, seed)
        for _ in range(reps):
            samples.extend(calibration_pass(learner, items, num_groups, group_size, mct))
        return samples

    first_items = workload.work_items(trace, learner.vocab_size, seed)
    cost, _ = fit_cost(calibration(int(config.calibration_reps), first_items), learner.seq_buckets)
    log.info("seed %d calibrated: %s", seed, cost)
    trace = sim.balance(trace, cost, float(config.balance), mct)
    items = workload.work_items(trace, learner.vocab_size, seed)  # the same tokens, new times
    schedules = list(config.schedules)
    measured: dict[str, list[RoundResult]] = {s: [] for s in schedules}
    paired: dict[str, list[sim.SimResult]] = {s: [] for s in schedules}
    warm_passes: list[tuple[float, CostModel]] = []  # (batch work, cost) per warm-up pass
    pool = CalibrationSamples()  # the passes of counted rounds: the time the replays ran in
    grad_diffs, round_work = [], []
    for r in range(int(config.warmup) + int(config.rounds)):
        if r == int(config.warmup) and r > 0:
            # Re-balance at the replays' speed: this VM runs the learner ~8% faster in
            # the stop-and-go rhythm of replays than in back-to-back passes (realized
            # balance 0.92 when scaled at start). By the median warm-up pass: the first
            # seconds after compiling can run slower still.
            _, median_cost = sorted(warm_passes, key=lambda p: p[0])[len(warm_passes) // 2]
            trace = sim.balance(trace, median_cost, float(config.balance), mct)
            items = workload.work_items(trace, learner.vocab_size, seed)
        order = schedules[r % len(schedules) :] + schedules[: r % len(schedules)]
        grads = {}
        for i, s in enumerate(order):
            step_samples = calibration(1, items)
            step_cost, _ = fit_cost(step_samples, learner.seq_buckets)
            # The same batch's work priced by each pass: its spread is how much the
            # machine's own speed moves, a floor under any prediction error.
            round_work.append(sim.simulate(trace, "sync", step_cost, mct).learner_work_s)
            res = replay_step(
                learner, items, s, num_groups, group_size, mct, advance=i == len(order) - 1
            )
            grads[s] = res.grads
            if r < config.warmup:
                warm_passes.append((round_work[-1], step_cost))
            else:
                pool.extend(step_samples)
                measured[s].append(res)
                paired[s].append(sim.simulate(trace, s, step_cost, mct))
            log.info("seed %d round %d %s: %.3f s", seed, r, s, res.step_time_s)
        grad_diffs += [rel_diff(grads[s], grads[schedules[0]]) for s in schedules[1:]]
    rounds = _Rounds(measured, paired, pool, grad_diffs, round_work)
    return _seed_summary(learner, config, trace, clipped, cost, rounds)


class _Rounds(NamedTuple):
    """What the counted rounds of one seed measured (see `_run_seed`)."""

    measured: dict
    paired: dict
    pool: CalibrationSamples
    grad_diffs: list
    round_work: list


def _seed_summary(learner: BenchLearner, config, trace, clipped, cost, rounds: _Rounds) -> dict:
    """One seed's figures: the measured rounds against the predictions (pooled and paired)."""
    mct, schedules = int(config.max_chunk_tokens), list(config.schedules)
    measured, paired, pool = rounds.measured, rounds.paired, rounds.pool
    grad_diffs, round_work = rounds.grad_diffs, rounds.round_work
    pooled, table = fit_cost(pool, learner.seq_buckets)
    simulated = {*schedules, "sync", "async"}
    at_start = {s: sim.simulate(trace, s, cost, mct) for s in simulated}
    predicted = {s: sim.simulate(trace, s, pooled, mct) for s in simulated}
    out = {
        "rollout_span_s": at_start["sync"].rollout_span_s,
        "learner_work_s": at_start["sync"].learner_work_s,
        # The balance the counted replays ran at: their passes' work over the span.
        "realized_balance": predicted["sync"].learner_work_s / at_start["sync"].rollout_span_s,
        "clipped_lengths": clipped,
        "num_trajectories": len(trace),
        "max_grad_rel_diff": max(grad_diffs, default=0.0),
        "passes_calibrated_work_s": round_work,
        "calibration_spread": (max(round_work) - min(round_work)) / statistics.median(round_work),
        "cost_model": _cost_dict(pooled),
        "calibration": table,
        "schedules": {},
        "predicted_async_step_time_s": predicted["async"].step_time_s,
    }
    for s in schedules:
        rs, pred = measured[s], predicted[s]
        out["schedules"][s] = schedule_summary(
            rs, pred, paired[s], at_start[s],
            sim.simulate(trace, s, pooled.affine(), mct).step_time_s,
        )  # fmt: skip
    return out


def _cost_dict(cost: CostModel) -> dict:
    return {
        "fixed_s": cost.fixed_s,
        "per_token_s": cost.per_token_s,
        "opt_s": cost.opt_s,
        "shape_s": [list(x) for x in cost.shape_s],
        "buckets": list(cost.buckets),
        "row_padding": cost.row_padding,
    }


def _summarize(per_seed: list[dict], schedules: Sequence[str]) -> dict:
    keys = (
        "step_time_s",
        "predicted_step_time_s",
        "predicted_paired_step_time_s",
        "predicted_at_start_step_time_s",
        "predicted_affine_step_time_s",
        "learner_idle_frac",
        "predicted_learner_idle_frac",
        "tail_s",
        "predicted_tail_s",
    )
    out = {}
    for s in schedules:
        row = {k: float(np.mean([p["schedules"][s][k] for p in per_seed])) for k in keys}
        row["predicted_error"] = row["step_time_s"] / row["predicted_step_time_s"] - 1.0
        row["predicted_paired_error"] = (
            row["step_time_s"] / row["predicted_paired_step_time_s"] - 1.0
        )
        row["predicted_affine_error"] = (
            row["step_time_s"] / row["predicted_affine_step_time_s"] - 1.0
        )
        out[s] = row
    if "sync" in out:
        for row in out.values():
            row["speedup_vs_sync"] = out["sync"]["step_time_s"] / row["step_time_s"]
            row["predicted_speedup_vs_sync"] = (
                out["sync"]["predicted_step_time_s"] / row["predicted_step_time_s"]
            )
    return out


def run_benchmark(
    config: ml_collections.ConfigDict,
    workdir: str | None = None,
    learner: BenchLearner | None = None,
) -> dict:
    """Calibrates, replays every seed's workload under every schedule, writes DIR/bench.json.

    Args:
      config: a configs/bench_cpu.py config.
      workdir: where bench.json goes; None writes nothing.
      learner: a learner to reuse (a sweep keeps its compiled functions); built if None.
    Returns:
      the bench.json content.
    """
    for s in config.schedules:
        if s not in MEASURED:
            raise ValueError(f"schedules={tuple(config.schedules)}: {s!r} is not one of {MEASURED}")
    if int(config.rounds) < 1 or int(config.warmup) < 0 or not config.seeds:
        raise ValueError(
            f"rounds={config.rounds} must be >= 1, warmup={config.warmup} >= 0, seeds non-empty"
        )
    algorithm = config.algorithm
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not valid; choose one of {ALGORITHMS}")
    learner = learner or learner_from_config(config)
    run_seed = run_opd_seed if algorithm == "opd" else _run_seed
    with frozen_heap():  # cheap collections between timed passes (see _gc.py)
        per_seed = [run_seed(learner, config, int(seed)) for seed in config.seeds]
    summary = _summarize(per_seed, list(config.schedules))
    if algorithm == "opd":  # the learner granularity each schedule ran at, per seed
        for s, row in summary.items():
            row["granularity"] = [p["granularity"][s] for p in per_seed]
    result = {
        "algorithm": algorithm,
        "schedules": summary,
        "predicted_async_step_time_s": float(
            np.mean([p["predicted_async_step_time_s"] for p in per_seed])
        ),
        "calibration_spread": float(np.mean([p["calibration_spread"] for p in per_seed])),
        "per_seed": dict(zip((str(s) for s in config.seeds), per_seed, strict=True)),
        "config": config.to_dict(),
    }
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, BENCH_FILE), "w") as f:
            json.dump(result, f, indent=2, default=list)
    return result


def format_table(result: dict) -> str:
    """A plain-text summary of bench.json's schedules."""
    lines = [
        f"{'schedule':8s} {'step_s':>8s} {'pred_s':>8s} {'err':>7s} {'err_pair':>8s} "
        f"{'err_lin':>7s} {'speedup':>8s} {'pred_x':>7s} {'idle':>6s} {'tail_s':>7s}"
    ]
    for s, row in result["schedules"].items():
        lines.append(
            f"{s:8s} {row['step_time_s']:8.3f} {row['predicted_step_time_s']:8.3f} "
            f"{100 * row['predicted_error']:+6.1f}% {100 * row['predicted_paired_error']:+7.1f}% "
            f"{100 * row['predicted_affine_error']:+6.1f}% "
            f"{row.get('speedup_vs_sync', 1.0):8.2f} "
            f"{row.get('predicted_speedup_vs_sync', 1.0):7.2f} {row['learner_idle_frac']:6.3f} "
            f"{row['tail_s']:7.3f}"
            + (f" {'/'.join(row['granularity'])}" if "granularity" in row else "")
        )
    if "calibration_spread" in result:
        lines.append(
            f"machine noise: the same batch's learner work, timed before each replay, spread "
            f"{100 * result['calibration_spread']:.1f}% (max - min over median)"
        )
    return "\n".join(lines)
