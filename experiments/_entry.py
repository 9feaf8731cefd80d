"""The flags and `main` every training entry point shares (swe_grpo, terminal_opd).

An entry point names its algorithm and default workdir; `--config`, `--workdir` and
`--dry_run` mean the same in each.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from thundersync_jax import train
from thundersync_jax.learner import dry_run


def run_entry_point(algorithm: str, default_workdir: str) -> None:
    """Defines the flags and runs `train.run` for `algorithm` (or the dry run) under absl."""
    config = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
    workdir = flags.DEFINE_string(
        "workdir", default_workdir, "Output directory (resumes if present)."
    )
    dry = flags.DEFINE_bool(
        "dry_run",
        False,
        "Compile the learner on fake CPU devices shaped like config.mesh, print "
        "per-device GB and exit (0 when the memory planner says it fits); no engine starts.",
    )

    def main(argv):
        del argv
        if dry.value:
            sys.exit(dry_run.main(config.value))
        train.run(config.value, workdir.value, entry_algorithm=algorithm)

    flags.mark_flags_as_required(["config"])
    app.run(main)
