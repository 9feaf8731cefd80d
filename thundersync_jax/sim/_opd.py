"""OPD step times: turns as segments (direct pass per turn, reverse sweep at close) or one-shot.

Two learner granularities (issue 14; `learner.segments`):

  turn        every scored turn is one work item: a direct pass over its segment against
              the trajectory's cache (forward, log-probs, direct gradient, K/V cotangents
              buffered); the trajectory's last turn also runs the reverse sweep, in blocks
              of consecutive segments up to the largest segment bucket, newest first.
  trajectory  one item per trajectory, ready at its last turn: the one-shot OPD gradient
              (student log-prob forward + score gradient over the whole trajectory).

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
CallKey = tuple[str, int, int]  # (kind, padded tokens, cache slots attended); one_shot: 0 slots


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
) -> list[list[CallKey]]:
    """Per turn of one trajectory, the padded calls the segment learner runs for it.

    The learner forwards tokens one behind what it has seen (`learner.segments`): turn 0
    forwards tokens − 1 inputs from slot 0, turn j its `tokens` inputs from slot start − 1.
    The last turn's list ends with the sweep's blocks (every segment but the newest).
    """
    spans = [(0, t.tokens - 1) if t.turn == 0 else (t.start - 1, t.tokens) for t in turns]
    calls = [
        [("direct", _seg_pad(n, seg_buckets), _past_slots(s, cache_buckets))] for s, n in spans
    ]
    blocks: list[list[tuple[int, int]]] = []
    for s, n in reversed(spans[:-1]):
        size = sum(x for _, x in blocks[-1]) if blocks else math.inf
        if size + n > seg_buckets[-1]:
            blocks.append([])
        blocks[-1].insert(0, (s, n))
    for b in blocks:
        start, n = b[0][0], sum(x for _, x in b)
        calls[-1].append(("sweep", _seg_pad(n, seg_buckets), _past_slots(start, cache_buckets)))
    return calls


def one_shot_call(turns: Sequence[OpdTurn], seq_buckets: Sequence[int]) -> CallKey:
    """The one-shot OPD gradient's padded call for a whole trajectory."""
    total = turns[-1].start + turns[-1].tokens
    return ("one_shot", bucket_length(total, seq_buckets), 0)


def opd_items(
    trace: Sequence[OpdTurn],
    granularity: str,
    payload: Callable[[list[OpdTurn], OpdTurn], object] | None = None,
) -> list[WorkItem]:
    """Planner work items of an OPD step, arrival order.

    turn: one per turn (only the last closes its member); trajectory: one per trajectory at
    its last turn's arrival. `payload(turns_so_far, turn)` builds each item's payload (the
    benchmark's token arrays); default the item's (last) `OpdTurn`.
    """
    check_granularity(granularity)
    items = []
    for turns in trajectories(trace).values():
        picked = turns if granularity == "turn" else turns[-1:]
        for t in picked:
            upto = turns[: t.turn + 1]
            items.append(
                WorkItem(
                    item_id=f"{t.traj_id:09d}t{t.turn:04d}"
                    if granularity == "turn"
                    else f"{t.traj_id:09d}",
                    group=t.group,
                    reward=0.0,
                    num_tokens=t.scored if granularity == "turn" else sum(u.scored for u in upto),
                    arrival_s=t.arrival_s,
                    payload=t if payload is None else payload(upto, t),
                    closes_member=t.last,
                    member=t.member,
                )
            )
    return sorted(items, key=lambda it: (it.arrival_s, it.item_id))


@dataclasses.dataclass(frozen=True)
class SegmentCost:
    """Seconds per padded call shape, the loop's per-chunk overhead and the optimizer step.

    Attributes:
      prices: measured seconds per `CallKey`.
      fits: per call kind, least-squares coefficients on (1, T, T·S) for direct and sweep
        calls (T padded tokens, S cache slots attended) and (1, L, L²) for one-shot calls:
        the price of a shape never timed.
      overhead_s: the learner loop's own time per `turn` chunk (planner, queue poll, host
        copies, accumulator add); one-shot prices are whole chunks timed end to end.
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
        prices = {k: float(price(v)) for k, v in samples.items() if v}
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
    kind, t, s = key
    return (1.0, float(t), float(t) * (float(t) if kind == "one_shot" else float(s)))


def item_costs(trace: Sequence[OpdTurn], granularity: str, cost: SegmentCost) -> dict[str, float]:
    """Seconds of learner work per work item id (see `opd_items`), overhead included."""
    check_granularity(granularity)
    out = {}
    for tid, turns in trajectories(trace).items():
        if granularity == "trajectory":
            key = one_shot_call(turns, cost.seq_buckets)
            out[f"{tid:09d}"] = cost.call_s(key)  # timed as whole chunks: overhead included
            continue
        calls_per_turn = segment_calls(turns, cost.seg_buckets, cost.cache_buckets)
        for t, calls in zip(turns, calls_per_turn, strict=True):
            out[f"{tid:09d}t{t.turn:04d}"] = sum(map(cost.call_s, calls)) + cost.overhead_s
    return out


def opd_planner(trace: Sequence[OpdTurn], schedule: str | Schedule) -> Planner:
    """A one-item-per-chunk planner sized for the trace's groups."""
    sizes: dict[int, int] = {}
    for t in trace:
        sizes[t.group] = sizes.get(t.group, 0) + t.last
    planner = Planner(schedules.get(schedule), max(sizes) + 1, max(sizes.values()), 1)
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
        opd_items(trace, granularity),
        lambda chunk: sum(costs[it.item_id] for it in chunk),
        schedule.pipelined,
    )
    span = max(t.arrival_s for t in trace)
    return step_result(schedule, span, chunks, end, peak, cost.opt_s, 0.0)


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
