"""OPD step times: turns as segments (direct pass per turn, reverse sweep at close) or one-shot.

Work items as the training loop queues them (`algorithms.opd`): one per scored turn and one
closing the member. Two learner granularities (issue 14; `rl.opd_granularity`):

  turn        a turn item is a direct pass over its segment against the trajectory's cache
              (forward, log-probs, direct gradient, K/V cotangents buffered); the closing
              item runs the reverse sweep, in blocks of consecutive segments up to the
              largest segment bucket, newest first.
  trajectory  turn items are kept on the host; the closing item runs the one-shot OPD
              gradient (student log-prob forward + score gradient over the whole trajectory).

`SegmentCost` prices every call by its padded shape, exactly as the learner pads it
(`segment_calls` mirrors `learner.segments`: the segment bucket, the cache slots attended,
the sweep's blocks), from calibration timings; shapes never timed fall back to a least-
squares fit per call kind. A chunk also pays the learner loop's own per-chunk overhead.
The planner runs on a virtual clock (`run_planner`), as for GRPO.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from thundersync_jax.learner.buckets import bucket_length
from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.planner import Planner, WorkItem
from thundersync_jax.schedule.schedules import Schedule
from thundersync_jax.sim._opd_trace import OpdTurn, trajectories, validate_opd_trace
from thundersync_jax.sim._simulate import SimResult, run_planner, step_result

GRANULARITIES = ("turn", "trajectory")
# (kind, padded tokens, cache slots attended, cache capacity); one_shot and hold: zeros after.
CallKey = tuple[str, int, int, int]
HOLD: CallKey = ("hold", 0, 0, 0)  # a `trajectory` turn item: host bookkeeping only


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not valid; choose one of {GRANULARITIES}")
    return granularity


def _past_slots(start: int, cache_buckets: Sequence[int]) -> int:
    return 0 if start == 0 else bucket_length(start, cache_buckets)


def _seg_pad(n: int, seg_buckets: Sequence[int]) -> int:
    return bucket_length(max(n, 2), seg_buckets)


def segment_calls(
    turns: Sequence[OpdTurn], seg_buckets: Sequence[int], cache_buckets: Sequence[int]
) -> tuple[list[CallKey], list[CallKey]]:
    """(one direct call per turn, the sweep's calls at close) the segment learner runs.

    The learner forwards tokens one behind what it has seen (`learner.segments`): turn 0
    forwards tokens − 1 inputs from slot 0, turn j its `tokens` inputs from slot start − 1;
    the cache grows to the bucket holding what it has forwarded. The sweep covers every
    segment but the newest, in blocks of consecutive segments up to the largest segment
    bucket, newest first.
    """
    spans = [(0, t.tokens - 1) if t.turn == 0 else (t.start - 1, t.tokens) for t in turns]
    caps = [bucket_length(max(s + n, 2), cache_buckets) for s, n in spans]
    direct = [
        ("direct", _seg_pad(n, seg_buckets), _past_slots(s, cache_buckets), c)
        for (s, n), c in zip(spans, caps, strict=True)
    ]
    blocks: list[list[tuple[int, int]]] = []
    for s, n in reversed(spans[:-1]):
        size = sum(x for _, x in blocks[-1]) if blocks else math.inf
        if size + n > seg_buckets[-1]:
            blocks.append([])
        blocks[-1].insert(0, (s, n))
    sweep = [
        (
            "sweep",
            _seg_pad(sum(x for _, x in b), seg_buckets),
            _past_slots(b[0][0], cache_buckets),
            caps[-1],
        )
        for b in blocks
    ]
    return direct, sweep


def one_shot_call(turns: Sequence[OpdTurn], seq_buckets: Sequence[int]) -> CallKey:
    """The one-shot OPD gradient of a whole trajectory (log-prob forward + score gradient)."""
    total = turns[-1].start + turns[-1].tokens
    return ("one_shot", bucket_length(total, seq_buckets), 0, 0)


def turn_item_id(traj_id: int, turn: int) -> str:
    return f"{traj_id:09d}t{turn:04d}"


def end_item_id(traj_id: int) -> str:
    return f"{traj_id:09d}z"  # sorts after the trajectory's turns


def opd_items(
    trace: Sequence[OpdTurn],
    payload: Callable[[OpdTurn, bool], object] | None = None,
) -> list[WorkItem]:
    """Planner work items of an OPD step, as the training loop queues them, arrival order.

    One item per scored turn, then one payload-only item closing the member (queued with
    its last turn): under `turn` granularity it runs the reverse sweep, under `trajectory`
    the one-shot gradient (the turn items are then only kept on the host).
    `payload(turn, is_end)` builds each item's payload (default: the `OpdTurn`).
    """
    items = []
    for turns in trajectories(trace).values():
        for t in turns:
            items.append(_item(t, turn_item_id(t.traj_id, t.turn), t.scored, False, payload))
        items.append(_item(turns[-1], end_item_id(turns[-1].traj_id), 0, True, payload))
    return sorted(items, key=lambda it: (it.arrival_s, it.item_id))


def _item(t: OpdTurn, item_id: str, tokens: int, end: bool, payload) -> WorkItem:
    return WorkItem(
        item_id=item_id,
        group=t.group,
        reward=0.0,
        num_tokens=tokens,
        arrival_s=t.arrival_s,
        payload=t if payload is None else payload(t, end),
        closes_member=end,
        member=t.member,
    )


@dataclasses.dataclass(frozen=True)
class SegmentCost:
    """Seconds per padded call shape, the loop's per-chunk overhead and the optimizer step.

    Attributes:
      prices: measured seconds per `CallKey`.
      fits: per call kind, least-squares coefficients on (1, T, T·S) for direct and sweep
        calls (T padded tokens, S cache slots attended) and (1, L, L²) for one-shot calls:
        the price of a shape never timed.
      overhead_s: the learner loop's own time per `turn` chunk (planner, queue poll, host
        copies, accumulator add); one-shot and hold prices are whole chunks timed end to end.
      opt_s: finalize + optimizer step.
      seg_buckets, cache_buckets, seq_buckets: the learner's padding.
    """

    prices: Mapping[CallKey, float]
    fits: Mapping[str, tuple[float, float, float]]
    overhead_s: float
    opt_s: float
    seg_buckets: tuple[int, ...]
    cache_buckets: tuple[int, ...]
    seq_buckets: tuple[int, ...]

    def call_s(self, key: CallKey) -> float:
        if key in self.prices:
            return self.prices[key]
        if key[0] not in self.fits:
            raise ValueError(f"no calibration for call kind {key[0]!r} (key {key})")
        return max(float(np.dot(self.fits[key[0]], _features(key))), 0.0)

    def affine(self) -> SegmentCost:
        """The same model pricing every call by its kind's fit (no per-shape table)."""
        return dataclasses.replace(self, prices={})

    @classmethod
    def fit(
        cls,
        samples: Mapping[CallKey, Sequence[float]],
        overhead: Sequence[float],
        opt: Sequence[float],
        seg_buckets: Sequence[int],
        cache_buckets: Sequence[int],
        seq_buckets: Sequence[int],
        price: Callable[[Sequence[float]], float] = statistics.fmean,
    ) -> SegmentCost:
        """Prices each timed shape by `price` of its samples; fits each kind's fallback."""
        if not opt or not samples:
            raise ValueError("SegmentCost.fit needs timed calls and optimizer steps")
        prices = {tuple(k): float(price(v)) for k, v in samples.items() if v}
        fits = {}
        for kind in {k[0] for k in prices}:
            keys = [k for k in prices if k[0] == kind]
            x = np.asarray([_features(k) for k in keys], np.float64)
            coef, *_ = np.linalg.lstsq(x, np.asarray([prices[k] for k in keys]), rcond=None)
            fits[kind] = tuple(float(c) for c in coef)
        return cls(
            prices,
            fits,
            float(statistics.fmean(overhead)) if overhead else 0.0,
            float(statistics.median(opt)),
            tuple(seg_buckets),
            tuple(cache_buckets),
            tuple(seq_buckets),
        )


def _features(key: CallKey) -> tuple[float, float, float]:
    kind, t, s, _ = key
    return (1.0, float(t), float(t) * (float(t) if kind == "one_shot" else float(s)))


def item_costs(trace: Sequence[OpdTurn], granularity: str, cost: SegmentCost) -> dict[str, float]:
    """Seconds of learner work per work item id (see `opd_items`), overhead included."""
    check_granularity(granularity)
    out = {}
    for tid, turns in trajectories(trace).items():
        if granularity == "trajectory":
            for t in turns:
                out[turn_item_id(tid, t.turn)] = cost.call_s(HOLD)
            out[end_item_id(tid)] = cost.call_s(one_shot_call(turns, cost.seq_buckets))
            continue
        direct, sweep = segment_calls(turns, cost.seg_buckets, cost.cache_buckets)
        for t, call in zip(turns, direct, strict=True):
            out[turn_item_id(tid, t.turn)] = cost.call_s(call) + cost.overhead_s
        out[end_item_id(tid)] = sum(map(cost.call_s, sweep)) + cost.overhead_s
    return out


def opd_planner(trace: Sequence[OpdTurn], schedule: str | Schedule) -> Planner:
    """A one-item-per-chunk planner sized for the trace's groups (each chunk timed alone)."""
    sizes: dict[int, int] = {}
    for t in trace:
        sizes[t.group] = sizes.get(t.group, 0) + t.last
    planner = Planner(
        schedules.get(schedule), max(sizes) + 1, max(sizes.values()), 1, max_chunk_items=1
    )
    for k in range(planner.num_groups):
        for _ in range(planner.group_size - sizes.get(k, 0)):
            planner.drop_member(k)
    return planner


def simulate_opd(
    trace: Sequence[OpdTurn], schedule: str | Schedule, cost: SegmentCost, granularity: str
) -> SimResult:
    """Predicts one OPD step under `schedule` with the learner at `granularity`."""
    schedule = schedules.get(schedule)
    validate_opd_trace(trace)
    costs = item_costs(trace, granularity, cost)
    chunks, end, peak = run_planner(
        opd_planner(trace, schedule),
        opd_items(trace),
        lambda chunk: sum(costs[it.item_id] for it in chunk),
        schedule.pipelined,
    )
    span = max(t.arrival_s for t in trace)
    return step_result(schedule, span, chunks, end, peak, cost.opt_s, 0.0)


def step_time_by_granularity(
    trace: Sequence[OpdTurn], schedule: str | Schedule, cost: SegmentCost
) -> dict[str, float]:
    """Predicted step seconds of `schedule` on `trace` at every granularity."""
    return {g: simulate_opd(trace, schedule, cost, g).step_time_s for g in GRANULARITIES}


def best_granularity(trace: Sequence[OpdTurn], schedule: str | Schedule, cost: SegmentCost) -> str:
    """The granularity the predictor says gives `schedule` the shorter step on `trace`.

    Arrival times matter (under stream a `turn` learner works while tools run, a
    `trajectory` one waits for the close), so pick on the trace as it will be replayed.
    """
    return _shortest(step_time_by_granularity(trace, schedule, cost))


def _shortest(step_times: Mapping[str, float]) -> str:
    return min(GRANULARITIES, key=step_times.__getitem__)  # ties: GRANULARITIES' order


def balance_opd(
    trace: Sequence[OpdTurn], cost: SegmentCost, ratio: float, granularity: str
) -> list[OpdTurn]:
    """Rescales arrival times so that the learner work at `granularity` / rollout span = ratio."""
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio={ratio} must be finite and > 0")
    work = sum(item_costs(trace, granularity, cost).values())
    span = max(t.arrival_s for t in trace)
    if span <= 0 or work <= 0:
        raise ValueError(f"cannot balance: rollout span {span} s and learner work {work} s")
    scale = work / (ratio * span)
    return [t._replace(arrival_s=t.arrival_s * scale) for t in trace]
