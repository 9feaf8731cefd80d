"""The OPD schedule benchmark on a tiny multi-turn trace: real learner work, predictor output."""

import collections
import json
import math

import pytest

from configs import bench_cpu
from thundersync_jax import sim
from thundersync_jax.bench import schedules as bench
from thundersync_jax.bench.schedules import _opd_run
from thundersync_jax.bench.schedules._replay import rel_diff


@pytest.fixture(scope="module")
def setup():
    config = bench_cpu.get_config("opd_tiny")
    return config, bench.learner_from_config(config)


@pytest.mark.slow
def test_segment_calls_are_what_the_learner_runs_and_granularities_agree(setup):
    config, learner = setup
    trace = _opd_run._trace(config, seed=0)
    assert max(len(v) for v in sim.trajectories(trace).values()) > 1  # really multi-turn
    samples = _opd_run.calibration_pass(learner, trace, "turn", seed=0)
    want = collections.Counter(
        key
        for turns in sim.trajectories(trace).values()
        for calls in sim.segment_calls(turns, learner.fns.seg_buckets, learner.fns.cache_buckets)
        for key in calls
    )
    assert want  # every key the predictor prices: direct passes and sweep blocks
    # The predictor's call list is exactly the segment programs the real learner ran.
    assert collections.Counter(key for key, _ in learner.calls) == want
    assert samples.opt and samples.overhead and set(samples.calls) == set(want)
    grads = {}
    items = _opd_run._items(learner, trace, seed=0)
    for g in sim.GRANULARITIES:  # the training loop's OPD learner at each granularity
        grads[g] = _opd_run._replay(learner, trace, items, "stream", g, advance=False).grads
    # Per-turn segments (direct passes + sweeps) give the one-shot update.
    assert rel_diff(grads["turn"], grads["trajectory"]) < 1e-5


@pytest.mark.slow
def test_opd_benchmark_writes_predictions(tmp_path, setup):
    config, learner = setup
    result = bench.run_benchmark(config, str(tmp_path), learner=learner)
    on_disk = json.loads((tmp_path / bench.BENCH_FILE).read_text())
    assert on_disk["algorithm"] == "opd" and set(on_disk["schedules"]) == set(config.schedules)
    seed = result["per_seed"]["0"]
    for name, row in result["schedules"].items():
        for key in ("step_time_s", "predicted_step_time_s", "predicted_paired_step_time_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row)
        assert row["granularity"][0] in sim.GRANULARITIES
        by_g = seed["predicted_step_time_by_granularity_s"][name]
        assert set(by_g) == set(sim.GRANULARITIES)
    assert seed["num_turns"] > seed["num_trajectories"] == config.num_groups * config.group_size
    assert seed["max_grad_rel_diff"] < 1e-4  # every schedule's update is the same
    assert result["schedules"]["sync"]["step_time_s"] >= seed["rollout_span_s"]
    assert "granularity" not in bench.format_table(result).splitlines()[0]


def test_deterministic_is_refused_for_the_opd_bench():
    """`deterministic` measures GRPO's exact tallies; the OPD bench learner has none."""
    config = bench_cpu.get_config("opd_tiny")
    config.deterministic = True
    with pytest.raises(ValueError, match="deterministic=True needs algorithm='grpo'"):
        bench.learner_from_config(config)
