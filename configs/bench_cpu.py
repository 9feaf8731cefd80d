r"""Schedule benchmark on 2 CPU cores: a replayed rollout trace, real tiny-Qwen3 learner work.

Command:

    python -m experiments.bench_schedules --config=configs/bench_cpu.py --workdir=runs/bench

What to expect (default: lognormal trace, sigma 1.5, group_icc 0.3, balance 1,
16 groups x 8, seeds 0 and 1, 21 counted rounds after 2 warm-up; about 5 min):
DIR/bench.json with, per schedule, the measured and predicted step time, learner
idle fraction and tail, the realized balance and the machine-noise spread.
Measured on the idle 2-core dev VM (session 4, eighteen runs with the trace
keys varied): stream 1.80-2.01x faster per step than sync, group in between,
every schedule predicted within 3% in sixteen (the misses: stream +4.8% at 11
rounds, -4.3% in the default run), on a VM whose own speed moved 30-57%
between passes seconds apart (see BENCHMARKS.md).

Variants (`--config=configs/bench_cpu.py:VARIANT`):
  tiny      seconds-long smoke run (tests): 4 groups x 2, one round, one seed
  sweep     balance x sigma x group_icc grid (~15 min): DIR/sweep.{json,md,png}
  opd       multi-turn OPD (issue 14): 8 groups x 4 trajectories, ~6 turns each with a
            heavy tail, 24-token turns, the loop's OPD learner per turn (segments) or per
            trajectory, chosen per schedule by the predictor (`opd.granularity="auto"`)
  opd_tiny  the same in seconds (tests)

Keys: trace ("lognormal" or a JSONL trace written by a training run, e.g.
DIR/traces/arrivals.jsonl, with trace_step picking the step, -1 the last);
balance (calibrated learner work / rollout span; arrival times are rescaled);
sigma, group_icc, num_groups, group_size, mean_tokens (lognormal trace only);
rounds (counted), warmup (dropped), seeds (one workload each); seq_buckets
(score-gradient shapes; longer trajectories are clipped); max_chunk_tokens
(the planner's packing budget); calibration_reps; deterministic (exact tallies,
`rl.deterministic`; GRPO only).
OPD keys: algorithm ("grpo" | "opd"); turns_sigma (spread of log turn counts); mean_tokens is
then per turn; sigma / group_icc shape the turn durations (generation + tool); opd.mean_turns,
opd.granularity ("turn" | "trajectory" | "auto"), opd.seg_buckets, opd.cache_buckets (the
segment learner's padding; trajectories are capped at the largest cache bucket);
calibrate_on_arrivals (counted rounds' passes see the turns arrive at their trace times).
Measured (idle VM, `opd` with the defaults and two other trace shapes): stream 1.87-1.94x
sync, every schedule predicted within 3% (BENCHMARKS.md, "Schedules and the predictor").
"""

from __future__ import annotations

import ml_collections

from configs.common import get_base_config, tiny_qwen3_model


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    base = get_base_config()
    c = ml_collections.ConfigDict()
    c.model = tiny_qwen3_model()
    c.optim = base.optim
    c.trace = "lognormal"
    c.trace_step = -1
    c.balance = 1.0
    c.sigma = 1.5
    c.group_icc = 0.3
    c.num_groups = 16
    c.group_size = 8
    c.mean_tokens = 96
    c.rounds = 21  # medians over 21: the VM's own speed moves 30-55% between passes
    c.warmup = 2  # dropped; their calibration passes re-balance the trace
    c.seeds = (0, 1)
    c.schedules = ("sync", "group", "stream")
    c.seq_buckets = (64, 128, 256)
    # One trajectory per chunk: on CPU a chunk's fixed cost is ~0, so packing rows would
    # only add padding (rows to a power of two, lengths to the longest). Raise it to pack.
    c.max_chunk_tokens = 1
    c.calibration_reps = 7
    # OPD: time the counted rounds' calibration passes with the turns arriving at their trace
    # times (as a real sync step sees them), not all handed over at once (see _opd_run).
    c.calibrate_on_arrivals = True
    c.deterministic = False  # rl.deterministic's exact tallies (issue 16's cost measurement)
    c.algorithm = "grpo"  # or "opd" (the `opd` variant): multi-turn traces, segment learner
    c.turns_sigma = 1.0  # OPD: spread of log turn counts (heavy tail)
    c.opd = ml_collections.ConfigDict(
        dict(
            mean_turns=6.0,
            granularity="auto",  # "turn" | "trajectory" | "auto" (per schedule, by prediction)
            seg_buckets=(16, 32, 64),
            cache_buckets=(64, 128, 256),
        )
    )
    c.sweep = ml_collections.ConfigDict(dict(balances=(), sigmas=(0.5, 1.5), group_iccs=(0.0, 0.6)))
    if arg == "tiny":
        c.num_groups = 4
        c.group_size = 2
        c.mean_tokens = 16
        c.seq_buckets = (16, 32)  # the cost fit needs two padded sizes
        c.rounds = 1
        c.warmup = 0
        c.seeds = (0,)
        c.calibration_reps = 2
    elif arg == "sweep":
        c.sweep.balances = (0.25, 0.5, 1.0, 2.0, 4.0)
        c.num_groups = 10  # 20 grid points in ~15 min (862 s measured, session 4)
        c.rounds = 3
        c.warmup = 1  # re-balances the trace at the replays' speed (see bench/schedules/_run.py)
        c.seeds = (0, 1)
        c.calibration_reps = 3
    elif arg in ("opd", "opd_tiny"):
        c.algorithm = "opd"
        c.mean_tokens = 24  # per turn (segment: tool output + response, half scored)
        c.num_groups = 8
        c.group_size = 4
        c.rounds = 9
        c.calibration_reps = 3
        if arg == "opd_tiny":
            c.num_groups, c.group_size = 2, 2
            c.mean_tokens = 8
            c.opd.mean_turns = 3.0
            c.opd.seg_buckets = (8, 16)
            c.opd.cache_buckets = (16, 32, 64)
            c.seq_buckets = (32, 64)
            c.rounds, c.warmup, c.seeds, c.calibration_reps = 1, 0, (0,), 1
    elif arg not in (None, ""):
        raise ValueError(
            f"configs/bench_cpu.py: unknown variant {arg!r}; valid: tiny, sweep, opd, opd_tiny"
        )
    return c
