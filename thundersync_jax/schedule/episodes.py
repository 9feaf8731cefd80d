"""The rollout side of one batch: run every episode, hand its learner work over as it appears.

Episodes run concurrently on threads (they spend their time waiting on the engine process
and on sandboxed tool calls). What an episode gives the learner is the algorithm's choice
(`EpisodeWork`): GRPO learns from finished trajectories, so `finish` turns each one into a
`WorkItem` the moment its reward is known; OPD learns from turns, so `on_turn` sends each
sampled turn to the teacher while its tool call runs and queues it once scored, and
`finish` queues one payload-free item that closes the member after all of its turns. An
episode (or one of its turns) that fails after its retries becomes `MemberFailed`, so the
batch still closes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable

from thundersync_jax.envs import agent_loop
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits, Trajectory, Turn
from thundersync_jax.metrics import ROLLOUT, Timeline
from thundersync_jax.schedule.learner_loop import MemberFailed
from thundersync_jax.schedule.planner import WorkItem

log = logging.getLogger(__name__)

# (group, member, trajectory so far, the turn just sampled, emit) -> a future that is done once
# the turn's learner items were emitted (its exception loses the member), or None.
TurnHook = Callable[
    [int, int, Trajectory, Turn, Callable[[WorkItem], None]],
    "concurrent.futures.Future | None",
]


@dataclasses.dataclass(frozen=True)
class EpisodeWork:
    """How an algorithm turns one episode into learner items.

    Attributes:
      finish: (group, member, trajectory, arrival_s) -> the item that closes the member
        (arrival_s: seconds from the timeline's start).
      on_turn: the per-turn hook (see `TurnHook`), or None.
      lose: (group, member, turn items emitted, arrival_s) -> an item queued just before the
        member's `MemberFailed` (OPD: its learner trajectory closes once those turns are in),
        or None.
    """

    finish: Callable[[int, int, Trajectory, float], WorkItem]
    on_turn: TurnHook | None = None
    lose: Callable[[int, int, int, float], WorkItem] | None = None


@dataclasses.dataclass(frozen=True)
class BatchRollouts:
    """One batch's episodes in flight.

    Attributes:
      step: the training step the batch belongs to.
      queue: receives `WorkItem`s and `MemberFailed`s.
      thread: the supervisor; joined, every episode has ended and every item is queued.
      timeline: the batch's timeline (rollout events, and what the hooks record).
    """

    step: int
    queue: queue.Queue
    thread: threading.Thread
    timeline: Timeline


def _run_member(k: int, m: int, *, ids, make_env, sampler, tok, limits, work, out, timeline):
    start = time.perf_counter()
    lock = threading.Lock()
    pending: list[concurrent.futures.Future] = []
    on_turn = None
    if work.on_turn is not None:

        def on_turn(traj: Trajectory, turn: Turn) -> None:
            fut = work.on_turn(k, m, traj, turn, out.put)
            if fut is not None:
                with lock:
                    pending.append(fut)

    failures: list[str] = []
    traj = None
    try:
        env = make_env(k, m)
        try:
            traj = agent_loop.run_episode(env, sampler, tok, ids, limits, on_turn=on_turn)
        finally:
            env.close()
    except Exception as e:  # an engine that stayed down, a broken task: lose one member
        failures.append(f"episode: {type(e).__name__}: {e}")
    with lock:
        waiting = list(pending)
    emitted = 0
    for fut in concurrent.futures.as_completed(waiting):  # every turn item before the close
        if fut.exception() is not None:
            failures.append(f"turn: {type(fut.exception()).__name__}: {fut.exception()}")
        else:
            emitted += 1
    end = time.perf_counter()
    if failures:
        reason = f"g{k}m{m}: " + "; ".join(failures)
        log.error("rollout (step %d) failed: %s", ids.step, reason)
        if work.lose is not None:
            out.put(work.lose(k, m, emitted, end - timeline.start_s))
        out.put(MemberFailed(group=k, reason=reason, member=m))
        return
    reward = float(traj.reward if traj.reward is not None else 0.0)
    timeline.record(
        ROLLOUT,
        start,
        end,
        traj_id=f"g{k}m{m}",
        group=k,
        member=m,
        tokens=int(traj.loss_mask.sum()),
        reward=reward,
        turns=len(traj.turns),
    )
    out.put(work.finish(k, m, traj, end - timeline.start_s))


def launch_batch(
    *,
    step: int,
    seed: int,
    num_groups: int,
    group_size: int,
    make_env: Callable[[int, int], object],
    sampler,
    tok,
    limits: LoopLimits,
    work: EpisodeWork,
    timeline: Timeline,
    max_concurrency: int,
    groups=None,
) -> BatchRollouts:
    """Starts the K×G episodes of `step` (only `groups`' when given) in the background.

    Args:
      groups: the groups this process samples (data-parallel learners: k mod P), or None
        for all K; keyed sampling makes an episode's trajectory the same on any process.
      make_env: (group, member) -> a fresh Environment for that prompt.
      work: what the algorithm takes from an episode (see `EpisodeWork`).
      timeline: gets one "rollout" event per member (start → its work all queued).
    """
    out: queue.Queue = queue.Queue()
    shared = dict(make_env=make_env, sampler=sampler, tok=tok, limits=limits, work=work, out=out)

    def supervise() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_concurrency, "episode") as pool:
            futures = [
                pool.submit(
                    _run_member,
                    k,
                    m,
                    ids=EpisodeIds(seed, step, k, m),
                    timeline=timeline,
                    **shared,
                )
                for k in (range(num_groups) if groups is None else groups)
                for m in range(group_size)
            ]
            for f in futures:
                f.result()

    thread = threading.Thread(target=supervise, name=f"rollouts-step{step}", daemon=True)
    thread.start()
    return BatchRollouts(step, out, thread, timeline)
