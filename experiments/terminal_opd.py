r"""On-policy distillation: teacher-scored turns, streamed gradients (`train.run`, opd).

    python -m experiments.terminal_opd --config=configs/terminal_opd_cpu.py --workdir=runs/opd \
        [--config.schedule=sync|group|stream|async] [--config.num_steps=N] [--config.seed=S] \
        [--config.teacher.checkpoint=HF_DIR] [--config.env.family=terminal|mini_swe|swe_jsonl]

Writes DIR/metrics.jsonl (DESIGN §6 names plus reverse_kl), DIR/checkpoints/, DIR/final/
(HF safetensors) and timelines; rerunning the same command after a crash resumes.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from thundersync_jax import train
from thundersync_jax.learner import dry_run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/terminal_opd", "Output directory (resumes).")


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
    train.run(_CONFIG.value, _WORKDIR.value, entry_algorithm="opd")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
