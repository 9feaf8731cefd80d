"""Calibration passes vs replays: all arrived, all at the span, the real trickle (BENCHMARKS.md,
"Schedules and the predictor"). Run from the repository root:
PYTHONPATH=. python bench/scripts/calibration_on_arrivals.py"""

import numpy as np

from configs import bench_cpu
from thundersync_jax import sim
from thundersync_jax.bench import schedules as bench
from thundersync_jax.bench.schedules import _opd_run

c = bench_cpu.get_config("opd")
learner = bench.learner_from_config(c)
trace = _opd_run._trace(c, 1)
start = _opd_run.OpdSamples()
for _ in range(3):
    start.extend(_opd_run.calibration_pass(learner, trace, "trajectory", 1))
trace = sim.balance_opd(trace, start.cost(learner), 1.0, "trajectory")
span = max(t.arrival_s for t in trace)
variants = {
    "all arrived": [t._replace(arrival_s=0.0) for t in trace],
    "all at span": [t._replace(arrival_s=span) for t in trace],
    "trickle": trace,
}
sums = {k: [] for k in variants}
for _ in range(8):
    for k, tr in variants.items():
        res = _opd_run._replay(
            learner, tr, _opd_run._items(learner, tr, 1), "sync", "trajectory", False
        )
        sums[k].append(float(np.diff([ch[3] for ch in res.chunks]).sum()))
print({k: float(np.median(v)) for k, v in sums.items()})
