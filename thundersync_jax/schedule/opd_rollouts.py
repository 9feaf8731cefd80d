"""The rollout side of one OPD batch: every sampled turn goes to the teacher, then to the learner.

Episodes run concurrently on threads, as for GRPO. The agent loop calls `on_turn` as soon as a
turn is sampled, before its tool call runs; the turn is handed to the teacher scorer right
there, and when its teacher log-probs come back it enters the learner's queue as a `WorkItem`
(payload: `TurnPayload`, `closes_member=False`). The learner can thus work on turn j while
turn j's tool call and turn j+1's sampling are still running.

Whether a turn is the episode's last is only known once the episode ends, so a member is
closed by one extra item without payload (`closes_member=True`, zero tokens), queued after
every turn item of that episode: the planner's "group/batch complete" then implies that all
of the member's turns are in. A member whose episode or teacher scoring fails becomes
`MemberFailed` (turns already queued keep their gradient: OPD has no group coupling).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable

from thundersync_jax.envs import agent_loop
from thundersync_jax.metrics import ROLLOUT, Timeline
from thundersync_jax.schedule.learner_loop import MemberFailed
from thundersync_jax.schedule.opd_learner import TurnPayload
from thundersync_jax.schedule.planner import WorkItem
from thundersync_jax.teacher import TeacherScorer

log = logging.getLogger(__name__)

TEACHER = "teacher"  # timeline kind: one turn's teacher scoring (sampled → scored)


def _run_member(
    k: int,
    m: int,
    *,
    step: int,
    seed: int,
    make_env: Callable[[int, int], object],
    sampler,
    tok,
    limits: agent_loop.LoopLimits,
    scorer: TeacherScorer,
    out: queue.Queue,
    timeline: Timeline,
) -> None:
    start = time.perf_counter()
    lock = threading.Lock()
    emitted: list[concurrent.futures.Future] = []  # done once the turn's item is queued
    failures: list[str] = []

    def on_turn(traj: agent_loop.Trajectory, turn: agent_loop.Turn) -> None:
        sampled_at = time.perf_counter()
        scored = scorer.score_turn(traj.tokens[: turn.end], turn.start, turn.end)
        queued: concurrent.futures.Future = concurrent.futures.Future()
        with lock:
            emitted.append(queued)
        tokens = traj.tokens[: turn.end].copy()

        def deliver(f: concurrent.futures.Future) -> None:
            try:
                payload = TurnPayload.from_turn(
                    tokens, turn.start, f.result(), turn.policy_version, turn.index
                )
            except Exception as e:  # the teacher failed this turn: the member is lost
                with lock:
                    failures.append(f"turn {turn.index}: {type(e).__name__}: {e}")
                queued.set_result(None)
                return
            now = time.perf_counter()
            timeline.record(TEACHER, sampled_at, now, group=k, member=m, turn=turn.index)
            out.put(
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

    try:
        env = make_env(k, m)
        try:
            traj = agent_loop.run_episode(
                env, sampler, tok, agent_loop.EpisodeIds(seed, step, k, m), limits, on_turn=on_turn
            )
        finally:
            env.close()
    except Exception as e:  # an engine that stayed down, a broken task: lose one member
        failures.append(f"episode: {type(e).__name__}: {e}")
        traj = None
    with lock:
        pending = list(emitted)
    concurrent.futures.wait(pending)  # every turn item is queued before the member closes
    end = time.perf_counter()
    if failures:
        reason = f"g{k}m{m}: " + "; ".join(failures)
        log.error("OPD rollout (step %d) failed: %s", step, reason)
        out.put(MemberFailed(group=k, reason=reason))
        return
    reward = float(traj.reward if traj.reward is not None else 0.0)
    timeline.record(
        ROLLOUT,
        start,
        end,
        traj_id=f"g{k}m{m}",
        group=k,
        member=m,
        tokens=traj.num_tokens,
        reward=reward,
        turns=len(traj.turns),
    )
    # Reward 0.0 like the turns: OPD items share one slot per group (the reward is on the
    # timeline's rollout event, for the metrics).
    out.put(
        WorkItem(f"g{k}m{m}end", k, 0.0, 0, end - timeline.start_s, closes_member=True, member=m)
    )


def launch_opd_batch(
    *,
    step: int,
    seed: int,
    num_groups: int,
    group_size: int,
    make_env: Callable[[int, int], object],
    sampler,
    tok,
    limits: agent_loop.LoopLimits,
    scorer: TeacherScorer,
    out: queue.Queue,
    timeline: Timeline,
    max_concurrency: int,
) -> threading.Thread:
    """Starts all K×G student episodes of `step` in the background; returns the supervisor.

    Args:
      make_env: (group, member) -> a fresh Environment for that prompt.
      scorer: the teacher; every sampled turn is sent to it at once.
      out: receives per turn a WorkItem (payload TurnPayload), then per member a closing
        WorkItem (no payload, no tokens) or a MemberFailed.
      timeline: gets a "teacher" event per turn and a "rollout" event per member (start →
        its last turn scored and its reward known).
    """
    run = dict(
        step=step,
        seed=seed,
        make_env=make_env,
        sampler=sampler,
        tok=tok,
        limits=limits,
        scorer=scorer,
        out=out,
        timeline=timeline,
    )

    def supervise() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_concurrency, "opd-episode") as pool:
            futures = [
                pool.submit(_run_member, k, m, **run)
                for k in range(num_groups)
                for m in range(group_size)
            ]
            for f in futures:
                f.result()

    thread = threading.Thread(target=supervise, name=f"opd-rollouts-step{step}", daemon=True)
    thread.start()
    return thread
