r"""GRPO with gradient streaming: `thundersync_jax.train.run` for rl.algorithm=grpo.

    python -m experiments.swe_grpo --config=configs/cpu.py --workdir=runs/cpu \
        [--config.schedule=sync|group|stream|async] [--config.num_steps=N] [--config.seed=S] \
        [--config.env.family=mini_swe|swe_jsonl|terminal]

Writes DIR/metrics.jsonl, DIR/checkpoints/, DIR/final/ (HF safetensors) and
timeline pictures; rerunning the same command after a crash resumes.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from thundersync_jax import train
from thundersync_jax.learner import dry_run

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
    train.run(_CONFIG.value, _WORKDIR.value, entry_algorithm="grpo")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
