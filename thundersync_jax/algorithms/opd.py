"""On-policy distillation behind the loop's algorithm interface: teacher-scored turns.

Every sampled turn goes to the teacher (its own engine process, `teacher.start_teacher`)
while the turn's tool call runs; once scored it is a `WorkItem` (payload `TurnPayload`). A
member is closed by one item queued after all of its turns (payload `MemberEnd`: its reward
for the metrics and how many turns it emitted), or, when it fails, by a `MemberLost` item
before its `MemberFailed`. The learner (DESIGN §2: log-probs from the learner's forward, never
from the sampler; Â_t = −(log π_s − log π_T)(o_t) a plain number, no gradient through it)
folds the turns of each trajectory in at `rl.opd_granularity` (`_opd_trajectories`):

* `turn` (default): each scored turn runs forward over its new tokens only, against the
  trajectory's own KV cache at the batch θ (`learner.segments`); that forward gives log π_s for
  Â, its direct gradient goes into `accumulators.opd()` at once, and its cached keys'/values'
  cotangents wait in a buffer for one reverse sweep when the trajectory closes: linear cost
  in the turn count;
* `trajectory`: one gradient of the whole trajectory when it closes;
* `auto`: picked per step by the step-time predictor (`_opd_auto`): from the previous
  step's turn trace and the learner calls timed so far, `sim.simulate_opd` of both
  granularities and the shorter one; the first two steps explore (the rule `trajectory`
  under sync, `turn` otherwise, then the other one). The choice travels to the next step's
  `init` as the learner's `carry` (host numbers only).

finalize = −(1/N) Σ h over the batch's N scored tokens: the batch-synchronous update in every
schedule and granularity. `rl.kl_coef` and `rl.entropy_coef` add their terms over the
trajectory's scored tokens when it closes (`algorithms._terms`). The forward that gives log π_s
(the segment's direct pass, or the whole trajectory's score gradient) also gives the
engine/learner log-prob gap of the scored tokens (the `engine_logprob_gap_*` metrics) and, with
`rl.tis_cap`, their truncated importance weights: no extra forward.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import jax

from thundersync_jax import accumulators
from thundersync_jax.algorithms import _opd_auto as _auto
from thundersync_jax.algorithms import _opd_trajectories as _trajs
from thundersync_jax.algorithms import _terms
from thundersync_jax.algorithms._opd_config import check_config
from thundersync_jax.algorithms._opd_episodes import (  # noqa: F401  (re-exported)
    TEACHER,
    TurnPayload,
    episode_work,
    start_teacher,
)
from thundersync_jax.algorithms.base import (
    Algorithm,
    BatchLearner,
    BatchPolicy,
    LearnerSetup,
    MemberEnd,
    MemberLost,
    item_lag,
)
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.losses.logprob_gap import GapTally
from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.batch_tally import BatchTally, tally_metrics
from thundersync_jax.schedule.planner import WorkItem

log = logging.getLogger(__name__)


class OpdState(NamedTuple):
    """Per-batch OPD learner state.

    Attributes:
      acc: the accumulator's state (`accumulators.opd`, combined with terms when enabled).
      policy: the batch's policy (params, base, version).
      tally: tokens, rewards, lags (per turn) and verifier failures so far.
      turns: scored turns that arrived.
      reverse_kl_sum: Σ over scored tokens of (log π_s − log π_T)(o_t), float64.
      open: (group, member) -> `OpenTrajectory`, the trajectories not yet closed (a new dict
        per state: states are never mutated).
      kept_bytes_peak: peak device bytes of the open trajectories' caches and buffers.
      granularity: this batch's `rl.opd_granularity`, resolved ("turn" or "trajectory").
      gap: the engine/learner log-prob gap sums so far.
      record: under `auto`, the step's turn arrivals and timed calls (`_opd_auto.StepRecord`),
        else None.
      auto_in: under `auto`, the chooser's state from earlier steps (the previous `carry`).
      choice: under `auto`, this batch's `_opd_auto.Choice`.
    """

    acc: Any
    policy: BatchPolicy
    tally: BatchTally
    turns: int
    reverse_kl_sum: float
    open: dict = {}
    kept_bytes_peak: int = 0
    granularity: str = "turn"
    gap: GapTally = GapTally()
    record: _auto.StepRecord | None = None
    auto_in: _auto.AutoState | None = None
    choice: _auto.Choice | None = None


def batch_learner(
    acc,
    score_fn,
    pad_id: int,
    regularizer_fn=None,
    *,
    segment_fns=None,
    granularity: str = "turn",
    schedule=None,
) -> BatchLearner:
    """The OPD `BatchLearner` over `accumulators.opd()` (token-mean).

    Args:
      score_fn: the score-gradient chunk function (`trajectory` granularity).
      segment_fns: `learner.segments.SegmentFns` of the same model (`turn` granularity).
      granularity: `rl.opd_granularity` (see `_opd_trajectories`); `auto` is chosen per batch
        (`_opd_auto.choose`) from the `carry` handed to `init`.
      schedule: the run's `schedules.Schedule` (for `auto`).
    """
    learner = _OpdLearner(acc, score_fn, pad_id, regularizer_fn, segment_fns, granularity, schedule)
    return BatchLearner(
        init=learner.init,
        process=learner.process,
        close_groups=learner.close_groups,
        finalize=learner.finalize,
        metrics=learner.metrics,
        compiles=learner.compiles,
        accumulator_state=lambda state: state.acc,
        kept_bytes_peak=lambda state: int(state.kept_bytes_peak),
        carry=learner.carry,
    )


class _Folded(NamedTuple):
    """What folding some of one trajectory's turns added: to the tally, the KL sum, the gap."""

    tokens: int = 0
    log_ratio: float = 0.0
    gap: GapTally = GapTally()

    def add(self, folded) -> _Folded:
        gap = self.gap if folded.gap is None else self.gap.add(folded.gap)
        return _Folded(self.tokens + folded.tokens, self.log_ratio + folded.log_ratio_sum, gap)


class _OpdLearner:
    """The fixed pieces of the OPD learner (built once per run); every method is a pure
    function of the `OpdState` it is given, apart from counting `add`'s compilations."""

    def __init__(self, acc, score_fn, pad_id, regularizer_fn, segment_fns, granularity, schedule):
        self.granularity = _trajs.check_granularity(granularity)
        if self.granularity != "trajectory" and segment_fns is None:
            raise ValueError(
                f"opd_granularity={granularity!r} needs segment_fns (learner.segments)"
            )
        self.acc, self.score_fn, self.segment_fns = acc, score_fn, segment_fns
        self.logprob_fn = TokenLogprobFn(score_fn)
        self.add_traces = 0  # compilations of `add` (not in `compiles`: `auto` skips their timings)
        self.add = jax.jit(self._add_weighted, donate_argnums=0)
        self.add_terms = _terms.TermAdder(acc, regularizer_fn)
        add = self.add
        self.folders = {
            "trajectory": _trajs.WholeTrajectory(score_fn, self.logprob_fn, add, pad_id)
        }
        if segment_fns is not None:
            self.folders["turn"] = _trajs.TurnSegments(segment_fns, add)
        self.schedule, self.padding = schedule, None
        if self.granularity == "auto":
            if schedule is None:
                raise ValueError("opd_granularity='auto' needs the run's schedule (schedule=None)")
            self.padding = _auto.Buckets(
                segment_fns.seg_buckets, segment_fns.cache_buckets, tuple(score_fn.seq_buckets)
            )

    def _add_weighted(self, *args):
        self.add_traces += 1  # runs once per trace
        return self.acc.add_weighted(*args)

    def init(
        self, params, version: int, base_params=None, enforce_version: bool = True, carry=None
    ) -> OpdState:
        """carry: the previous batch's `carry(state)` (`auto`'s memory), or None."""
        policy = BatchPolicy(params, base_params, int(version), bool(enforce_version))
        state = OpdState(self.acc.init(params), policy, BatchTally(), 0, 0.0, {}, 0)
        if self.granularity != "auto":
            return state._replace(granularity=self.granularity)
        choice = _auto.choose(carry, self.schedule)
        times = ", ".join(f"{g} {s:.3f} s" for g, s in (choice.predicted or {}).items())
        log.info("OPD granularity at version %d: %s (%s%s)", version, choice.granularity,
                 choice.reason, f"; predicted {times}" if times else "")  # fmt: skip
        record = _auto.StepRecord(choice.granularity)
        return state._replace(
            granularity=choice.granularity, record=record, auto_in=carry, choice=choice
        )

    def carry(self, state: OpdState):
        """What the next batch's `init` needs (`auto`: the chooser's state), else None."""
        if state.record is None:
            return None
        trace, samples = _auto.step_samples(state.record, self.padding)
        return _auto.observe(state.auto_in or _auto.AutoState(self.padding), trace, samples)

    def compiles(self) -> int:
        seg = 0 if self.segment_fns is None else int(self.segment_fns.compiles)
        return (
            int(self.score_fn.compiles) + self.logprob_fn.compiles + self.add_terms.compiles + seg
        )

    # `auto` times every fold and close; the other granularities time nothing.

    def _clock(self, state: OpdState) -> tuple | None:
        """(perf_counter, compilations so far) under `auto`; None otherwise."""
        return None if state.record is None else (time.perf_counter(), self._traced())

    def _traced(self) -> int:
        return self.compiles() + self.add_traces

    def _timed(self, state: OpdState, key, kind: str, start: tuple | None, chunk: int) -> OpdState:
        """The state with one call timed from `start` = `_clock(state)` on."""
        if start is None:
            return state
        seconds, compiled = time.perf_counter() - start[0], self._traced() != start[1]
        call = _auto.CallTiming(*key, kind, seconds, chunk, compiled)
        return state._replace(record=state.record._replace(calls=(*state.record.calls, call)))

    def _advance(self, state: OpdState, key, flush_all: bool = False, chunk: int = -1) -> OpdState:
        """Folds in the member's turns that can go now; closes it once it is complete.

        Under `auto` each fold and close is timed once its result is ready (`chunk`: the
        chunk's index in the record, -1 at the batch end).
        """
        folder = self.folders[state.granularity]
        opened = dict(state.open)
        traj = opened[key]
        closing = flush_all or traj.complete
        traj, ready = _trajs.ready_turns(traj, flush=closing)
        acc_state, total, peak = state.acc, _Folded(gap=state.gap), state.kept_bytes_peak
        for payload in ready:
            start = self._clock(state)  # `turn`: the fold syncs on its log-probs
            traj, folded = folder.fold(state.policy, acc_state, traj, payload)
            state = self._timed(state, key, "fold", start, chunk)
            acc_state, total = folded.acc, total.add(folded)
            opened[key] = traj
            peak = max(peak, sum(t.nbytes for t in opened.values()))
        if closing:
            state, acc_state, folded = self._close(state, acc_state, key, traj, chunk)
            total = total.add(folded)
            del opened[key]
        else:
            opened[key] = traj
        return state._replace(
            acc=acc_state,
            tally=state.tally.add(tokens=total.tokens),
            reverse_kl_sum=state.reverse_kl_sum + total.log_ratio,
            open=opened,
            kept_bytes_peak=peak,
            gap=total.gap,
        )

    def _close(self, state: OpdState, acc_state, key, traj, chunk: int):
        """(state, accumulator state, folded) after closing `traj`: its last gradient work
        and, over every scored token, the KL / entropy terms (one full forward)."""
        start = self._clock(state)
        folded = self.folders[state.granularity].close(state.policy, acc_state, traj)
        if start is not None:  # `auto` only: time the close's work, not its dispatch
            jax.block_until_ready(folded.acc)
        state = self._timed(state, key, "close", start, chunk)
        acc_state = folded.acc
        if traj.scored.any():
            p = state.policy
            acc_state = self.add_terms(
                acc_state, p.params, p.base_params, traj.seen[None], traj.scored[None], None
            )
        return state, acc_state, folded

    def process(self, state: OpdState, chunk: list[WorkItem]) -> OpdState:
        started = time.perf_counter()
        state, touched, arrivals, closed_at = self._take(state, chunk)
        index = -1 if state.record is None else len(state.record.chunks)
        for key in dict.fromkeys(touched):  # first-touch order: fixed by the chunk
            state = self._advance(state, key, chunk=index)
        jax.block_until_ready(state.acc)  # timings measure the work (see algorithms.grpo)
        if state.record is None:
            return state
        r = state.record
        wall = (time.perf_counter() - started, len(chunk))
        record = r._replace(
            arrivals=(*r.arrivals, *arrivals), ends=(*r.ends, *closed_at), chunks=(*r.chunks, wall)
        )
        return state._replace(record=record)

    def _take(self, state: OpdState, chunk: list[WorkItem]):
        """The chunk's items held on their trajectories, counted in the tally.

        Returns (state, the (group, member) keys touched in chunk order, `auto`'s turn
        arrivals, `auto`'s member ends).
        """
        ends = [it for it in chunk if isinstance(it.payload, MemberEnd)]
        tally = state.tally.add(
            rewards=[(it.group, it.payload.reward) for it in ends],
            verifier_failures=[
                f"{it.item_id}: {it.payload.verifier_failure}"
                for it in ends
                if it.payload.verifier_failure is not None
            ],
        )
        opened, touched, turns = dict(state.open), [], 0
        arrivals, closed_at = [], []  # `auto`: when turns and member ends arrived
        for it in chunk:
            key = (it.group, it.member)
            traj = opened.get(key, _trajs.OpenTrajectory())
            if isinstance(it.payload, TurnPayload):
                lag = item_lag(state.policy, [it.payload.policy_version], f"turn {it.item_id}")
                tally = tally.add(lags=[lag])
                traj = _trajs.hold(traj, it.payload)
                turns += 1
                n, scored = len(it.payload.tokens), it.payload.num_tokens
                arrivals.append(_auto.TurnArrival(*key, it.payload.turn, it.arrival_s, n, scored))
            elif isinstance(it.payload, (MemberEnd, MemberLost)):
                closed_at.append((*key, it.arrival_s))
                if it.payload.turns is None:  # no count: closed at the batch end
                    continue
                traj = traj._replace(expected=int(it.payload.turns))
            opened[key] = traj
            touched.append(key)
        state = state._replace(tally=tally, open=opened, turns=state.turns + turns)
        return state, touched, arrivals, closed_at

    def close_groups(self, state: OpdState, groups) -> OpdState:
        """Closes every trajectory still open (members lost without a count, or no count)."""
        del groups  # OPD has no group coupling; whatever is open closes at the batch end
        for key in sorted(state.open):
            state = self._advance(state, key, flush_all=True)
        return state

    def finalize(self, state: OpdState):
        if state.open:
            raise ValueError(
                f"{len(state.open)} OPD trajectories are still open {sorted(state.open)[:4]}: "
                "call close_groups before finalize"
            )
        return self.acc.finalize(state.acc)

    def metrics(self, state: OpdState) -> dict:
        out = tally_metrics(state.tally)
        # Mean over scored tokens of (log π_s − log π_T)(o_t), o_t ~ π_s: a reverse-KL estimate.
        # Rounded to 1e-6 nats (far below its sampling noise): the float32 forwards behind it
        # are padded per chunk, and chunks differ between schedules in the last bits.
        kl = state.reverse_kl_sum / max(state.tally.tokens, 1)
        out.update(reverse_kl=float(f"{kl:.7g}"), turns=int(state.turns), **state.gap.metrics())
        out["opd_granularity_turn"] = 1.0 if state.granularity == "turn" else 0.0
        predicted = None if state.choice is None else state.choice.predicted
        if predicted is not None:  # only on steps the predictor chose (not while exploring)
            out["opd_predicted_step_s_turn"] = float(predicted["turn"])
            out["opd_predicted_step_s_trajectory"] = float(predicted["trajectory"])
        return out


def make_learner(setup: LearnerSetup) -> BatchLearner:
    c = setup.config
    acc, reg_fn = _terms.with_regularizers(
        accumulators.opd(loss_agg="token-mean", deterministic=bool(c.rl.deterministic)),
        setup,
    )
    granularity = str(c.rl.opd_granularity)
    return batch_learner(
        acc,
        _terms.score_grad_fn(setup),
        setup.pad_id,
        reg_fn,
        segment_fns=None if granularity == "trajectory" else _terms.segment_fns_for(setup),
        granularity=granularity,
        schedule=schedules.get(c.schedule),
    )


ALGORITHM = Algorithm(
    name="opd",
    check_config=check_config,
    make_learner=make_learner,
    start_services=start_teacher,
    episode_work=episode_work,
    # Turns of one group packed as rows: about one trajectory's worth of scored tokens.
    max_chunk_tokens=lambda c: int(c.rollout.max_new_tokens_per_turn) * int(c.rollout.max_turns),
)
