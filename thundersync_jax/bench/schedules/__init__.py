"""Schedule benchmark: a recorded or synthetic trace replayed onto the real learner.

    from thundersync_jax.bench import schedules as bench
    result = bench.run_benchmark(config, workdir)      # configs/bench_cpu.py; writes bench.json
    points = bench.run_sweep(config, workdir)          # the `sweep` variant's grid

With `algorithm="opd"` (configs/bench_cpu.py:opd) the trace is multi-turn (`sim.opd_trace`)
and the learner is the loop's OPD batch learner, per turn (segments) or per trajectory;
`sim.simulate_opd` predicts it (`_opd_run.py`).

Rollouts are replayed from a trace by a sleeping thread (standing in for rollout
hardware separate from the learner); the learner work is real: score-gradient
chunks of a tiny Qwen3 policy, the streaming GRPO accumulator, the training run's
own planner and learner loop, and an optax step. `sim.simulate`, with a cost
model calibrated on the same learner (calibration passes interleaved with the
replays, pooled; see `_run.py`), predicts every schedule's step time. Timed
passes run with the cyclic garbage collector off (`_gc.py`). Kept out of
`thundersync_jax.sim` so the simulator itself imports no JAX.
"""

from thundersync_jax.bench.schedules._learner import BenchLearner, learner_from_config
from thundersync_jax.bench.schedules._replay import RoundResult, replay_step
from thundersync_jax.bench.schedules._run import BENCH_FILE, MEASURED, format_table, run_benchmark
from thundersync_jax.bench.schedules._sweep import run_sweep, sweep_plot, sweep_table

__all__ = [
    "BENCH_FILE",
    "MEASURED",
    "BenchLearner",
    "RoundResult",
    "format_table",
    "learner_from_config",
    "replay_step",
    "run_benchmark",
    "run_sweep",
    "sweep_plot",
    "sweep_table",
]
