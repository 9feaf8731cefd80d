"""Where a run's files go: its log, and the metric lines a resumed run must not repeat."""

from __future__ import annotations

import json
import logging
import os
import sys

from thundersync_jax import metrics


def configure_logging(workdir: str) -> None:
    """INFO to workdir/train.log and WARNING+ to stderr (the progress bar owns stdout)."""
    root = logging.getLogger("thundersync_jax")
    if any(getattr(h, "_tsj_workdir", None) == workdir for h in root.handlers):
        return
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(os.path.join(workdir, "train.log"))
    fh.setFormatter(fmt)
    fh._tsj_workdir = workdir  # type: ignore[attr-defined]
    sh = logging.StreamHandler(sys.stderr)
    sh.setLevel(logging.WARNING)
    sh.setFormatter(fmt)
    root.addHandler(fh)
    root.addHandler(sh)
    root.setLevel(logging.INFO)


def trim_metrics(workdir: str, first_step: int) -> None:
    """Drops metric lines of steps that a resumed run will redo (no duplicates after a crash)."""
    path = os.path.join(workdir, metrics.METRICS_FILE)
    if not os.path.exists(path):
        return
    keep = [m for m in metrics.read_metrics(path) if int(m["step"]) < first_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for m in keep:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, path)
