"""metrics.jsonl writer: content, strict JSON, crash safety, TensorBoard scalars."""

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from thundersync_jax import metrics


def test_one_json_object_per_step(tmp_path):
    with metrics.MetricsWriter(tmp_path) as w:
        w.write(0, {"step_time_s": np.float32(1.5), "tokens": np.int64(7), "note": "ok"})
        rec = w.write(1, {"reward_mean": float("nan"), "learner_idle_frac": 0.25})
    assert rec == {"step": 1, "reward_mean": None, "learner_idle_frac": 0.25}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 0, "step_time_s": 1.5, "tokens": 7, "note": "ok"},
        {"step": 1, "reward_mean": None, "learner_idle_frac": 0.25},
    ]
    assert "NaN" not in lines[1]  # strict JSON
    assert metrics.read_metrics(tmp_path) == [json.loads(x) for x in lines]


def test_appends_across_writers_and_rejects_misuse(tmp_path):
    with metrics.MetricsWriter(tmp_path) as w:
        w.write(0, {"a": 1})
    with metrics.MetricsWriter(tmp_path) as w:
        w.write(1, {"a": 2})
        with pytest.raises(ValueError, match="disagrees with step=2"):
            w.write(2, {"step": 3})
        with pytest.raises(TypeError, match="metric 'bad'"):
            w.write(2, {"bad": object()})
    assert [r["a"] for r in metrics.read_metrics(tmp_path)] == [1, 2]
    with pytest.raises(ValueError, match="closed"):
        w.write(3, {})


def test_a_killed_process_leaves_every_written_line_complete(tmp_path):
    # The child writes 5 steps and then SIGKILLs itself: no atexit, no buffered flush.
    # A writer that did not flush each line would leave the file short or cut mid-line.
    script = textwrap.dedent(
        f"""
        import os, signal
        from thundersync_jax.metrics import MetricsWriter
        w = MetricsWriter({str(tmp_path)!r})
        for step in range(5):
            w.write(step, {{"step_time_s": step * 1.5, "pad": "x" * 5000}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    assert [r["step_time_s"] for r in map(json.loads, text.splitlines())] == [
        0.0,
        1.5,
        3.0,
        4.5,
        6.0,
    ]


def test_a_partial_last_line_is_ignored_and_dropped_on_reopen(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a')
    assert [r["step"] for r in metrics.read_metrics(path)] == [0, 1]
    with metrics.MetricsWriter(tmp_path) as w:
        w.write(2, {"a": 3})
    assert path.read_text().splitlines() == [
        '{"step": 0, "a": 1}',
        '{"step": 1, "a": 2}',
        '{"step": 2, "a": 3}',
    ]


def _read_scalars(path):
    """(tag, step, value) of every scalar in a TFRecord event file."""
    from tensorboardX.proto import event_pb2

    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4  # length, its crc, payload, payload crc
        out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    with metrics.MetricsWriter(tmp_path, tensorboard=True) as w:
        for step in range(3):
            w.write(step, {"step_time_s": 2.0 + step, "note": "skip me", "tokens": 10 * step})
    (event_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents*")
    assert sorted(_read_scalars(event_file)) == [
        ("step_time_s", 0, 2.0),
        ("step_time_s", 1, 3.0),
        ("step_time_s", 2, 4.0),
        ("tokens", 0, 0.0),
        ("tokens", 1, 10.0),
        ("tokens", 2, 20.0),
    ]
