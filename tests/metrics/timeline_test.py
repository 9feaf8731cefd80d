"""Timeline recorder and the metrics derived from it."""

import threading
import time

import pytest

from thundersync_jax import metrics, sim
from thundersync_jax.metrics import Timeline
from thundersync_jax.sim import timelines


def _hand_timeline():
    # Batch starts at 100. Rollouts end at 103 (g0m0), 105 (g0m1), 109 (g1m0).
    tl = Timeline(start_s=100.0, schedule="stream")
    tl.record("rollout", 100, 103, traj_id=0, group=0, member=0, tokens=30, reward=1.0)
    tl.record("rollout", 100, 105, traj_id=1, group=0, member=1, tokens=50, reward=0.0)
    tl.record("rollout", 100, 109, traj_id=2, group=1, member=0, tokens=90, reward=1.0)
    tl.record("chunk", 103, 104, reason="open", group=0, ids=(0,))
    tl.record("chunk", 105, 107, reason="closed", group=0, ids=(1,))
    tl.record("chunk", 109, 110, reason="closed", group=1, ids=(2,))
    tl.record("opt", 110, 110.5)
    tl.record("publish", 110.5, 111)
    tl.record("verify", 104, 105)  # not learner work: ignored by the metrics
    return tl


def test_metrics_by_hand():
    m = metrics.step_metrics(_hand_timeline())
    # Busy 1 + 2 + 1 + 0.5 + 0.5 = 5 of an 11 s step; last reward 109 → published 111.
    assert m == pytest.approx(
        {
            "step_time_s": 11.0,
            "rollout_time_s": 9.0,
            "learner_busy_s": 5.0,
            "learner_idle_frac": 6.0 / 11.0,
            "tail_s": 2.0,
            "publish_s": 0.5,
            "open_groups_peak": 1,
        }
    )


def test_overlapping_learner_intervals_count_once_and_are_clipped():
    tl = Timeline(start_s=0.0)
    tl.record("rollout", 0, 1, group=0)
    tl.record("chunk", -1, 2, group=0, ids=(0,))  # started before the batch: clipped at 0
    tl.record("chunk", 1, 3, group=0, ids=())
    tl.record("publish", 3, 4)
    assert metrics.learner_busy_s(tl) == pytest.approx(4.0)
    assert metrics.learner_idle_frac(tl) == pytest.approx(0.0)


def test_open_groups_peak_counts_partial_tallies_after_each_handout():
    tl = Timeline(start_s=0.0)
    for k in range(3):
        for m in range(2):
            tl.record("rollout", 0, 1, group=k, member=m)
    tl.record("chunk", 1, 2, group=0, ids=(0,))  # g0 1/2 → {g0}
    tl.record("chunk", 2, 3, group=1, ids=(2,))  # g1 1/2 → {g0, g1}
    tl.record("chunk", 3, 4, group=2, ids=(4, 5))  # g2 whole in one chunk: never open
    tl.record("chunk", 4, 5, group=0, ids=(1,))  # g0 done → {g1}
    assert metrics.open_groups_peak(tl) == 2
    assert metrics.open_groups_peak(tl, group_sizes={0: 1, 1: 1, 2: 2}) == 0


def test_missing_publish_and_bad_intervals_are_errors():
    tl = Timeline(start_s=0.0)
    tl.record("rollout", 0, 1)
    with pytest.raises(ValueError, match="no 'publish' event"):
        metrics.step_time_s(tl)
    with pytest.raises(ValueError, match="start <= end"):
        tl.record("chunk", 2.0, 1.0)


def test_record_is_thread_safe():
    tl = Timeline(start_s=0.0)

    def worker(k):
        for i in range(500):
            tl.record("rollout", i, i + 1, group=k, member=i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tl) == 4000
    assert sorted((e.attrs["group"], e.attrs["member"]) for e in tl.events()) == [
        (k, i) for k in range(8) for i in range(500)
    ]


def test_span_records_wall_time():
    tl = Timeline()
    with tl.span("chunk", group=0, ids=(1,)):
        time.sleep(0.02)
    (e,) = tl.events("chunk")
    assert e.end - e.start >= 0.02
    assert e.start >= tl.start_s


@pytest.mark.parametrize("schedule", sim.SCHEDULES)
def test_timeline_metrics_agree_with_the_simulator(schedule):
    trace = sim.lognormal_trace(6, 5, sigma=1.0, group_icc=0.3, mean_s=20.0, seed=1)
    cost = sim.CostModel(0.2, 0.002, opt_s=1.0, pub_s=0.5, buckets=(512, 1024, 2048))
    r = sim.simulate(trace, schedule, cost, 2048, max_open_groups=3)
    m = metrics.step_metrics(timelines.timeline_from_sim(trace, r))
    assert m["step_time_s"] == pytest.approx(r.step_time_s)
    assert m["rollout_time_s"] == pytest.approx(r.rollout_span_s)
    assert m["learner_busy_s"] == pytest.approx(r.learner_busy_s)
    assert m["learner_idle_frac"] == pytest.approx(r.learner_idle_frac)
    assert m["tail_s"] == pytest.approx(r.tail_s)
    assert m["publish_s"] == pytest.approx(0.5)
    assert m["open_groups_peak"] == r.open_groups_peak
