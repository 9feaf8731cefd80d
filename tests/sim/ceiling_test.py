"""Analytic ceiling and trace balancing."""

import pytest

from thundersync_jax import sim
from thundersync_jax.sim import Arrival, CostModel


def test_ceiling_by_hand():
    trace = [
        Arrival(0, 0, 0, 1.0, 100, 1.0),
        Arrival(1, 0, 1, 2.0, 100, 0.0),
        Arrival(2, 1, 0, 3.0, 200, 1.0),
        Arrival(3, 1, 1, 10.0, 100, 1.0),
    ]
    cost = CostModel(fixed_s=1.0, per_token_s=0.01, opt_s=0.5, pub_s=0.25)
    c = sim.ceiling(trace, cost, max_chunk_tokens=1000)
    # R = 10; sync chunks 2 + 2 + 4 = 8 s; three slots → L_lb = 3·1 + 0.01·500 = 8.
    # Release bound, t + work of arrivals >= t: t=10: 10 + 2; t=3: 3 + 4 (one slot, 300
    # tokens); t=2: 2 + 6; t=1: 1 + 8 → 12, plus O = 0.75.
    assert c == pytest.approx(
        sim.Ceiling(10.0, 8.0, 8.0, 18.75, 12.75, 18.75 / 12.75, 18.75 / 10.75)
    )
    assert sim.simulate(trace, "stream", cost, 1000).step_time_s == pytest.approx(12.75)


def test_late_arrivals_tighten_the_bound():
    # One trajectory at 0, three (separate groups) at 8, 9, 10; each costs 3 s. The
    # learner can do at most the first before 8, so T >= 8 + 9 = 17 (not R + 3 = 13).
    trace = [Arrival(0, 0, 0, 0.0, 100, 1.0)] + [
        Arrival(i, i, 0, 7.0 + i, 100, 1.0) for i in (1, 2, 3)
    ]
    cost = CostModel(fixed_s=0.0, per_token_s=0.03)
    c = sim.ceiling(trace, cost, max_chunk_tokens=1000)
    assert c.lower_bound_s == pytest.approx(17.0)
    assert sim.simulate(trace, "stream", cost, 1000).step_time_s == pytest.approx(17.0)
    assert c.max_speedup == pytest.approx((10.0 + 12.0) / 17.0)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 1.8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speedup_at_balance_one_is_at_most_two(sigma, seed):
    trace = sim.lognormal_trace(8, 6, sigma=sigma, group_icc=0.3, mean_s=30.0, seed=seed)
    cost = CostModel(0.02, 0.001, opt_s=0.0, pub_s=0.0)
    trace = sim.balance(trace, cost, 1.0, 4096)
    c = sim.ceiling(trace, cost, 4096)
    assert c.max_speedup <= 2.0 + 1e-12
    sync = sim.simulate(trace, "sync", cost, 4096).step_time_s
    assert sync == pytest.approx(c.sync_s)
    for schedule in ("group", "stream"):
        t = sim.simulate(trace, schedule, cost, 4096).step_time_s
        assert t >= c.lower_bound_s - 1e-9, schedule
        assert sync / t <= 2.0 + 1e-12


@pytest.mark.parametrize("ratio", [0.25, 0.5, 2.0, 4.0])
def test_ceiling_tracks_balance(ratio):
    trace = sim.lognormal_trace(8, 6, sigma=1.0, group_icc=0.3, mean_s=30.0, seed=7)
    cost = CostModel(0.05, 0.001, opt_s=0.3, pub_s=0.1, buckets=(512, 1024, 2048, 4096))
    trace = sim.balance(trace, cost, ratio, 4096)
    c = sim.ceiling(trace, cost, 4096)
    assert c.learner_work_s / c.rollout_span_s == pytest.approx(ratio)
    assert c.max_speedup <= 1.0 + ratio + 1e-12
    assert c.max_speedup <= (c.sync_s) / (c.learner_work_lb_s + 0.4) + 1e-12
    t = sim.simulate(trace, "stream", cost, 4096).step_time_s
    assert t >= c.lower_bound_s - 1e-9


def test_balance_keeps_order_and_scales_uniformly():
    trace = sim.lognormal_trace(4, 3, sigma=1.0, group_icc=0.5, mean_s=10.0, seed=0)
    cost = CostModel(0.1, 0.001)
    out = sim.balance(trace, cost, 2.0, 4096)
    scales = {round(b.arrival_s / a.arrival_s, 9) for a, b in zip(trace, out, strict=True)}
    assert len(scales) == 1
    assert [a._replace(arrival_s=0) for a in trace] == [b._replace(arrival_s=0) for b in out]
    with pytest.raises(ValueError, match="ratio=0"):
        sim.balance(trace, cost, 0, 4096)
