"""OPD's rollout side: what a scored turn carries, and how an episode's turns reach the teacher.

Each sampled turn goes to the teacher (its own engine process) while the turn's tool call runs,
keyed by its episode so the teacher scores incrementally from that episode's own KV cache
(`rollout.episode_scoring`: only the new tokens are forwarded); the cache is released when the
episode ends or fails. Once scored the turn is a `WorkItem` with a `TurnPayload`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import os
import shutil
import time
from collections.abc import Sequence

import jax
import numpy as np

from thundersync_jax import teacher
from thundersync_jax.algorithms.base import MemberEnd, MemberLost, verifier_failure
from thundersync_jax.schedule.episodes import EpisodeWork
from thundersync_jax.schedule.planner import WorkItem

_BATCHES = itertools.count()  # one tag per `episode_work` (a batch): episode keys stay unique

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
      routes: MoE policies: int32 [L, M, K], the experts the engine routed each token of the
        turn's request to (-1 where it reported none: the last sampled token), or None.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    teacher_logprobs: np.ndarray
    policy_version: int
    turn: int
    engine_logprobs: np.ndarray | None = None
    routes: np.ndarray | None = None

    @classmethod
    def from_turn(
        cls,
        tokens: Sequence[int],
        turn_start: int,
        teacher_logprobs: Sequence[float],
        policy_version: int,
        turn: int,
        engine_logprobs: Sequence[float] | None = None,
        routes: np.ndarray | None = None,
    ) -> TurnPayload:
        """From the trajectory so far and the teacher's (and optionally the sampling engine's)
        log-probs of the turn at `turn_start`; `routes` [n, M, K]: the engine's routes of the
        turn request's fed tokens (n <= the turn's end)."""
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
        if routes is not None:  # -1: none reported (the learner routes those tokens itself)
            given = np.asarray(routes, np.int32)[:end]
            routes = np.full((end, *given.shape[1:]), -1, np.int32)
            routes[: len(given)] = given
        return cls(prefix, mask, full_lp, int(policy_version), int(turn), engine, routes)

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


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
    tag = f"b{next(_BATCHES)}"  # pipelined batches run the same (group, member) at once

    def episode(k, m) -> str:
        return f"{tag}g{k}m{m}"

    def on_turn(k, m, traj, turn, emit) -> concurrent.futures.Future:
        sampled_at = time.perf_counter()
        scored = service.scorer.score_turn(
            traj.tokens[: turn.end], turn.start, turn.end, episode=episode(k, m)
        )
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
                    routes=turn.routes,
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
        service.scorer.release(episode(k, m))  # after its turns (same teacher queue)
        reward = float(traj.reward if traj.reward is not None else 0.0)
        # Reward 0.0 in the slot key: OPD items of a group share one slot (the member's reward
        # travels in the payload, for the metrics).
        # Every sampled turn emitted one item (a failed one loses the member instead).
        end = MemberEnd(reward, verifier_failure(traj), turns=len(traj.turns))
        return WorkItem(f"g{k}m{m}end", k, 0.0, 0, arrival_s, payload=end, member=m)

    def lose(k, m, turns_emitted, arrival_s) -> WorkItem:
        # Not member-closing for the planner (the member is dropped by `MemberFailed`): it
        # tells the learner to sweep and free the trajectory once its emitted turns are in.
        service.scorer.release(episode(k, m))
        lost = MemberLost(int(turns_emitted))
        return WorkItem(
            f"g{k}m{m}lost", k, 0.0, 0, arrival_s, payload=lost, closes_member=False, member=m
        )

    return EpisodeWork(finish=finish, on_turn=on_turn, lose=lose)
