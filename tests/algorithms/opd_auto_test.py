"""`rl.opd_granularity="auto"`: what a step teaches the chooser, and what it then picks.

Synthetic traces (`sim.opd_trace`) and synthetic call timings; the references are the
predictor's own functions (`sim.segment_calls`, `sim.simulate_opd`, `sim.item_costs`) applied
independently. The real learner's records: tests/algorithms/opd_test.py (auto test).
"""

import numpy as np
import pytest

from thundersync_jax import sim
from thundersync_jax.algorithms import _opd_auto as auto

B = auto.Buckets(seg=(16, 32, 64), cache=(64, 128, 256), seq=(64, 128, 256))


def _trace(seed=0):
    return sim.opd_trace(2, 2, 0.5, 0.3, 0.5, 4, 24, 256, seed, max_segment=64)


def _arrivals(trace):
    return [
        auto.TurnArrival(t.group, t.member, t.turn, t.arrival_s, t.start + t.tokens, t.scored)
        for t in trace
    ]


def _price(key, turn_scale, one_shot_scale):
    kind, t, s, _ = key
    if kind == "hold":
        return 1e-5
    if kind == "one_shot":
        return one_shot_scale * (2e-3 + 1e-5 * t + 1e-7 * t * t)
    return turn_scale * (1e-3 + 1e-5 * t + 1e-7 * t * s)


def _state(trace, turn_scale, one_shot_scale=1.0):
    """An AutoState that has timed every call of `trace` at both granularities."""
    calls = {}
    for turns in sim.trajectories(trace).values():
        direct, sweep = sim.segment_calls(turns, B.seg, B.cache)
        for key in [*direct, *sweep, sim._opd.HOLD, sim.one_shot_call(turns, B.seq)]:
            calls[key] = (_price(key, turn_scale, one_shot_scale),)
    return auto.AutoState(B, calls, (1e-4,), frozenset(sim.GRANULARITIES), tuple(trace))


def _cost(state):
    return sim.SegmentCost.fit(state.calls, state.overhead, [0.0], B.seg, B.cache, B.seq)


@pytest.mark.parametrize("turn_scale,expected", [(0.2, "turn"), (8.0, "trajectory")])
def test_stream_picks_turn_when_its_calls_are_cheap_else_trajectory(turn_scale, expected):
    trace = _trace()
    state = _state(trace, turn_scale)
    choice = auto.choose(state, "stream")
    assert choice.granularity == expected and choice.reason == "predicted"
    cost = _cost(state)
    for g in sim.GRANULARITIES:
        want = sim.simulate_opd(trace, "stream", cost, g).step_time_s
        assert choice.predicted[g] == pytest.approx(want, rel=1e-12)
    assert choice.granularity == sim.best_granularity(trace, "stream", cost)


@pytest.mark.parametrize("turn_scale", [0.3, 0.8, 1.2, 3.0])
def test_sync_picks_the_smaller_total_learner_work(turn_scale):
    trace = _trace(seed=1)
    state = _state(trace, turn_scale)
    cost = _cost(state)
    work = {g: sum(sim.item_costs(trace, g, cost).values()) for g in sim.GRANULARITIES}
    choice = auto.choose(state, "sync")
    assert choice.granularity == min(work, key=work.get)
    # sync: the learner starts after the last arrival, so the two predictions differ by work
    gap = choice.predicted["turn"] - choice.predicted["trajectory"]
    assert gap == pytest.approx(work["turn"] - work["trajectory"], rel=1e-9, abs=1e-12)


def _samples(trace, granularity, seconds=1e-3):
    calls = {}
    for turns in sim.trajectories(trace).values():
        if granularity == "trajectory":
            keys = [sim._opd.HOLD] * len(turns) + [sim.one_shot_call(turns, B.seq)]
        else:
            direct, sweep = sim.segment_calls(turns, B.seg, B.cache)
            keys = direct + sweep
        for key in keys:
            calls.setdefault(key, []).append(seconds)
    overhead = (1e-4,) if granularity == "turn" else ()
    return auto.Samples(granularity, {k: tuple(v) for k, v in calls.items()}, overhead)


@pytest.mark.parametrize("schedule,first", [("sync", "trajectory"), ("stream", "turn")])
def test_exploration_times_the_rule_then_the_other_then_predicts(schedule, first):
    trace = _trace()
    choice = auto.choose(None, schedule)
    assert (choice.granularity, choice.predicted) == (first, None)
    assert choice.reason.startswith("explore")
    state = auto.observe(auto.AutoState(B), trace, _samples(trace, choice.granularity))
    second = auto.choose(state, schedule)
    assert second.granularity != first and second.predicted is None
    assert second.reason.startswith("explore")
    state = auto.observe(state, trace, _samples(trace, second.granularity))
    third = auto.choose(state, schedule)
    assert third.reason == "predicted" and set(third.predicted) == set(sim.GRANULARITIES)
    assert third.granularity == min(third.predicted, key=third.predicted.get)


def test_pooling_keeps_the_newest_samples_per_shape_and_bounds_them():
    trace = _trace()
    key = sim.segment_calls(sim.trajectories(trace)[0], B.seg, B.cache)[0][0]
    state = auto.AutoState(B)
    for i in range(auto.MAX_SAMPLES_PER_SHAPE + 5):
        samples = auto.Samples("turn", {key: (float(i),)}, (float(i),) * 7)
        state = auto.observe(state, trace, samples)
    n = auto.MAX_SAMPLES_PER_SHAPE
    assert state.calls[key] == tuple(float(i) for i in range(5, n + 5))
    assert len(state.overhead) == auto.MAX_OVERHEAD_SAMPLES
    assert state.overhead[-1] == float(n + 4) and state.timed == {"turn"}
    assert state.trace == tuple(trace)


def _record(trace, granularity, rng):
    """A StepRecord of `trace` at `granularity`: arrivals shuffled, one fold per turn and
    one close per trajectory, in two chunks; returns it and the seconds of each call."""
    arrivals = _arrivals(trace)
    rng.shuffle(arrivals)  # the teacher may finish turns out of order
    calls, seconds = [], {}
    for i, t in enumerate(sorted(trace, key=lambda t: (t.traj_id, t.turn))):
        s = 1e-3 * (i + 1)
        compiled = i == 0  # a call that compiled gives no sample
        calls.append(auto.CallTiming(t.group, t.member, "fold", s, i % 2, compiled))
        seconds[("fold", t.traj_id, t.turn)] = None if compiled else s
    for t in trace:
        if t.last:
            s = 0.05 + 1e-3 * t.traj_id
            calls.append(auto.CallTiming(t.group, t.member, "close", s, -1 if t.group else 1))
            seconds[("close", t.traj_id)] = s
    in_chunk = [sum(c.seconds for c in calls if c.chunk == k) for k in (0, 1)]
    chunks = ((in_chunk[0] + 0.01, 4), (in_chunk[1] + 0.03, 6))
    return auto.StepRecord(granularity, tuple(arrivals), tuple(calls), chunks), seconds


def _assert_same_pool(got, want):
    assert set(got) == set(want)
    for key in want:
        assert sorted(got[key]) == pytest.approx(sorted(want[key]), rel=1e-12), key


def test_turn_samples_are_keyed_as_the_segment_learner_pads_its_calls():
    trace = _trace()
    record, seconds = _record(trace, "turn", np.random.default_rng(0))
    got_trace, samples = auto.step_samples(record, B)
    assert got_trace == [t._replace(scored=min(t.scored, t.tokens - 1)) for t in trace]
    assert samples.overhead == pytest.approx((0.01 / 4, 0.03 / 6))
    want: dict = {}
    for tid, turns in sim.trajectories(trace).items():
        direct, sweep = sim.segment_calls(turns, B.seg, B.cache)
        for t, key in zip(turns, direct, strict=True):
            if seconds[("fold", tid, t.turn)] is not None:
                want.setdefault(key, []).append(seconds[("fold", tid, t.turn)])
        total = sum(k[1] for k in sweep)
        for key in sweep:
            want.setdefault(key, []).append(seconds[("close", tid)] * key[1] / total)
    _assert_same_pool(samples.calls, want)


def test_trajectory_samples_charge_the_chunk_overhead_to_its_calls():
    trace = _trace()
    record, seconds = _record(trace, "trajectory", np.random.default_rng(1))
    _, samples = auto.step_samples(record, B)
    assert samples.overhead == ()
    per_call = [0.01 / sum(c.chunk == k for c in record.calls) for k in (0,)]
    per_call.append(0.03 / sum(c.chunk == 1 for c in record.calls))
    chunk_of = {(c.group, c.member, c.kind, c.seconds): c.chunk for c in record.calls}
    want: dict = {}
    for tid, turns in sim.trajectories(trace).items():
        t0 = turns[0]
        for t in turns:
            s = seconds[("fold", tid, t.turn)]
            if s is None:
                continue
            want.setdefault(sim._opd.HOLD, []).append(
                s + per_call[chunk_of[(t0.group, t0.member, "fold", s)]]
            )
        s = seconds[("close", tid)]
        chunk = chunk_of[(t0.group, t0.member, "close", s)]
        extra = per_call[chunk] if chunk >= 0 else 0.0
        want.setdefault(sim.one_shot_call(turns, B.seq), []).append(s + extra)
    _assert_same_pool(samples.calls, want)


def test_a_lost_turn_opens_the_next_segment_and_a_missing_fold_is_an_error():
    trace = [t for t in _trace() if t.traj_id == 0]
    assert len(trace) >= 3
    arrivals = [a for a in _arrivals(trace) if a.turn != 1]  # turn 1's teacher call failed
    got, _ = auto.step_trace(arrivals)
    assert [t.turn for t in got] == list(range(len(trace) - 1))
    assert got[1].start == trace[1].start and got[1].tokens == trace[1].tokens + trace[2].tokens
    sim.validate_opd_trace(got)
    calls = tuple(auto.CallTiming(0, 0, "fold", 1e-3, 0) for _ in got[1:])  # one fold short
    record = auto.StepRecord("turn", tuple(arrivals), calls, ((1.0, 3),))
    with pytest.raises(ValueError, match="timed folds"):
        auto.step_samples(record, B)


def test_the_last_turn_arrives_no_earlier_than_its_members_end():
    trace = _trace()
    last = {(t.group, t.member): t.arrival_s for t in trace if t.last}
    ends = [(g, m, at + (5.0 if g == 0 else -5.0)) for (g, m), at in last.items()]
    got, _ = auto.step_trace(_arrivals(trace), ends)
    for t, want in zip(got, trace, strict=True):
        late = t.last and t.group == 0  # group 0's episodes ended 5 s after their last score
        assert t.arrival_s == (want.arrival_s + 5.0 if late else want.arrival_s)
