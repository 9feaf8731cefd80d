"""The rollout side of one batch: run every episode, hand each finished trajectory over.

Episodes run concurrently on threads (they spend their time waiting on the
engine process and on sandboxed tool calls); each finished trajectory becomes a
`WorkItem` on the learner's queue the moment its reward is known. A rollout
that fails after its retries becomes `MemberFailed`, so the batch still closes.
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
from thundersync_jax.schedule.planner import WorkItem

log = logging.getLogger(__name__)


def launch_batch(
    *,
    step: int,
    seed: int,
    group_size: int,
    make_env: Callable[[int, int], object],
    sampler,
    tok,
    limits: agent_loop.LoopLimits,
    out: queue.Queue,
    timeline: Timeline,
    max_concurrency: int,
    num_groups: int,
) -> threading.Thread:
    """Starts all K×G episodes of `step` in the background; returns the supervising thread.

    Args:
      make_env: (group, member) -> a fresh Environment for that prompt.
      out: receives a WorkItem (payload = the Trajectory) or MemberFailed per episode.
      timeline: gets one "rollout" event per trajectory (start → reward known).
    """

    def run_one(k: int, m: int) -> None:
        start = time.perf_counter()
        try:
            env = make_env(k, m)
            try:
                traj = agent_loop.run_episode(
                    env, sampler, tok, agent_loop.EpisodeIds(seed, step, k, m), limits
                )
            finally:
                env.close()
        except Exception as e:  # an engine that stayed down, a broken task: lose one member
            log.error("rollout (step %d, group %d, member %d) failed: %s", step, k, m, e)
            out.put(MemberFailed(group=k, reason=f"g{k}m{m}: {type(e).__name__}: {e}"))
            return
        end = time.perf_counter()
        reward = float(traj.reward if traj.reward is not None else 0.0)
        n_loss = int(traj.loss_mask.sum())
        timeline.record(
            ROLLOUT,
            start,
            end,
            traj_id=f"g{k}m{m}",
            group=k,
            member=m,
            tokens=n_loss,
            reward=reward,
            turns=len(traj.turns),
        )
        out.put(
            WorkItem(f"g{k}m{m}", k, reward, n_loss, end - timeline.start_s, payload=traj, member=m)
        )

    def supervise() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_concurrency) as pool:
            futures = [
                pool.submit(run_one, k, m) for k in range(num_groups) for m in range(group_size)
            ]
            for f in futures:
                f.result()

    thread = threading.Thread(target=supervise, name=f"rollouts-step{step}", daemon=True)
    thread.start()
    return thread
