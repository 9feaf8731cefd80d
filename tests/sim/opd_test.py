"""OPD traces and the segment-aware predictor, against hand-computed timelines."""

import math

import numpy as np
import pytest

from thundersync_jax import sim
from thundersync_jax.sim import OpdTurn


def _trace(**kw):
    args = dict(
        num_groups=6,
        group_size=4,
        sigma=1.0,
        group_icc=0.3,
        turns_sigma=1.0,
        mean_turns=6,
        mean_tokens=24,
        max_tokens=256,
        seed=3,
        max_segment=64,
    )
    args.update(kw)
    return sim.opd_trace(**args)


def test_opd_trace_is_valid_heavy_tailed_and_seeded():
    trace = _trace()
    sim.validate_opd_trace(trace)
    assert trace == _trace() and trace != _trace(seed=4)
    turns = [len(v) for v in sim.trajectories(trace).values()]
    assert len(turns) == 24 and max(turns) >= 2 * np.median(turns)  # a few long episodes
    for v in sim.trajectories(trace).values():
        assert v[-1].start + v[-1].tokens <= 256 and all(4 <= t.tokens <= 64 for t in v)
    assert [len(v) for v in sim.trajectories(_trace(turns_sigma=0.0)).values()] == [6] * 24
    with pytest.raises(ValueError, match="icc"):
        _trace(group_icc=1.5)


def test_validate_opd_trace_names_the_bad_turn():
    good = [OpdTurn(0, 0, 0, 0, 1.0, 0, 8, 4, False), OpdTurn(0, 0, 0, 1, 2.0, 8, 8, 4, True)]
    sim.validate_opd_trace(good)
    with pytest.raises(ValueError, match="traj 0 turn 1: start 9"):
        sim.validate_opd_trace([good[0], good[1]._replace(start=9)])
    with pytest.raises(ValueError, match="scored=8"):
        sim.validate_opd_trace([good[0], good[1]._replace(scored=8)])


def test_segment_calls_pad_and_block_like_the_learner():
    turns = [
        OpdTurn(0, 0, 0, 0, 1.0, 0, 10, 5, False),  # inputs 9 at slot 0
        OpdTurn(0, 0, 0, 1, 2.0, 10, 25, 12, False),  # inputs 25 at slot 9
        OpdTurn(0, 0, 0, 2, 3.0, 35, 29, 14, True),  # inputs 29 at slot 34
    ]
    direct, sweep = sim.segment_calls(turns, (16, 32), (32, 64))
    # (kind, padded inputs, cache slots attended, cache capacity after growing)
    assert direct == [("direct", 16, 0, 32), ("direct", 32, 32, 64), ("direct", 32, 64, 64)]
    # Every segment but the newest, newest first, in blocks up to 32 tokens: 25, then 9.
    assert sweep == [("sweep", 32, 32, 64), ("sweep", 16, 0, 64)]
    three = [turns[0], turns[1]._replace(tokens=20, scored=10), turns[2]._replace(start=30)]
    assert sim.segment_calls(three, (16, 32), (32, 64))[1] == [("sweep", 32, 0, 64)]  # 9 + 20
    assert sim.segment_calls(turns[:1], (16, 32), (32, 64))[1] == []  # one segment: no sweep
    assert sim.one_shot_call(turns, (32, 64)) == ("one_shot", 64, 0, 0)


def _cost():
    prices = {("direct", 16, 0, 32): 0.1, ("direct", 32, 32, 64): 0.2}
    prices |= {("direct", 32, 64, 64): 0.25, ("sweep", 32, 32, 64): 0.3}
    prices |= {("sweep", 16, 0, 64): 0.05, ("one_shot", 64, 0, 0): 0.4, sim._opd.HOLD: 0.001}
    samples = {k: [v] for k, v in prices.items()}
    return sim.SegmentCost.fit(samples, [0.01], [0.5], (16, 32), (32, 64), (32, 64))


def test_simulate_opd_by_hand():
    a = [
        OpdTurn(0, 0, 0, 0, 1.0, 0, 10, 5, False),
        OpdTurn(0, 0, 0, 1, 2.0, 10, 25, 12, False),
        OpdTurn(0, 0, 0, 2, 3.0, 35, 29, 14, True),
    ]
    b = [t._replace(traj_id=1, member=1, arrival_s=t.arrival_s * 4) for t in a]
    trace, cost = a + b, _cost()
    items = sim.opd_items(trace)
    assert [it.item_id for it in items[:4]] == [
        "000000000t0000",
        "000000000t0001",
        "000000000t0002",
        "000000000z",
    ]
    assert [it.closes_member for it in items].count(True) == 2
    # turn: three direct passes and the sweep (its own item), each chunk + 0.01 overhead
    turn_work = 0.1 + 0.2 + 0.25 + (0.3 + 0.05) + 4 * 0.01
    sync = sim.simulate_opd(trace, "sync", cost, "turn")
    assert math.isclose(sync.step_time_s, 12.0 + 2 * turn_work + 0.5)
    # trajectory: turn items are host bookkeeping, the closing item the one-shot gradient.
    traj_work = 3 * 0.001 + 0.4
    assert math.isclose(
        sim.simulate_opd(trace, "sync", cost, "trajectory").step_time_s, 12.0 + 2 * traj_work + 0.5
    )
    # Stream per turn: trajectory 0 is done by ~4; trajectory 1's last turn arrives at 12.
    stream = sim.simulate_opd(trace, "stream", cost, "turn")
    assert math.isclose(stream.step_time_s, 12.0 + 0.25 + 0.3 + 0.05 + 2 * 0.01 + 0.5)
    # Group: both members are one group, so nothing starts before 12.
    group = sim.simulate_opd(trace, "group", cost, "trajectory")
    assert math.isclose(group.step_time_s, 12.0 + 2 * traj_work + 0.5)
    balanced = sim.balance_opd(trace, cost, 2.0, "turn")
    assert math.isclose(max(t.arrival_s for t in balanced), 2 * turn_work / 2.0)


def test_segment_cost_falls_back_to_its_fit():
    cost = _cost()
    assert cost.call_s(("direct", 32, 32, 64)) == 0.2
    assert math.isfinite(cost.call_s(("direct", 16, 32, 64))) and cost.affine().prices == {}
    with pytest.raises(ValueError, match="call kind 'forward'"):
        cost.call_s(("forward", 16, 0, 32))
