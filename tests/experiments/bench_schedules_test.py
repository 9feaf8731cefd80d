"""The schedule benchmark end to end on a tiny workload: bench.json, sweep outputs, configs."""

import json
import math

import pytest

from configs import bench_cpu
from thundersync_jax.bench import schedules as bench

FIELDS = (
    "step_time_s",
    "predicted_step_time_s",
    "predicted_paired_step_time_s",
    "learner_idle_frac",
    "tail_s",
)


@pytest.fixture(scope="module")
def learner():
    return bench.learner_from_config(bench_cpu.get_config("tiny"))


def test_configs_load():
    for arg in (None, "tiny", "sweep", "opd", "opd_tiny"):
        c = bench_cpu.get_config(arg)
        assert set(c.schedules) <= set(bench.MEASURED)
        assert c.rounds >= 1 and c.seeds
    assert (
        bench_cpu.get_config("opd").algorithm == "opd"
        and bench_cpu.get_config().algorithm == "grpo"
    )
    assert bench_cpu.get_config("sweep").sweep.balances == (0.25, 0.5, 1.0, 2.0, 4.0)
    with pytest.raises(ValueError, match="unknown variant"):
        bench_cpu.get_config("huge")


@pytest.mark.slow
def test_tiny_benchmark_writes_bench_json(tmp_path, learner):
    config = bench_cpu.get_config("tiny")
    config.warmup = 1  # the warm-up round re-balances the trace with its own passes
    bench.run_benchmark(config, str(tmp_path), learner=learner)
    result = json.loads((tmp_path / bench.BENCH_FILE).read_text())
    assert set(result["schedules"]) == {"sync", "group", "stream"}
    assert result["config"]["num_groups"] == config.num_groups
    for name, row in result["schedules"].items():
        for key in FIELDS:
            assert math.isfinite(row[key]) and row[key] >= 0, (name, key, row[key])
        assert 0.0 <= row["learner_idle_frac"] < 1.0
        # Loose: a seconds-long run on a shared CI box is dominated by timer noise.
        assert 0.4 < row["step_time_s"] / row["predicted_step_time_s"] < 2.5, (name, row)
    seed = result["per_seed"]["0"]
    assert seed["num_trajectories"] == config.num_groups * config.group_size
    # Every schedule computed the same update (float32 summation order only).
    assert seed["max_grad_rel_diff"] < 1e-4
    passes = (config.warmup + config.rounds) * len(config.schedules)
    assert len(seed["passes_calibrated_work_s"]) == passes and result["calibration_spread"] >= 0
    assert "machine noise" in bench.format_table(result)
    assert 0.2 < seed["realized_balance"] / config.balance < 5.0
    # The sync step includes the whole rollout span: nothing can start before it ends.
    assert result["schedules"]["sync"]["step_time_s"] >= seed["rollout_span_s"]


@pytest.mark.slow
def test_sweep_writes_table_and_plot(tmp_path, learner):
    config = bench_cpu.get_config("tiny")
    config.sweep.balances = (0.5, 2.0)
    config.sweep.sigmas = (1.0,)
    config.sweep.group_iccs = (0.3,)
    points = bench.run_sweep(config, str(tmp_path), command="CMD", learner=learner)
    assert [p["balance"] for p in points] == [0.5, 2.0]
    table = (tmp_path / "sweep.md").read_text()
    assert table.startswith("Command: `CMD`") and table.count("\n| 0.5 |") == 1
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert len(json.loads((tmp_path / "sweep.json").read_text())["runs"]) == 2


def test_sweep_table_formats_points():
    point = {"balance": 1.0, "sigma": 1.5, "group_icc": 0.3, "stream_idle": 0.02}
    for s, (speedup, err) in {
        "sync": (1.0, 0.01),
        "group": (1.7, -0.02),
        "stream": (1.9, 0.0),
    }.items():
        point[f"{s}_error"] = err
        point[f"{s}_affine_error"] = 3 * err
        point[f"{s}_speedup"] = point[f"{s}_predicted_speedup"] = speedup
    table = bench.sweep_table([point], "python -m x")
    assert "| 1 | 1.5 | 0.3 | 1.90 / 1.90 | 1.70 / 1.70 | +1.0% / -2.0% / +0.0% | 0.020 |" in table
    assert "mean 1.0%, largest 2.0% (per-shape cost table)" in table
    assert "fixed + per-token line: mean 3.0%, largest 6.0%." in table


def test_stall_free_mean_keeps_the_slow_side_but_not_stalls():
    from thundersync_jax.bench.schedules._learner import stall_free_mean

    # 1.9 (slow, kept) moves the mean, unlike an interquartile mean; 40 (a stall) is dropped.
    assert stall_free_mean([1.0, 1.0, 1.0, 1.9, 40.0]) == pytest.approx(4.9 / 4)
    assert stall_free_mean([2.0]) == 2.0
    with pytest.raises(ValueError, match="no timing samples"):
        stall_free_mean([])
