"""`rl.opd_granularity="auto"`: each step's granularity picked by the step-time predictor.

Granularity never changes the update (`turn` and `trajectory` both give the one-shot
gradient), only how long the learner takes, so the choice may change from step to step.
What one step teaches the chooser (`StepRecord`, threaded in the OPD batch state):

* its turn trace: every scored turn's (group, member, turn, arrival in seconds from the batch
  start, the trajectory's length up to the turn, scored tokens), which `step_trace` turns
  into `sim.OpdTurn`s exactly as the learner folds them (turn order, lost turns' tokens in
  the next segment);
* the learner calls of the granularity that ran, each timed once its result is ready, and
  every chunk's wall time; `step_samples` keys each call by `sim.CallKey` as the predictor
  prices it (`sim.segment_calls`, `sim.one_shot_call`, `sim._opd.HOLD`). A chunk's time
  beyond its calls is the loop's overhead: per item under `turn` (`SegmentCost.overhead_s`),
  spread over the chunk's calls under `trajectory` (one-shot and hold prices are whole chunks).
  A sweep of several blocks is one timed call: its time is split over the blocks by padded
  tokens. A call during which something compiled gives no sample (the first steps compile
  every new shape; such a shape is priced by its kind's fit until it is timed again).

`AutoState` pools the samples of recent steps (bounded per shape) and keeps the last step's
trace. `choose`: with no timings the old rule (`trajectory` under a schedule whose learner
waits for the whole batch, else `turn`), then once the other granularity (exploration); from
then on `sim.simulate_opd` of both on the last step's trace with `sim.SegmentCost.fit` of the
pool (its per-kind least-squares fit prices shapes never timed) and the shorter one, as
`sim.best_granularity` picks. The optimizer step and publication are the same under both
and are left out of the predicted step times. Everything here is pure; the loop threads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from thundersync_jax import sim
from thundersync_jax.schedule import schedules

MAX_SAMPLES_PER_SHAPE = 16  # newest kept per CallKey: recent steps' speed, bounded memory
MAX_OVERHEAD_SAMPLES = 64


class TurnArrival(NamedTuple):
    """One scored turn as it reached the learner (host numbers).

    Attributes:
      group, member: the trajectory's (group, member).
      turn: the turn's index in its episode.
      arrival_s: seconds from the batch start (`WorkItem.arrival_s`, the timeline's clock).
      length: tokens of the trajectory up to the turn's last sampled token.
      scored: the turn's scored tokens.
    """

    group: int
    member: int
    turn: int
    arrival_s: float
    length: int
    scored: int


class CallTiming(NamedTuple):
    """One timed learner call: a turn folded in (`fold`) or a trajectory closed (`close`).

    chunk: index of the chunk it ran in (`StepRecord.chunks`), -1 outside any (batch end).
    compiled: a jitted function compiled during the call: its time is no price of the shape.
    """

    group: int
    member: int
    kind: str
    seconds: float
    chunk: int
    compiled: bool = False


class StepRecord(NamedTuple):
    """What one step teaches the chooser (see module doc); tuples, never mutated.

    chunks: (wall seconds of the chunk's `process`, its items) per chunk, in order.
    ends: (group, member, arrival_s) of every member-closing item (`MemberEnd`, `MemberLost`).
    """

    granularity: str
    arrivals: tuple[TurnArrival, ...] = ()
    calls: tuple[CallTiming, ...] = ()
    chunks: tuple[tuple[float, int], ...] = ()
    ends: tuple[tuple[int, int, float], ...] = ()


class Buckets(NamedTuple):
    """The learner's padding: segment lengths, cache capacities, one-shot sequence lengths."""

    seg: tuple[int, ...]
    cache: tuple[int, ...]
    seq: tuple[int, ...]


class Samples(NamedTuple):
    """One step's timed calls per `sim.CallKey` and loop overheads per item."""

    granularity: str
    calls: Mapping[sim.CallKey, tuple[float, ...]]
    overhead: tuple[float, ...]


class AutoState(NamedTuple):
    """The chooser's memory across steps (small: host numbers only).

    Attributes:
      buckets: the learner's padding (`Buckets`).
      calls: pooled seconds per `sim.CallKey`, newest last, at most MAX_SAMPLES_PER_SHAPE each.
      overhead: pooled loop overheads per `turn` item, at most MAX_OVERHEAD_SAMPLES.
      timed: the granularities whose calls have been timed.
      trace: the last observed step's turns (`sim.OpdTurn`).
    """

    buckets: Buckets
    calls: Mapping[sim.CallKey, tuple[float, ...]] = {}
    overhead: tuple[float, ...] = ()
    timed: frozenset = frozenset()
    trace: tuple[sim.OpdTurn, ...] = ()


class Choice(NamedTuple):
    """A step's granularity; predicted: granularity -> predicted step seconds, or None."""

    granularity: str
    predicted: Mapping[str, float] | None
    reason: str


def step_trace(arrivals, ends=()) -> tuple[list[sim.OpdTurn], dict[tuple[int, int], int]]:
    """(the step's turns as `sim.OpdTurn`s, (group, member) -> traj id).

    Turns in turn order per trajectory, renumbered 0..n-1 (a lost turn's tokens open the
    next segment, as in the learner); a turn's arrival is at least its predecessor's (the
    learner folds it only after that one). The predictor queues a member's closing item with
    its last turn, but the episode ends later (the verifier runs after the last turn): the
    last turn arrives no earlier than its member's end (`ends`: (group, member, arrival_s)),
    so the rollout span and the close (sweep or one-shot gradient) are where they were.
    `scored` only sizes the planner's items, so it is clamped into the trace's [1, tokens).
    """
    by_member: dict[tuple[int, int], list[TurnArrival]] = {}
    for a in arrivals:
        by_member.setdefault((a.group, a.member), []).append(a)
    end_at = {(g, m): float(t) for g, m, t in ends}
    trace, ids = [], {}
    for tid, key in enumerate(sorted(by_member)):
        ids[key] = tid
        turns = sorted(by_member[key], key=lambda a: a.turn)
        pos, prev = 0, 0.0
        for j, a in enumerate(turns):
            tokens = int(a.length) - pos
            prev = max(float(a.arrival_s), prev)
            if j == len(turns) - 1:
                prev = max(prev, end_at.get(key, 0.0))
            scored = max(1, min(int(a.scored), tokens - 1))
            trace.append(sim.OpdTurn(tid, *key, j, prev, pos, tokens, scored, j == len(turns) - 1))
            pos = int(a.length)
    return trace, ids


def step_samples(record: StepRecord, buckets: Buckets) -> tuple[list[sim.OpdTurn], Samples]:
    """(the step's trace, its calls keyed as `sim.SegmentCost` prices them); see module doc."""
    trace, ids = step_trace(record.arrivals, record.ends)
    by_traj = sim.trajectories(trace)
    in_chunk = [0.0] * len(record.chunks)
    calls_in_chunk = [0] * len(record.chunks)
    for c in record.calls:
        if c.chunk >= 0:
            in_chunk[c.chunk] += c.seconds
            calls_in_chunk[c.chunk] += 1
    leftover = [max(w - s, 0.0) for (w, _), s in zip(record.chunks, in_chunk, strict=True)]
    overhead = tuple(x / max(n, 1) for x, (_, n) in zip(leftover, record.chunks, strict=True))
    spread = [x / max(n, 1) for x, n in zip(leftover, calls_in_chunk, strict=True)]
    folds: dict[int, list[CallTiming]] = {}
    closes: dict[int, CallTiming] = {}
    for c in record.calls:
        tid = ids.get((c.group, c.member))
        if tid is None:  # a member lost before any turn: nothing ran
            continue
        if c.kind == "fold":
            folds.setdefault(tid, []).append(c)
        else:
            closes[tid] = c
    out: dict[sim.CallKey, list[float]] = {}
    for tid, turns in by_traj.items():
        if len(folds.get(tid, ())) != len(turns) or tid not in closes:
            raise ValueError(
                f"trajectory {tid}: {len(folds.get(tid, ()))} timed folds and "
                f"{int(tid in closes)} closes for {len(turns)} turns (one each expected)"
            )
        if record.granularity == "trajectory":
            keyed = [(sim._opd.HOLD, c) for c in folds[tid]]
            keyed.append((sim.one_shot_call(turns, buckets.seq), closes[tid]))
            for key, c in keyed:
                if not c.compiled:
                    extra = spread[c.chunk] if c.chunk >= 0 else 0.0
                    out.setdefault(key, []).append(c.seconds + extra)
            continue
        direct, sweep = sim.segment_calls(turns, buckets.seg, buckets.cache)
        for key, c in zip(direct, folds[tid], strict=True):
            if not c.compiled:
                out.setdefault(key, []).append(c.seconds)
        padded = sum(k[1] for k in sweep)
        for key in sweep if not closes[tid].compiled else ():  # split by padded tokens
            out.setdefault(key, []).append(closes[tid].seconds * key[1] / padded)
    if record.granularity == "trajectory":
        overhead = ()
    calls = {k: tuple(v) for k, v in out.items()}
    return trace, Samples(record.granularity, calls, overhead)


def observe(state: AutoState, trace, samples: Samples) -> AutoState:
    """The state with one step's samples pooled (bounded) and its trace kept for `choose`."""
    calls = dict(state.calls)
    for key, ts in samples.calls.items():
        calls[key] = (*calls.get(key, ()), *ts)[-MAX_SAMPLES_PER_SHAPE:]
    # Ran, even if every call compiled: `choose` re-runs it if a call kind is still untimed.
    return state._replace(
        calls=calls,
        overhead=(*state.overhead, *samples.overhead)[-MAX_OVERHEAD_SAMPLES:],
        timed=state.timed | {samples.granularity},
        trace=tuple(trace) if trace else state.trace,
    )


def rule_granularity(schedule: str | schedules.Schedule) -> str:
    """The choice with nothing timed: `trajectory` where the learner waits for the whole
    batch (sync: nothing to overlap, and one one-shot gradient per trajectory is about half
    the work of direct passes plus a sweep), `turn` where it works while tools run."""
    return "trajectory" if schedules.get(schedule).ready_when == "batch" else "turn"


def choose(state: AutoState | None, schedule: str | schedules.Schedule) -> Choice:
    """This step's granularity from what earlier steps taught (see module doc)."""
    first = rule_granularity(schedule)
    if state is None or not state.timed:
        return Choice(first, None, "explore: nothing timed yet, the rule")
    if len(state.timed) < len(sim.GRANULARITIES):
        other = next(g for g in sim.GRANULARITIES if g not in state.timed)
        return Choice(other, None, f"explore: {other} not timed yet")
    try:
        sim.validate_opd_trace(state.trace)
    except ValueError as e:
        return Choice(first, None, f"the rule: the last trace cannot be replayed ({e})")
    b = state.buckets
    cost = sim.SegmentCost.fit(state.calls, state.overhead, [0.0], b.seg, b.cache, b.seq)
    for g in sim.GRANULARITIES:  # a call kind the pool lacks: time that granularity again
        kinds = {k[0] for k in _calls_of(state.trace, g, b)}
        if not kinds <= set(cost.fits):
            return Choice(g, None, f"explore: {g} needs untimed {sorted(kinds - set(cost.fits))}")
    predicted = sim.step_time_by_granularity(state.trace, schedule, cost)
    best = min(sim.GRANULARITIES, key=predicted.__getitem__)  # sim.best_granularity's order
    return Choice(best, predicted, "predicted")


def _calls_of(trace, granularity: str, b: Buckets) -> list[sim.CallKey]:
    """Every call the learner runs for `trace` at `granularity`."""
    out: list[sim.CallKey] = []
    for turns in sim.trajectories(trace).values():
        if granularity == "trajectory":
            out += [sim._opd.HOLD] * len(turns) + [sim.one_shot_call(turns, b.seq)]
        else:
            direct, sweep = sim.segment_calls(turns, b.seg, b.cache)
            out += direct + sweep
    return out
