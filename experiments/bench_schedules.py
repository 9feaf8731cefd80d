r"""Schedule benchmark: sync / group / stream on one replayed workload, measured vs predicted.

    python -m experiments.bench_schedules --config=configs/bench_cpu.py --workdir=DIR \
        [--config.sigma=1.5] [--config.group_icc=0.3] [--config.balance=1.0]
    python -m experiments.bench_schedules --config=configs/bench_cpu.py:sweep --workdir=DIR
    python -m experiments.bench_schedules --config=configs/bench_cpu.py:opd --workdir=DIR \
        [--config.turns_sigma=1.0] [--config.sigma=1.0] [--config.opd.mean_turns=6]

Writes DIR/bench.json (see thundersync_jax.bench.schedules) and prints a table; the
`sweep` variant writes DIR/sweep.json, DIR/sweep.md and DIR/sweep.png.
"""

import logging

from absl import app, flags
from ml_collections import config_flags

from thundersync_jax.bench import schedules as bench

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/bench_schedules", "Output directory.")


def main(argv):
    del argv
    logging.getLogger("thundersync_jax").setLevel(logging.INFO)
    config = _CONFIG.value
    if config.sweep.balances:
        bench.run_sweep(config, _WORKDIR.value)
    else:
        print(bench.format_table(bench.run_benchmark(config, _WORKDIR.value)))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
