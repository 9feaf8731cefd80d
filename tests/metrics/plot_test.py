"""Timeline figure: a PNG of the expected size is written, for small and large batches."""

import struct

import pytest

from thundersync_jax import metrics, sim
from thundersync_jax.sim import timelines


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("num_groups,group_size", [(3, 4), (16, 8)])
def test_plot_writes_png(tmp_path, num_groups, group_size):
    trace = sim.lognormal_trace(num_groups, group_size, 0.8, 0.3, 30.0, seed=0)
    cost = sim.CostModel(0.5, 0.004, opt_s=2.0, pub_s=1.0, buckets=(512, 1024, 2048))
    trace = sim.balance(trace, cost, 1.0, 4096)
    result = sim.simulate(trace, "stream", cost, 4096)
    tl = timelines.timeline_from_sim(trace, result)
    path = tmp_path / "timeline.png"
    out = metrics.plot_timeline(tl, path, command="python -m experiments.bench_schedules")
    assert out == str(path)
    width, height = _png_size(path)
    assert width == 12 * 120
    assert 400 <= height <= 16 * 120
    assert path.stat().st_size > 10_000  # bars, labels and legend were drawn


def test_plot_of_a_timeline_without_publish(tmp_path):
    tl = metrics.Timeline(start_s=0.0, schedule="sync")
    tl.record("rollout", 0.0, 1.0, traj_id=0, group=0, member=0)
    path = tmp_path / "partial.png"
    metrics.plot_timeline(tl, path, title="partial step")
    assert _png_size(path)[0] == 12 * 120


def test_plot_of_chunks_without_a_reason(tmp_path):
    # The orchestrator may record chunks with only group and ids.
    tl = metrics.Timeline(start_s=0.0, schedule="stream")
    tl.record("rollout", 0.0, 1.0, traj_id="g0m0", group=0, member=0, tokens=3, reward=1.0)
    tl.record("chunk", 1.0, 2.0, group=0, ids=["g0m0"], tokens=3)
    tl.record("opt", 2.0, 2.5)
    tl.record("publish", 2.5, 3.0)
    path = tmp_path / "no_reason.png"
    metrics.plot_timeline(tl, path)
    assert _png_size(path)[0] == 12 * 120
