"""The Schedule objects: each schedule's rules, read by hand from DESIGN §3."""

import pytest

from thundersync_jax.schedule import schedules


def test_the_four_schedules_and_their_rules():
    s = {name: schedules.get(name) for name in ("sync", "group", "stream", "async")}
    assert schedules.NAMES == ("sync", "group", "stream", "async")
    assert [x.enforces_version for x in s.values()] == [True, True, True, False]
    assert [x.policy_lag for x in s.values()] == [0, 0, 0, 1]
    assert [x.overlaps_rollouts for x in s.values()] == [False, True, True, False]
    ready = lambda x, g, b: x.item_ready(group_complete=g, batch_complete=b)  # noqa: E731
    assert [ready(x, False, False) for x in s.values()] == [False, False, True, False]
    assert [ready(x, True, False) for x in s.values()] == [False, True, True, False]
    assert all(ready(x, True, True) for x in s.values())
    # Only a schedule that starts groups before they complete holds open-group tallies.
    assert [x.open_group_tallies(8, None) for x in s.values()] == [0, 0, 8, 0]
    assert s["stream"].open_group_tallies(8, 3) == 3


def test_stream_priority_closed_then_differing_then_open_oldest_first():
    stream = schedules.get("stream")

    def key(closed, differ, arrival):
        return stream.priority(
            group=0,
            member=0,
            item_id="x",
            arrival_s=arrival,
            completed_at=0.0,
            group_complete=closed,
            rewards_differ=differ,
        )

    assert key(True, False, 9.0) < key(False, True, 0.0) < key(False, False, 0.0)
    assert key(False, False, 1.0) < key(False, False, 2.0)
    kinds = [
        stream.chunk_kind(group_complete=c, rewards_differ=d)
        for c, d in ((True, True), (False, True), (False, False))
    ]
    assert kinds == list(schedules.STREAM_RANKS)


def test_sync_order_is_fixed_by_group_and_member():
    sync = schedules.get("sync")
    keys = [
        sync.priority(
            group=g,
            member=m,
            item_id=f"g{g}m{m}",
            arrival_s=-g - m,
            completed_at=0.0,
            group_complete=True,
            rewards_differ=False,
        )
        for g, m in ((1, 0), (0, 1), (0, 0))
    ]
    assert sorted(keys) == [keys[2], keys[1], keys[0]]  # arrival time plays no part


def test_unknown_schedule_names_the_valid_ones():
    with pytest.raises(ValueError, match="schedule='fast' is not valid; choose one of: sync"):
        schedules.get("fast")
    assert schedules.get(schedules.get("group")).name == "group"
