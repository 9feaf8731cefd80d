"""Step timeline: what every rollout and the learner did during one batch, and derived metrics.

Events are intervals on a shared clock. Kinds with meaning to the helpers:

  "rollout"  one trajectory, from its start to its reward being known; attrs
             traj_id, group, member, tokens, reward (what the trace export needs).
  "chunk"    one learner chunk; attrs reason (why it ran: batch | group | closed |
             differing | open), group, ids (traj_ids it processed).
  "opt"      the optimizer step.
  "publish"  writing the new weights for the rollout side.

Other kinds (e.g. "verify", "load_weights") are kept and exported to the Chrome
trace but ignored by the metrics. Times are seconds; helpers report them
relative to `Timeline.start_s`, the batch start.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, NamedTuple

ROLLOUT = "rollout"
CHUNK = "chunk"
OPT = "opt"
PUBLISH = "publish"
LEARNER_KINDS = (CHUNK, OPT, PUBLISH)


class Event(NamedTuple):
    """One recorded interval.

    Attributes:
      kind: what happened (see module docstring).
      start: clock time it began.
      end: clock time it ended (>= start).
      attrs: free-form details (JSON-friendly values).
    """

    kind: str
    start: float
    end: float
    attrs: dict[str, Any]


class Timeline:
    """Thread-safe recorder of one batch's events.

    Args:
      start_s: the batch start on the recording clock; None means "now" on
        time.perf_counter, the clock `span` uses.
      schedule: the schedule that produced it (shown in plots).
    """

    def __init__(self, start_s: float | None = None, schedule: str | None = None):
        self.start_s = time.perf_counter() if start_s is None else float(start_s)
        self.schedule = schedule
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def record(self, kind: str, start: float, end: float, **attrs: Any) -> Event:
        """Adds one interval [start, end] on the timeline's clock."""
        if not kind:
            raise ValueError("record: kind must be a non-empty string")
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise ValueError(f"record({kind!r}): need finite start <= end, got {start}, {end}")
        event = Event(kind, float(start), float(end), dict(attrs))
        with self._lock:
            self._events.append(event)
        return event

    @contextlib.contextmanager
    def span(self, kind: str, **attrs: Any) -> Iterator[None]:
        """Records the wall time (time.perf_counter) of the `with` body as one event."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(kind, start, time.perf_counter(), **attrs)

    def events(self, kind: str | None = None) -> list[Event]:
        """A snapshot of the events (of one kind), sorted by start time."""
        with self._lock:
            evs = list(self._events)
        if kind is not None:
            evs = [e for e in evs if e.kind == kind]
        return sorted(evs, key=lambda e: (e.start, e.end))

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)


def _published_at(tl: Timeline) -> float:
    pubs = tl.events(PUBLISH)
    if not pubs:
        raise ValueError("timeline has no 'publish' event: the step has not finished")
    return max(e.end for e in pubs)


def _last_reward_at(tl: Timeline) -> float:
    rolls = tl.events(ROLLOUT)
    if not rolls:
        raise ValueError("timeline has no 'rollout' event")
    return max(e.end for e in rolls)


def step_time_s(tl: Timeline) -> float:
    """Batch start → weights published."""
    return _published_at(tl) - tl.start_s


def rollout_time_s(tl: Timeline) -> float:
    """Batch start → last reward known."""
    return _last_reward_at(tl) - tl.start_s


def tail_s(tl: Timeline) -> float:
    """Last reward known → weights published."""
    return _published_at(tl) - _last_reward_at(tl)


def publish_s(tl: Timeline) -> float:
    """Total time spent publishing weights."""
    return sum(e.end - e.start for e in tl.events(PUBLISH))


def learner_busy_s(tl: Timeline) -> float:
    """Time the learner spent on chunks, the optimizer step or publication in the step.

    Overlapping learner intervals count once; only [batch start, published] counts.
    """
    lo, hi = tl.start_s, _published_at(tl)
    intervals = sorted(
        (max(e.start, lo), min(e.end, hi))
        for e in tl.events()
        if e.kind in LEARNER_KINDS and e.end > lo and e.start < hi
    )
    busy, cur_start, cur_end = 0.0, None, None
    for s, e in intervals:
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy


def learner_idle_frac(tl: Timeline) -> float:
    """Learner idle time between batch start and weights published, over the step time."""
    total = step_time_s(tl)
    return (total - learner_busy_s(tl)) / total if total > 0 else 0.0


def open_groups_peak(tl: Timeline, group_sizes: dict[int, int] | None = None) -> int:
    """Most groups holding a partial tally (some members processed, not all).

    Counted after each chunk is handed out, i.e. at chunk starts: a group whose
    whole membership runs in one chunk never counts. Group sizes default to the
    number of rollout events per group.
    """
    if group_sizes is None:
        group_sizes = Counter(e.attrs["group"] for e in tl.events(ROLLOUT))
    taken: Counter = Counter()
    open_now: set[int] = set()
    peak = 0
    for e in tl.events(CHUNK):
        k = e.attrs["group"]
        if k not in group_sizes:
            raise ValueError(
                f"chunk of group {k} but no size for it (known: {sorted(group_sizes)})"
            )
        taken[k] += len(e.attrs["ids"])
        if taken[k] < group_sizes[k]:
            open_now.add(k)
        else:
            open_now.discard(k)
        peak = max(peak, len(open_now))
    return peak


def step_metrics(tl: Timeline) -> dict[str, float]:
    """The timeline-derived per-step metrics of DESIGN §6."""
    return {
        "step_time_s": step_time_s(tl),
        "rollout_time_s": rollout_time_s(tl),
        "learner_busy_s": learner_busy_s(tl),
        "learner_idle_frac": learner_idle_frac(tl),
        "tail_s": tail_s(tl),
        "publish_s": publish_s(tl),
        "open_groups_peak": open_groups_peak(tl),
    }
