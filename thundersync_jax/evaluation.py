"""Held-out evaluation in the training loop: pass@1 and pass@k between steps.

    evaluator = evaluation.Evaluator.start(config, workdir, tok, started)   # None: off
    metrics.update(evaluator.after_step(step, engines))  # every `eval.every_steps` steps

Every `eval.every_steps` steps the policy just published plays each of `eval.num_tasks`
held-out tasks n = max(eval.k, eval.samples) times on the rollout engines, at
`eval.temperature`, and the verifier scores it. Its sampling keys are its own
(`EpisodeIds(seed + EVAL_SEED_OFFSET, step, task, sample)`, a seed no training episode
uses) and it runs while the engines are idle (after the publication, before the next
batch), so training's trajectories, and the parameters they lead to, are the same with
evaluation on or off. Written per evaluated step: `eval_pass@1`, `eval_pass@K` (K = eval.k),
`eval_time_s`; the first time pass@K reaches `eval.target` (> 0), `time_to_target_s` (the
run's wall clock, kept across resumes) and `gpu_hours_to_target` (GPUs in use × that clock).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import os
import time
from collections.abc import Sequence

import jax
import numpy as np

from thundersync_jax.envs import agent_loop, task_families
from thundersync_jax.envs.agent_samplers import EngineSampler
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits
from thundersync_jax.models import sampling

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1 << 30  # eval keys: seed + 2^30 (mod 2^31), never a training key's seed


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with c correct out of n samples:
    1 - C(n-c, k) / C(n, k) (Chen et al., 2021); needs n >= k."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over tasks, `correct[i]` of task i's n samples solved it."""
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct]))


def gpus_in_use(config) -> int:
    """The GPUs a run holds: the node's (every process) when the config describes one,
    else the accelerators JAX sees (0 on CPU)."""
    if "node" in config:
        return int(config.node.num_gpus) * jax.process_count()
    return sum(d.platform == "gpu" for d in jax.devices())


class Evaluator:
    """Runs the held-out evaluation between steps (see the module doc)."""

    def __init__(self, config, workdir: str, tok, tasks: list, started: float):
        ev = config.eval
        self.config, self.tok, self.tasks = config, tok, tasks
        self.every, self.k = int(ev.every_steps), int(ev.k)
        self.samples = max(self.k, int(ev.samples))
        self.target = float(ev.target)
        self.workdir = os.path.join(workdir, "eval")
        self.seed = (int(config.seed) + EVAL_SEED_OFFSET) % (1 << 31)
        self.params = sampling.SamplingParams(
            temperature=float(ev.temperature),
            top_p=float(config.rollout.top_p),
            max_new_tokens=int(config.rollout.max_new_tokens_per_turn),
            stop_token_ids=tuple(tok.stop_ids),
        )
        self._clock = _RunClock(os.path.join(self.workdir, "clock.json"), started)
        self._target_file = os.path.join(self.workdir, "target.json")

    @classmethod
    def start(cls, config, workdir: str, tok, started: float) -> Evaluator | None:
        """The run's evaluator (its tasks built, every image resolved), or None when
        `eval.every_steps` is 0.

        Args:
          started: `time.monotonic()` when this process's run began (the clock's origin).
        """
        if not int(config.eval.every_steps):
            return None
        tasks = task_families.eval_tasks(config, workdir)
        log.info("evaluation: %d held-out tasks every %d steps", len(tasks),
                 int(config.eval.every_steps))  # fmt: skip
        return cls(config, workdir, tok, tasks, started)

    def after_step(self, step: int, client) -> dict:
        """The evaluation metrics after `step` ({} on a step that is not evaluated).

        Args:
          client: the rollout engines (`EngineManager`), holding the policy of `step + 1`.
        """
        elapsed = self._clock.tick()
        if (step + 1) % self.every:
            return {}
        start = time.monotonic()
        correct, failures = self.play(step, EngineSampler(client, self.params, "eval"))
        out = {
            "eval_pass@1": mean_pass_at_k(correct, self.samples, 1),
            f"eval_pass@{self.k}": mean_pass_at_k(correct, self.samples, self.k),
            "eval_time_s": time.monotonic() - start,
            "eval_failures": failures,
        }
        elapsed = self._clock.tick()
        if self.target > 0 and out[f"eval_pass@{self.k}"] >= self.target:
            out.update(self._reached(step, elapsed))
        return out

    def play(self, step: int, sampler) -> tuple[list[int], int]:
        """(per task: samples with reward 1, episodes that failed to run) at `step`."""
        limits = LoopLimits.from_config(self.config.rollout)
        family = task_families.get(self.config.env.family)

        def one(i: int, m: int) -> float:
            with family.make_env(self.config, self.tasks[i], self.workdir) as env:
                ids = EpisodeIds(self.seed, step, i, m)
                traj = agent_loop.run_episode(env, sampler, self.tok, ids, limits)
            return float(traj.reward or 0.0)

        correct = [0] * len(self.tasks)
        failures = 0
        workers = int(self.config.rollout.max_batch)
        with concurrent.futures.ThreadPoolExecutor(workers, "eval") as pool:
            futures = {
                pool.submit(one, i, m): i
                for i in range(len(self.tasks))
                for m in range(self.samples)
            }
            for fut, i in futures.items():
                try:
                    correct[i] += fut.result() >= 1.0
                except Exception as e:  # an engine or task failure: an unsolved sample
                    failures += 1
                    log.warning("eval episode of task %d failed: %s: %s", i, type(e).__name__, e)
        return correct, failures

    def _reached(self, step: int, elapsed: float) -> dict:
        if os.path.exists(self._target_file):  # reached before (a resumed run)
            return {}
        out = {
            "time_to_target_s": elapsed,
            "gpu_hours_to_target": gpus_in_use(self.config) * elapsed / 3600.0,
        }
        with open(self._target_file, "w") as f:
            json.dump(dict(out, step=step, target=self.target, k=self.k), f)
        return out


class _RunClock:
    """Wall-clock seconds of a run, summed over its processes' lifetimes (resumes)."""

    def __init__(self, path: str, started: float):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        try:
            with open(path) as f:
                self.before = float(json.load(f)["elapsed_s"])
        except (OSError, ValueError, KeyError):
            self.before = 0.0
        self.start = started

    def tick(self) -> float:
        elapsed = self.before + time.monotonic() - self.start
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"elapsed_s": elapsed}, f)
        os.replace(tmp, self.path)
        return elapsed
