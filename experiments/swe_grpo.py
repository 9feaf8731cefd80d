r"""GRPO on SWE-bench-format tasks with gradient streaming.

    python -m experiments.swe_grpo --config=configs/cpu.py --workdir=runs/cpu \
        [--config.schedule=stream] [--config.num_steps=N] [--config.seed=S]

Writes DIR/metrics.jsonl, DIR/checkpoints/, DIR/final/ (HF safetensors) and
timeline pictures; rerunning the same command after a crash resumes.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from thundersync_jax.learner import dry_run
from thundersync_jax.schedule import trainer

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/swe_grpo", "Output directory (resumes if present).")


_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Compile the learner on fake CPU devices shaped like config.mesh, print "
    "per-device GB and exit (0 when the memory planner says it fits); no engine starts.",
)


def main(argv):
    del argv
    if _DRY_RUN.value:
        sys.exit(dry_run.main(_CONFIG.value))
    trainer.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
