"""On-policy distillation behind the loop's algorithm interface: teacher-scored turns.

Every sampled turn goes to the teacher (its own engine process, `teacher.start_teacher`)
while the turn's tool call runs; once scored it is a `WorkItem` (payload `TurnPayload`). A
member is closed by one payload-free item queued after all of its turns (payload
`MemberEnd`: its reward, for the metrics). For a chunk of turns the learner

1. runs its own forward for the student's log-probs log π_s(o_t) (DESIGN §2: log-probs from
   the learner, never from the sampler) and forms Â_t = −(log π_s − log π_T)(o_t) as plain
   numbers, so no gradient flows through Â;
2. takes h = Σ_t Â_t ∇ log π_s(o_t) over the turn's tokens (forward over the whole prefix,
   loss masked to the turn);
3. adds h and the turn's token count into `accumulators.opd()`: finalize = −(1/N) Σ h.

Because attention is causal the per-turn gradients of a trajectory sum to its full-trajectory
gradient, so streaming turn by turn gives the batch-synchronous update. `rl.kl_coef` and
`rl.entropy_coef` add their terms over the same scored tokens (`algorithms._terms`). The
score-gradient forward also gives the engine/learner log-prob gap of the turn's tokens (the
`engine_logprob_gap_*` metrics) and, with `rl.tis_cap`, their truncated importance weights.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from thundersync_jax import accumulators, teacher
from thundersync_jax.algorithms import _terms
from thundersync_jax.algorithms.base import (
    Algorithm,
    BatchLearner,
    BatchPolicy,
    BatchTally,
    LearnerSetup,
    MemberEnd,
    item_lag,
    tally_metrics,
    verifier_failure,
)
from thundersync_jax.learner import buckets
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.rollout.logprob_gap import GapTally
from thundersync_jax.schedule.config_check import ConfigError
from thundersync_jax.schedule.episodes import EpisodeWork
from thundersync_jax.schedule.planner import WorkItem

TEACHER = "teacher"  # timeline kind: one turn's teacher scoring (sampled → scored)


@dataclasses.dataclass(frozen=True)
class TurnPayload:
    """What the learner needs for one scored turn.

    Attributes:
      tokens: int32 [L], the trajectory up to the turn's last sampled token.
      loss_mask: bool [L], True on this turn's sampled tokens only.
      teacher_logprobs: float32 [L], log π_T of each masked token (0 elsewhere).
      policy_version: version of the student weights that sampled the turn.
      turn: the turn's index in its episode.
      engine_logprobs: float32 [L], the student engine's log-probs of the masked tokens (NaN
        elsewhere), or None when the engine gave none.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    teacher_logprobs: np.ndarray
    policy_version: int
    turn: int
    engine_logprobs: np.ndarray | None = None

    @classmethod
    def from_turn(
        cls,
        tokens: Sequence[int],
        turn_start: int,
        teacher_logprobs: Sequence[float],
        policy_version: int,
        turn: int,
        engine_logprobs: Sequence[float] | None = None,
    ) -> TurnPayload:
        """From the trajectory so far and the teacher's (and optionally the sampling engine's)
        log-probs of the turn at `turn_start`."""
        t_lp = np.asarray(teacher_logprobs, np.float32).reshape(-1)
        end = turn_start + len(t_lp)
        prefix = np.asarray(tokens, np.int32)[:end]
        if len(prefix) != end or turn_start < 1 or not len(t_lp):
            raise ValueError(
                f"turn at {turn_start} with {len(t_lp)} scored tokens does not fit a "
                f"{len(tokens)}-token trajectory (need 1 <= start, start + n <= length, n >= 1)"
            )
        mask = np.zeros(end, bool)
        mask[turn_start:end] = True
        full_lp = np.zeros(end, np.float32)
        full_lp[turn_start:end] = t_lp
        engine = None
        if engine_logprobs is not None:
            e_lp = np.asarray(engine_logprobs, np.float32).reshape(-1)
            if e_lp.shape != t_lp.shape:
                raise ValueError(
                    f"turn at {turn_start}: {len(e_lp)} engine log-probs for {len(t_lp)} tokens"
                )
            engine = np.full(end, np.nan, np.float32)
            engine[turn_start:end] = e_lp
        return cls(prefix, mask, full_lp, int(policy_version), int(turn), engine)

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def _engine_logprobs(payload: TurnPayload) -> np.ndarray:
    """The turn's engine log-probs, all NaN (none) when the engine gave none."""
    if payload.engine_logprobs is None:
        return np.full(len(payload.tokens), np.nan, np.float32)
    return payload.engine_logprobs


class OpdState(NamedTuple):
    """Per-batch OPD learner state.

    Attributes:
      acc: the accumulator's state (`accumulators.opd`, combined with terms when enabled).
      policy: the batch's policy (params, base, version).
      tally: tokens, rewards, lags (per turn) and verifier failures so far.
      turns: scored turns folded in.
      reverse_kl_sum: Σ over scored tokens of (log π_s − log π_T)(o_t), float64.
      gap: the engine/learner log-prob gap sums so far.
    """

    acc: Any
    policy: BatchPolicy
    tally: BatchTally
    turns: int
    reverse_kl_sum: float
    gap: GapTally = GapTally()


def batch_learner(acc, score_fn, pad_id: int, regularizer_fn=None) -> BatchLearner:
    """The OPD `BatchLearner` over `accumulators.opd()` (token-mean) and `score_fn`."""
    logprob_fn = TokenLogprobFn(score_fn)
    add = jax.jit(acc.add_weighted, donate_argnums=0)
    add_terms = _terms.TermAdder(acc, regularizer_fn)

    def init(params, version: int, base_params=None, enforce_version: bool = True) -> OpdState:
        policy = BatchPolicy(params, base_params, int(version), bool(enforce_version))
        return OpdState(acc.init(params), policy, BatchTally(), 0, 0.0)

    def process(state: OpdState, chunk: list[WorkItem]) -> OpdState:
        p = state.policy
        ends = [it for it in chunk if isinstance(it.payload, MemberEnd)]
        tally = state.tally.add(
            rewards=[(it.group, it.payload.reward) for it in ends],
            verifier_failures=[
                f"{it.item_id}: {it.payload.verifier_failure}"
                for it in ends
                if it.payload.verifier_failure is not None
            ],
        )
        turns = [it for it in chunk if isinstance(it.payload, TurnPayload)]
        if not turns:  # member-closing items alone are no learner work
            return state._replace(tally=tally)
        lags = [item_lag(p, [it.payload.policy_version], f"turn {it.item_id}") for it in turns]
        payloads = [it.payload for it in turns]
        tokens, mask, teacher_lp = buckets.pack_sequences(
            [q.tokens for q in payloads],
            [q.loss_mask for q in payloads],
            [q.teacher_logprobs for q in payloads],
            pad_id=pad_id,
        )
        student_lp = logprob_fn(p.params, tokens, p.base_params)
        # Â_t = −(log π_s − log π_T)(o_t): numbers from the learner's forward, no gradient.
        advantage = np.where(mask > 0, teacher_lp - student_lp, 0.0).astype(np.float32)
        engine_lp = buckets.pack_sequences(  # NaN: no engine log-prob; padding is masked
            [q.tokens for q in payloads],
            [q.loss_mask for q in payloads],
            [_engine_logprobs(q) for q in payloads],
            pad_id=pad_id,
        )[2]
        h, n, gap = score_fn.score_and_gap(
            p.params, tokens, mask, advantage, engine_lp, base_params=p.base_params
        )
        acc_state = add(state.acc, h, n, len(turns))
        acc_state = add_terms(acc_state, p.params, p.base_params, tokens, mask, None)
        jax.block_until_ready(acc_state)  # timings measure the work (see algorithms.grpo)
        return OpdState(
            acc_state,
            p,
            tally.add(tokens=n, lags=lags),
            state.turns + len(turns),
            state.reverse_kl_sum + float(-np.sum(advantage, dtype=np.float64)),
            state.gap.add(gap),
        )

    def metrics(state: OpdState) -> dict:
        out = tally_metrics(state.tally)
        # Mean over scored tokens of (log π_s − log π_T)(o_t), o_t ~ π_s: a reverse-KL estimate.
        # Rounded to 1e-6 nats (far below its sampling noise): the float32 forwards behind it
        # are padded per chunk, and chunks differ between schedules in the last bits.
        kl = state.reverse_kl_sum / max(state.tally.tokens, 1)
        out.update(reverse_kl=round(kl, 6), turns=int(state.turns), **state.gap.metrics())
        return out

    return BatchLearner(
        init=init,
        process=process,
        close_groups=lambda state, groups: state,  # OPD has no group coupling
        finalize=lambda state: acc.finalize(state.acc),
        metrics=metrics,
        compiles=lambda: int(score_fn.compiles) + logprob_fn.compiles + add_terms.compiles,
        accumulator_state=lambda state: state.acc,
    )


def make_learner(setup: LearnerSetup) -> BatchLearner:
    acc, reg_fn = _terms.with_regularizers(
        accumulators.opd(
            loss_agg="token-mean", deterministic=bool(setup.config.rl.get("deterministic", False))
        ),
        setup,
    )
    return batch_learner(acc, _terms.score_grad_fn(setup), setup.pad_id, reg_fn)


def check_config(config) -> None:
    """What OPD needs beyond the common check; raises ConfigError naming the bad value."""
    if config.rl.loss_agg != "token-mean":
        # Per-turn items would get per-turn (not per-trajectory) weights under other modes.
        raise ConfigError(
            f"rl.loss_agg={config.rl.loss_agg!r}: OPD is −(1/N) Σ over scored tokens; use "
            "'token-mean'"
        )
    if config.get("teacher") is None:
        raise ConfigError(
            "rl.algorithm='opd' needs a `teacher` section (see configs/terminal_opd_cpu.py)"
        )
    if not config.teacher.checkpoint and config.teacher.sft_steps < 1:
        raise ConfigError(
            "teacher.checkpoint is empty and teacher.sft_steps < 1: give a teacher checkpoint "
            "or train the embedded teacher for >= 1 step"
        )


def start_teacher(config, student_cfg, examples, workdir: str) -> teacher.TeacherService:
    """The teacher in its own engine process (trained on `examples()` unless a checkpoint)."""
    # Its own directory beside the student's snapshots (one teacher version, never replaced).
    tag = hashlib.sha1(workdir.encode()).hexdigest()[:8]
    if jax.process_count() > 1:  # each learner process runs its own teacher (DESIGN §7)
        tag += f"-p{jax.process_index()}"
    root = os.path.join(config.rollout.snapshot_root, f"{os.path.basename(workdir)}-{tag}-teacher")
    cache = config.sft.cache_dir or workdir
    # A previous process of this run (killed, now resumed) left its teacher's v0 here, and
    # publishing never overwrites a version: no engine reads it any more.
    shutil.rmtree(root, ignore_errors=True)
    return teacher.start_teacher(config, student_cfg, examples, cache, root)


def episode_work(service: teacher.TeacherService, timeline) -> EpisodeWork:
    """Turns go to the teacher as they are sampled; a member closes after its last turn."""

    def on_turn(k, m, traj, turn, emit) -> concurrent.futures.Future:
        sampled_at = time.perf_counter()
        scored = service.scorer.score_turn(traj.tokens[: turn.end], turn.start, turn.end)
        queued: concurrent.futures.Future = concurrent.futures.Future()
        tokens = traj.tokens[: turn.end].copy()

        def deliver(f: concurrent.futures.Future) -> None:
            try:
                payload = TurnPayload.from_turn(
                    tokens,
                    turn.start,
                    f.result(),
                    turn.policy_version,
                    turn.index,
                    engine_logprobs=turn.logprobs,
                )
            except Exception as e:  # the teacher failed this turn: the member is lost
                queued.set_exception(e)
                return
            now = time.perf_counter()
            timeline.record(TEACHER, sampled_at, now, group=k, member=m, turn=turn.index)
            emit(
                WorkItem(
                    f"g{k}m{m}t{turn.index}",
                    k,
                    0.0,
                    payload.num_tokens,
                    now - timeline.start_s,
                    payload=payload,
                    closes_member=False,
                    member=m,
                )
            )
            queued.set_result(None)

        scored.add_done_callback(deliver)
        return queued

    def finish(k, m, traj, arrival_s) -> WorkItem:
        reward = float(traj.reward if traj.reward is not None else 0.0)
        # Reward 0.0 in the slot key: OPD items of a group share one slot (the member's reward
        # travels in the payload, for the metrics).
        end = MemberEnd(reward, verifier_failure(traj))
        return WorkItem(f"g{k}m{m}end", k, 0.0, 0, arrival_s, payload=end, member=m)

    return EpisodeWork(finish=finish, on_turn=on_turn)


ALGORITHM = Algorithm(
    name="opd",
    check_config=check_config,
    make_learner=make_learner,
    start_services=start_teacher,
    episode_work=episode_work,
    # Turns of one group packed as rows: about one trajectory's worth of scored tokens.
    max_chunk_tokens=lambda c: int(c.rollout.max_new_tokens_per_turn) * int(c.rollout.max_turns),
)
