"""The step-time simulator against hand-computed timelines and general invariants."""

import math

import numpy as np
import pytest

from thundersync_jax import sim
from thundersync_jax.sim import Arrival, Chunk, CostModel

# Case A: two groups of two. Chunk cost 1 + 0.01·tokens, so 100 tokens → 2 s,
# 200 → 3 s, 300 → 4 s; opt 0.5 s, publish 0.25 s. Rollout span R = 10.
CASE_A = [
    Arrival(traj_id=0, group=0, member=0, arrival_s=1.0, tokens=100, reward=1.0),
    Arrival(traj_id=1, group=0, member=1, arrival_s=2.0, tokens=100, reward=0.0),
    Arrival(traj_id=2, group=1, member=0, arrival_s=3.0, tokens=200, reward=1.0),
    Arrival(traj_id=3, group=1, member=1, arrival_s=10.0, tokens=100, reward=1.0),
]
COST_A = CostModel(fixed_s=1.0, per_token_s=0.01, opt_s=0.5, pub_s=0.25)


def test_sync_starts_at_last_reward_and_packs_slots():
    r = sim.simulate(CASE_A, "sync", COST_A, max_chunk_tokens=1000)
    # Fixed (group, traj_id) order: (g0, r=1) [0], (g0, r=0) [1], (g1, r=1) [2, 3] packed.
    assert r.chunks == [
        Chunk(10.0, 12.0, "batch", (0,)),
        Chunk(12.0, 14.0, "batch", (1,)),
        Chunk(14.0, 18.0, "batch", (2, 3)),
        Chunk(18.0, 18.5, "opt", ()),
        Chunk(18.5, 18.75, "publish", ()),
    ]
    assert r.step_time_s == pytest.approx(18.75)  # R + L + opt + pub = 10 + 8 + 0.75
    assert r.rollout_span_s == 10.0
    assert r.learner_work_s == pytest.approx(8.0)
    assert r.learner_busy_s == pytest.approx(8.75)
    assert r.learner_idle_frac == pytest.approx(10.0 / 18.75)
    assert r.tail_s == pytest.approx(8.75)


def test_group_runs_each_group_when_its_last_member_arrives():
    r = sim.simulate(CASE_A, "group", COST_A, max_chunk_tokens=1000)
    # g0 complete at 2 → two slots 2–4, 4–6; g1 complete at 10 → one packed slot 10–14.
    assert r.chunks[:3] == [
        Chunk(2.0, 4.0, "group", (0,)),
        Chunk(4.0, 6.0, "group", (1,)),
        Chunk(10.0, 14.0, "group", (2, 3)),
    ]
    assert r.step_time_s == pytest.approx(14.75)
    assert r.learner_idle_frac == pytest.approx(6.0 / 14.75)
    assert r.tail_s == pytest.approx(4.75)


def test_stream_runs_each_trajectory_on_arrival_closed_groups_first():
    r = sim.simulate(CASE_A, "stream", COST_A, max_chunk_tokens=1000)
    # 1: only traj 0 (g0 open, one reward) → 1–3. At 3, trajs 1 (g0 now closed) and 2
    # (g1 open) wait; closed first → 3–5, then 2 → 5–8. Idle until 10, traj 3 → 10–12.
    assert r.chunks[:4] == [
        Chunk(1.0, 3.0, "open", (0,)),
        Chunk(3.0, 5.0, "closed", (1,)),
        Chunk(5.0, 8.0, "open", (2,)),
        Chunk(10.0, 12.0, "closed", (3,)),
    ]
    assert r.step_time_s == pytest.approx(12.75)
    # Less packing than sync: four fixed costs instead of three.
    assert r.learner_busy_s == pytest.approx(9.75)
    assert r.tail_s == pytest.approx(2.75)
    assert r.open_groups_peak == 1


def test_async_overlaps_learner_with_next_rollouts():
    r = sim.simulate(CASE_A, "async", COST_A, max_chunk_tokens=1000)
    # Learner trains on the previous batch from t = 0 (8 s of work); the optimizer step
    # waits for this batch's rollouts (R = 10): max(R, L) + opt + pub.
    assert [c[:3] for c in r.chunks] == [
        (0.0, 2.0, "batch"),
        (2.0, 4.0, "batch"),
        (4.0, 8.0, "batch"),
        (10.0, 10.5, "opt"),
        (10.5, 10.75, "publish"),
    ]
    assert r.step_time_s == pytest.approx(10.75)


def test_async_learner_bound_when_work_exceeds_span():
    fast = [a._replace(arrival_s=a.arrival_s / 10) for a in CASE_A]  # R = 1 < L = 8
    r = sim.simulate(fast, "async", COST_A, max_chunk_tokens=1000)
    assert r.step_time_s == pytest.approx(8.0 + 0.75)


# Case B: groups of three, every chunk costs 1 s, no opt/publish. By t = 0.5 group 1 has
# two differing rewards (rank "differing"), group 2 is complete (rank "closed") and
# group 3 has one member (rank "open"); group 0's first member occupies the learner 0–1.
CASE_B = [
    Arrival(0, 0, 0, 0.0, 10, 0.0),
    Arrival(1, 3, 0, 0.05, 10, 1.0),
    Arrival(2, 1, 0, 0.1, 10, 0.0),
    Arrival(3, 1, 1, 0.2, 10, 1.0),
    Arrival(4, 2, 0, 0.3, 10, 1.0),
    Arrival(5, 2, 1, 0.4, 10, 1.0),
    Arrival(6, 2, 2, 0.5, 10, 0.0),
    Arrival(7, 0, 1, 10.0, 10, 0.0),
    Arrival(8, 0, 2, 10.0, 10, 0.0),
    Arrival(9, 1, 2, 10.0, 10, 0.0),
    Arrival(10, 3, 1, 10.0, 10, 1.0),
    Arrival(11, 3, 2, 10.0, 10, 1.0),
]
UNIT = CostModel(fixed_s=1.0, per_token_s=0.0)


def test_stream_priority_closed_then_differing_then_open():
    r = sim.simulate(CASE_B, "stream", UNIT, max_chunk_tokens=100)
    assert r.chunks[:-2] == [
        Chunk(0.0, 1.0, "open", (0,)),
        Chunk(1.0, 2.0, "closed", (4, 5)),  # g2's reward-1 slot, packed
        Chunk(2.0, 3.0, "closed", (6,)),
        Chunk(3.0, 4.0, "differing", (2,)),  # g1, oldest first
        Chunk(4.0, 5.0, "differing", (3,)),
        Chunk(5.0, 6.0, "open", (1,)),
        # All closed at 10 and arrived together: ties go by member, so g0 (head: member 1)
        # and g3 (member 1) run before g1 (member 2).
        Chunk(10.0, 11.0, "closed", (7, 8)),
        Chunk(11.0, 12.0, "closed", (10, 11)),
        Chunk(12.0, 13.0, "closed", (9,)),
    ]
    # After 5–6: g0 (1 of 3), g1 (2 of 3), g3 (1 of 3) hold partial tallies.
    assert r.open_groups_peak == 3
    assert r.step_time_s == pytest.approx(13.0)


def test_stream_open_group_cap_applies_backpressure():
    r = sim.simulate(CASE_B, "stream", UNIT, max_chunk_tokens=100, max_open_groups=2)
    # At 5, g0 and g1 are open, so g3 (no tally yet) waits. At 10 only g0 and g1 may
    # run; g0 finishes at 11, which frees a slot, and g3's oldest member (arrived 0.05)
    # beats g1's (10.0): g3 runs as one packed chunk of its three reward-1 members.
    assert r.chunks[:-2] == [
        Chunk(0.0, 1.0, "open", (0,)),
        Chunk(1.0, 2.0, "closed", (4, 5)),
        Chunk(2.0, 3.0, "closed", (6,)),
        Chunk(3.0, 4.0, "differing", (2,)),
        Chunk(4.0, 5.0, "differing", (3,)),
        Chunk(10.0, 11.0, "closed", (7, 8)),
        Chunk(11.0, 12.0, "closed", (1, 10, 11)),
        Chunk(12.0, 13.0, "closed", (9,)),
    ]
    assert r.open_groups_peak == 2


def test_cap_of_one_still_finishes():
    r = sim.simulate(CASE_B, "stream", UNIT, max_chunk_tokens=100, max_open_groups=1)
    assert r.open_groups_peak == 1
    assert sorted(i for c in r.chunks for i in c.ids) == list(range(12))


def test_packing_respects_the_token_budget():
    trace = [Arrival(i, 0, i, 1.0, t, 1.0) for i, t in enumerate([40, 40, 40, 150, 60])]
    r = sim.simulate(trace, "sync", CostModel(0.0, 1.0), max_chunk_tokens=100)
    # traj_id order 0..4: [40+40] then 40+150 > 100 → [40], [150] alone (over budget),
    # then [60].
    assert [c.ids for c in r.chunks if c.kind == "batch"] == [(0, 1), (2,), (3,), (4,)]
    assert r.learner_work_s == pytest.approx(330.0)


def test_bucket_padding_is_charged():
    trace = [Arrival(0, 0, 0, 1.0, 100, 1.0), Arrival(1, 0, 1, 2.0, 300, 1.0)]
    cost = CostModel(fixed_s=0.0, per_token_s=1.0, buckets=(64, 128, 256))
    r = sim.simulate(trace, "stream", cost, max_chunk_tokens=1000)
    # 100 → 128 (1–129); 300 → 512 (two 256-buckets), ready at 2, starts at 129.
    assert [(c.start, c.end) for c in r.chunks[:2]] == [(1.0, 129.0), (129.0, 641.0)]


def _check_invariants(trace, r, budget):
    by_id = {a.traj_id: a for a in trace}
    work = [c for c in r.chunks if c.kind not in ("opt", "publish")]
    ids = [i for c in work for i in c.ids]
    assert sorted(ids) == sorted(by_id), "every trajectory processed exactly once"
    for prev, nxt in zip(r.chunks[:-1], r.chunks[1:], strict=True):
        assert nxt.start >= prev.end - 1e-9, "the learner is serial"
    for c in work:
        members = [by_id[i] for i in c.ids]
        assert len({(a.group, a.reward) for a in members}) == 1, "one slot per chunk"
        assert len(members) == 1 or sum(a.tokens for a in members) <= budget
        if r.schedule != "async":
            assert c.start >= max(a.arrival_s for a in members) - 1e-9


@pytest.mark.parametrize("schedule", sim.SCHEDULES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariants_on_random_traces(schedule, seed):
    trace = sim.lognormal_trace(7, 5, sigma=1.0, group_icc=0.3, mean_s=20.0, seed=seed)
    cost = CostModel(0.3, 0.002, opt_s=1.0, pub_s=0.5, buckets=(256, 1024, 4096))
    r = sim.simulate(trace, schedule, cost, max_chunk_tokens=3000, max_open_groups=3)
    _check_invariants(trace, r, 3000)
    assert r.open_groups_peak <= 3
    assert math.isclose(r.step_time_s - r.rollout_span_s, r.tail_s)


@pytest.mark.parametrize("seed", range(5))
def test_early_start_never_loses_with_additive_cost(seed):
    # With no fixed cost and no padding, work is additive and group/stream are
    # work-conserving, so they finish by R + L, the sync time.
    trace = sim.lognormal_trace(6, 4, sigma=1.2, group_icc=0.2, mean_s=5.0, seed=seed)
    cost = CostModel(0.0, 0.001, opt_s=0.2, pub_s=0.1)
    t = {s: sim.simulate(trace, s, cost, 10**6).step_time_s for s in sim.SCHEDULES}
    assert t["stream"] <= t["sync"] + 1e-9
    assert t["group"] <= t["sync"] + 1e-9
    assert t["async"] <= t["stream"] + 1e-9


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="schedule='eager'"):
        sim.simulate(CASE_A, "eager", COST_A, 100)
    with pytest.raises(ValueError, match="max_chunk_tokens=0"):
        sim.simulate(CASE_A, "sync", COST_A, 0)
    with pytest.raises(ValueError, match="max_open_groups=0"):
        sim.simulate(CASE_A, "stream", COST_A, 100, max_open_groups=0)
    with pytest.raises(ValueError, match="traj_id=0 appears twice"):
        sim.simulate(CASE_A + CASE_A[:1], "sync", COST_A, 100)
    with pytest.raises(ValueError, match="empty"):
        sim.simulate([], "sync", COST_A, 100)


def test_idle_fraction_of_sync_at_balance_is_about_half():
    trace = sim.lognormal_trace(16, 8, sigma=0.8, group_icc=0.3, mean_s=30.0, seed=3)
    cost = CostModel(0.05, 0.001)
    r = sim.simulate(sim.balance(trace, cost, 1.0, 8192), "sync", cost, 8192)
    assert r.learner_idle_frac == pytest.approx(0.5)
    assert np.isclose(r.learner_work_s, r.rollout_span_s)


def test_sync_runs_groups_in_fixed_order_not_arrival_order():
    # Group 1 finishes first, but sync (and async) take groups in index order, so the
    # synchronous update is bitwise reproducible.
    trace = [Arrival(0, 1, 0, 1.0, 10, 1.0), Arrival(1, 0, 0, 2.0, 10, 1.0)]
    r = sim.simulate(trace, "sync", UNIT, max_chunk_tokens=100)
    assert [c.ids for c in r.chunks[:2]] == [(1,), (0,)]
    r = sim.simulate(trace, "group", UNIT, max_chunk_tokens=100)
    assert [c.ids for c in r.chunks[:2]] == [(0,), (1,)]  # FIFO by group completion


def test_group_ties_in_completion_time_go_by_group():
    # Both groups complete at t = 5; the planner orders by (completion time, group,
    # member), so each group is taken whole and no extra group is opened.
    trace = [
        Arrival(0, 0, 0, 1.0, 10, 1.0),
        Arrival(1, 0, 1, 5.0, 10, 0.0),
        Arrival(2, 1, 0, 5.0, 10, 1.0),
        Arrival(3, 1, 1, 2.0, 10, 0.0),
    ]
    r = sim.simulate(trace, "group", UNIT, max_chunk_tokens=100)
    assert [c.ids for c in r.chunks[:-2]] == [(0,), (1,), (2,), (3,)]
    assert [c.start for c in r.chunks[:-2]] == [5.0, 6.0, 7.0, 8.0]


def test_row_padding_charges_the_padded_block():
    # Three rows of 10, 20 and 5 tokens run as a [4, 32] block.
    cost = CostModel(fixed_s=1.0, per_token_s=0.01, buckets=(16, 32), row_padding=True)
    trace = [Arrival(i, 0, i, 1.0, n, 1.0) for i, n in enumerate((10, 20, 5))]
    r = sim.simulate(trace, "sync", cost, max_chunk_tokens=100)
    assert [c.ids for c in r.chunks[:-2]] == [(0, 1, 2)]
    assert r.learner_work_s == pytest.approx(1.0 + 0.01 * 4 * 32)
