"""Planner decisions on small hand-checkable batches."""

import queue
import threading
import time

import pytest

from thundersync_jax.schedule.learner_loop import MemberFailed, run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem


def _item(group, member, reward, t, tokens=10):
    return WorkItem(f"g{group}m{member}", group, reward, tokens, t)


def test_sync_waits_for_whole_batch():
    p = Planner("sync", num_groups=2, group_size=2, max_chunk_tokens=100)
    p.push(_item(0, 0, 1.0, 0.1))
    p.push(_item(0, 1, 0.0, 0.2))
    p.push(_item(1, 0, 1.0, 0.3))
    assert p.next_chunk() == []
    p.push(_item(1, 1, 1.0, 0.4))
    chunks = [[it.item_id for it in c] for c in p.drain()]
    # group 0 has two reward slots, group 1 one slot packing both members
    assert sorted(map(tuple, chunks)) == [("g0m0",), ("g0m1",), ("g1m0", "g1m1")]
    assert p.done()


def test_group_releases_complete_groups_only():
    p = Planner("group", num_groups=2, group_size=2, max_chunk_tokens=100)
    p.push(_item(1, 0, 0.0, 0.1))
    p.push(_item(0, 0, 1.0, 0.2))
    assert p.next_chunk() == []
    p.push(_item(0, 1, 1.0, 0.3))
    assert [it.item_id for it in p.next_chunk()] == ["g0m0", "g0m1"]
    assert p.next_chunk() == []


def test_stream_priority_closed_then_differing_then_rest():
    p = Planner("stream", num_groups=3, group_size=3, max_chunk_tokens=100)
    p.push(_item(2, 0, 0.0, 0.0))  # group 2: one reward so far (rank 2)
    p.push(_item(1, 0, 0.0, 0.1))  # group 1: rewards differ (rank 1)
    p.push(_item(1, 1, 1.0, 0.2))
    for m in range(3):  # group 0 complete (rank 0), arrives last
        p.push(_item(0, m, 0.5, 0.3 + m))
    order = [[it.item_id for it in c] for c in p.drain()]
    assert order == [["g0m0", "g0m1", "g0m2"], ["g1m0"], ["g1m1"], ["g2m0"]]


def test_chunk_token_budget_splits_slot():
    p = Planner("stream", num_groups=1, group_size=4, max_chunk_tokens=25)
    for m in range(4):
        p.push(_item(0, m, 1.0, m, tokens=10))
    sizes = [len(c) for c in p.drain()]
    assert sizes == [2, 2]


def test_open_group_cap_applies_backpressure():
    p = Planner("stream", num_groups=3, group_size=2, max_chunk_tokens=100, max_open_groups=1)
    p.push(_item(0, 0, 1.0, 0.0))
    p.push(_item(1, 0, 1.0, 0.1))
    assert [it.item_id for it in p.next_chunk()] == ["g0m0"]
    assert p.next_chunk() == []  # group 1 would open a second slot
    p.push(_item(0, 1, 0.0, 0.2))
    assert [it.item_id for it in p.next_chunk()] == ["g0m1"]  # closes group 0
    assert [it.item_id for it in p.next_chunk()] == ["g1m0"]
    assert p.open_groups_peak == 1


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="schedule='fast'"):
        Planner("fast", 1, 1, 10)
    p = Planner("stream", 1, 1, 10)
    with pytest.raises(ValueError, match="group=3"):
        p.push(_item(3, 0, 0.0, 0.0))
    p.push(_item(0, 0, 0.0, 0.0))
    with pytest.raises(ValueError, match="already has 1 members"):
        p.push(_item(0, 1, 0.0, 0.0))


def test_learner_loop_streams_while_rollouts_run():
    """Chunks start before the last arrival under stream, after it under sync."""
    for schedule, expect_overlap in (("stream", True), ("sync", False)):
        p = Planner(schedule, num_groups=2, group_size=2, max_chunk_tokens=10)
        q: queue.Queue = queue.Queue()
        t0 = time.perf_counter()

        def produce(q=q, t0=t0):
            for k, m, r in ((0, 0, 1.0), (0, 1, 0.0), (1, 0, 1.0)):
                q.put(_item(k, m, r, time.perf_counter() - t0))
                time.sleep(0.05)
            q.put(MemberFailed(group=1, reason="engine gave up"))

        processed: list = []
        starts: list = []
        th = threading.Thread(target=produce)
        th.start()
        _, stats = run_learner_batch(
            p,
            q,
            None,
            lambda state, chunk, out=processed: out.extend(chunk),
            on_chunk=lambda c, s, e, st=starts: st.append(s),
        )
        th.join()
        assert sorted(it.item_id for it in processed) == ["g0m0", "g0m1", "g1m0"]
        assert stats.failures == ["engine gave up"]
        assert (starts[0] < stats.last_arrival_s) == expect_overlap


def test_excluded_groups_are_another_process_s_and_never_block_the_batch():
    # Process 1 of 2 owns the odd groups (k mod 2): the batch closes on them alone.
    p = Planner("stream", num_groups=4, group_size=2, max_chunk_tokens=1000)
    p.exclude_groups([0, 2])
    assert not p.done()
    for k in (1, 3):
        for m in range(2):
            p.push(_item(k, m, float(m), t=k + m))
    chunks = list(p.drain())
    assert sorted(it.group for c in chunks for it in c) == [1, 1, 3, 3]
    assert p.done()


def test_excluding_a_group_that_already_has_members_is_an_error():
    p = Planner("stream", num_groups=2, group_size=2, max_chunk_tokens=1000)
    p.push(_item(0, 0, 1.0, t=0))
    with pytest.raises(ValueError, match="group 0: 1 members already arrived"):
        p.exclude_groups([0])


def _turn(group, member, turn, t):
    return WorkItem(
        f"g{group}m{member}t{turn}", group, 0.0, 5, t, closes_member=False, member=member
    )


def _end(group, member, t):
    return WorkItem(f"g{group}m{member}end", group, 0.0, 0, t, member=member)


def test_open_member_cap_holds_new_members_back_until_one_closes():
    """max_open_members=1: member 1's turns wait until member 0's work is all handed out (its
    end and every turn); a dropped member frees its slot too."""
    p = Planner("stream", num_groups=1, group_size=3, max_chunk_tokens=5, max_open_members=1)
    p.push(_turn(0, 0, 0, 0.1))
    p.push(_turn(0, 1, 0, 0.2))
    assert [it.item_id for it in p.next_chunk()] == ["g0m0t0"]
    assert p.next_chunk() == []  # member 1 would be a second open trajectory
    p.push(_turn(0, 0, 1, 0.3))
    p.push(_end(0, 0, 0.4))
    assert [it.item_id for it in p.next_chunk()] == ["g0m0t1", "g0m0end"]
    assert [it.item_id for it in p.next_chunk()] == ["g0m1t0"]  # member 0 closed
    p.push(_turn(0, 2, 0, 0.5))
    assert p.next_chunk() == []
    p.drop_member(0, member=1)  # member 1 failed: its slot is free
    assert [it.item_id for it in p.next_chunk()] == ["g0m2t0"]
    assert p.open_members_peak == 1
    with pytest.raises(ValueError, match="max_open_members=0"):
        Planner("stream", 1, 1, 5, max_open_members=0)
