"""Per-step metrics: one JSON object per line in metrics.jsonl, durable line by line."""

from __future__ import annotations

import json
import math
import numbers
import os
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _json_value(key: str, value: Any) -> Any:
    """A strict-JSON version of a metric value (numpy/jax scalars → Python, NaN/inf → null)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy / jax scalar
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_value(key, v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(f"{key}.{k}", v) for k, v in value.items()}
    raise TypeError(f"metric {key!r}: {type(value).__name__} is not a JSON-able scalar")


def _drop_partial_tail(path: str) -> int:
    """Truncates a last line without its newline (a crash mid-write); returns bytes dropped."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Scan back for the last complete line; metric lines are short, so read in blocks.
        pos = size
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            pos = start
        else:
            keep = 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


class MetricsWriter:
    """Appends one JSON object per step to `workdir/metrics.jsonl`.

    Each line is written with one write call, then flushed and fsynced, so a
    crash loses at most the step being written and never damages earlier lines;
    a partial last line left by a crash is dropped when the file is reopened.
    Non-finite floats are stored as null (strict JSON). With
    `tensorboard=True` every numeric metric is also a TensorBoard scalar under
    `workdir/tensorboard` (tensorboardX).
    """

    def __init__(self, workdir: str | os.PathLike, tensorboard: bool = False):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, METRICS_FILE)
        _drop_partial_tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # optional dependency, imported on use

            self._tb = SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Writes one step's metrics durably; returns the record as written."""
        if self._file.closed:
            raise ValueError(f"MetricsWriter for {self.path} is closed")
        if "step" in metrics and int(metrics["step"]) != int(step):
            raise ValueError(f"metrics['step']={metrics['step']} disagrees with step={step}")
        record = {"step": int(step)}
        record.update({k: _json_value(k, v) for k, v in metrics.items() if k != "step"})
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        return record

    def close(self) -> None:
        """Closes the file (and the TensorBoard writer)."""
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads metrics.jsonl (or a workdir holding one) into a list of dicts, in order.

    A last line without its newline (a crash mid-write) is ignored.
    """
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
