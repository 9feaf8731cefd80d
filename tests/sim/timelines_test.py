"""sim.timelines: arrival-trace export from a recorded timeline, replayable by the simulator."""

import pytest

from thundersync_jax import metrics, sim
from thundersync_jax.sim import timelines


def test_export_round_trips_through_the_trace_file(tmp_path):
    path = tmp_path / "arrivals.jsonl"
    steps = {}
    for step in range(2):
        tl = metrics.Timeline(start_s=1000.0 + step)
        for traj_id, (group, member, end, tokens, reward) in enumerate(
            [(0, 0, 1003.5, 40, 1.0), (0, 1, 1001.25, 20, 0.0), (1, 0, 1002.0, 33, 1.0)]
        ):
            tl.record(
                "rollout",
                1000.0 + step,
                end + step,
                traj_id=traj_id,
                group=group,
                member=member,
                tokens=tokens,
                reward=reward,
            )
        steps[step] = timelines.export_arrivals(tl, path, step=step)
    assert steps[0] == [
        sim.Arrival(0, 0, 0, 3.5, 40, 1.0, 0),
        sim.Arrival(1, 0, 1, 1.25, 20, 0.0, 0),
        sim.Arrival(2, 1, 0, 2.0, 33, 1.0, 0),
    ]
    assert sim.split_steps(sim.read_trace(path)) == steps
    # The exported step replays in the simulator.
    r = sim.simulate(sim.read_trace(path, step=1), "sync", sim.CostModel(1.0, 0.0), 100)
    assert r.rollout_span_s == pytest.approx(3.5)


def test_export_needs_the_trace_fields():
    tl = metrics.Timeline(start_s=0.0)
    tl.record("rollout", 0.0, 1.0, group=0, member=0)
    with pytest.raises(ValueError, match="lacks"):
        timelines.arrivals_from_timeline(tl)


def test_string_trajectory_ids_become_ranks_in_group_member_order():
    tl = metrics.Timeline(start_s=10.0)
    for k, m, end in [(1, 0, 12.0), (0, 1, 11.0), (0, 0, 13.0)]:
        tl.record("rollout", 10.0, end, traj_id=f"g{k}m{m}", group=k, member=m, tokens=5, reward=0)
    arrivals = timelines.arrivals_from_timeline(tl, step=4)
    assert [(a.traj_id, a.group, a.member, a.arrival_s) for a in arrivals] == [
        (0, 0, 0, 3.0),
        (1, 0, 1, 1.0),
        (2, 1, 0, 2.0),
    ]
