"""The benchmark's calibration: timed samples, their cost model, and the garbage collector."""

import gc

import pytest

from configs import bench_cpu
from thundersync_jax.bench import schedules as bench
from thundersync_jax.bench.schedules import _workload as workload
from thundersync_jax.bench.schedules._gc import collector_paused, frozen_heap
from thundersync_jax.bench.schedules._learner import CalibrationSamples, fit_cost, stall_free_mean
from thundersync_jax.bench.schedules._replay import calibration_pass


def test_fit_cost_prices_each_shape_by_its_stall_free_mean():
    samples = CalibrationSamples()
    for t in (1.0, 1.0, 1.2, 9.0):  # 9.0 is a stall (> 4 medians): left out
        samples.add_chunk(1, 16, t)
    for t in (2.0, 2.2):
        samples.add_chunk(1, 32, t)
    samples.opt += [0.5, 0.1, 0.2]
    cost, table = fit_cost(samples, (16, 32))
    assert cost.chunk_cost([10]) == pytest.approx(3.2 / 3)
    assert cost.chunk_cost([20]) == pytest.approx(2.1)
    assert cost.opt_s == pytest.approx(0.2)  # the median
    assert [(r["rows"], r["length"], r["samples"]) for r in table] == [(1, 16, 4), (1, 32, 2)]
    # The fallback line runs through the two means.
    line = cost.affine()
    assert line.chunk_cost([10]) == pytest.approx(3.2 / 3)
    assert line.chunk_cost([20]) == pytest.approx(2.1)
    with pytest.raises(ValueError, match="no timed optimizer step"):
        fit_cost(CalibrationSamples(chunks=samples.chunks), (16, 32))


def test_samples_pool():
    a, b = CalibrationSamples(), CalibrationSamples()
    a.add_chunk(1, 16, 1.0)
    b.add_chunk(1, 16, 3.0)
    b.add_chunk(2, 32, 5.0)
    b.opt.append(0.1)
    a.extend(b)
    assert a.chunks == {(1, 16): [1.0, 3.0], (2, 32): [5.0]} and a.opt == [0.1]
    assert stall_free_mean(a.chunks[(1, 16)]) == 2.0


def test_collector_paused_restores_the_collector_state():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the block fails")
    assert gc.isenabled()


def test_frozen_heap_unfreezes():
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


@pytest.fixture(scope="module")
def tiny():
    config = bench_cpu.get_config("tiny")
    learner = bench.learner_from_config(config)
    trace = bench._run._seed_trace(config, 0)
    trace, _ = workload.fit_lengths(trace, learner.seq_buckets[-1])
    items = workload.work_items(trace, learner.vocab_size, 0)
    learner.time_shapes(config.num_groups, config.group_size, 1, 1)  # compiles every shape
    return config, learner, items


# in make test, not test-quick: one of the unit tier's slowest (a calibration pass)
@pytest.mark.slow
def test_calibration_pass_times_every_chunk_of_the_batch_with_the_collector_off(tiny):
    config, learner, items = tiny
    seen = []
    process = learner.process

    def recording(batch, chunk):
        seen.append(gc.isenabled())
        return process(batch, chunk)

    learner.process = recording
    try:
        samples = calibration_pass(learner, items, config.num_groups, config.group_size, 1)
    finally:
        del learner.process
    assert len(seen) == len(items) and not any(seen)  # one trajectory a chunk, collector off
    assert sum(len(ts) for ts in samples.chunks.values()) == len(items)
    expected = {learner.padded_shape(1, it.num_tokens) for it in items}
    assert set(samples.chunks) == expected
    assert len(samples.opt) == 1 and samples.opt[0] > 0
    assert all(t > 0 for ts in samples.chunks.values() for t in ts)
