"""The plumbing of a run: logging, the engine fleet, per-step artifacts, metric files.

Kept apart from the loop (`thundersync_jax/train.py`) so the loop reads as the algorithm
and this file as where processes run and files go.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys

import jax

from thundersync_jax import metrics
from thundersync_jax.envs import agent_loop, task_families
from thundersync_jax.envs.agent_samplers import EngineSampler, GenerateSampler
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits
from thundersync_jax.models import qwen3, sampling
from thundersync_jax.rollout import engine_cmd, snapshots
from thundersync_jax.rollout.manager import EngineManager

log = logging.getLogger(__name__)


def configure_logging(workdir: str) -> None:
    """INFO to workdir/train.log and WARNING+ to stderr (the progress bar owns stdout)."""
    root = logging.getLogger("thundersync_jax")
    if any(getattr(h, "_tsj_workdir", None) == workdir for h in root.handlers):
        return
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(os.path.join(workdir, "train.log"))
    fh.setFormatter(fmt)
    fh._tsj_workdir = workdir  # type: ignore[attr-defined]
    sh = logging.StreamHandler(sys.stderr)
    sh.setLevel(logging.WARNING)
    sh.setFormatter(fmt)
    root.addHandler(fh)
    root.addHandler(sh)
    root.setLevel(logging.INFO)


def build_tasks(config, workdir: str) -> list:
    """The task pool of the run (`env.family`'s, see `envs.task_families`)."""
    return task_families.get(config.env.family).build_tasks(config, workdir)


def make_env(config, task, workdir: str):
    return task_families.get(config.env.family).make_env(config, task, workdir)


def play_tasks(
    config, workdir: str, tasks: list, model, tok, samples: int, temperature: float, seed: int
) -> list:
    """Every task (`build_tasks`) played `samples` times by `model` (embedded
    sampler, the config's loop limits, real sandbox and verifier); returns the trajectories,
    whose `ids.prompt` is the task index and `ids.member` the sample index."""
    params = sampling.SamplingParams(
        temperature=temperature,
        max_new_tokens=config.rollout.max_new_tokens_per_turn,
        stop_token_ids=tuple(tok.stop_ids),
    )
    episodes = [
        agent_loop.Episode(
            lambda t=task: make_env(config, t, workdir),
            EpisodeIds(seed, 0, i, m),
        )
        for i, task in enumerate(tasks)
        for m in range(samples)
    ]
    max_batch = int(config.rollout.max_batch)
    with GenerateSampler(model, params, tok.pad_id, max_batch=max_batch) as s:
        limits = LoopLimits.from_config(config.rollout)
        return list(agent_loop.run_episodes(episodes, s, tok, limits, max_concurrency=max_batch))


class EngineFleet:
    """The run's rollout engines (own processes) and the sampler the agent loop calls.

    `publish(params, version)` writes the Orbax snapshot to shared memory and returns
    only when every engine acknowledged `version`: the next batch can then never be
    sampled by stale weights. Dead engines are restarted by the manager, reloaded with
    the current snapshot and their in-flight requests retried with the same keys.
    """

    def __init__(self, config, workdir: str, tok, model_cfg: qwen3.Qwen3Config):
        ro = config.rollout
        spec = engine_cmd.rollout_engines(config, model_cfg, workdir)
        self.manager = EngineManager(
            spec.server_args,
            num_engines=spec.num_engines,
            request_timeout_s=float(ro.request_timeout_s),
            engine_envs=spec.envs,
            python=spec.python,
            load_probe=spec.load_probe,
            start_timeout_s=spec.start_timeout_s,
        )
        self.manager.start()
        run = (
            os.path.basename(workdir.rstrip("/"))
            + "-"
            + hashlib.sha1(workdir.encode()).hexdigest()[:8]
        )
        if jax.process_count() > 1:  # each learner process publishes to its own engines
            run += f"-p{jax.process_index()}"
        self.root = os.path.join(ro.snapshot_root, run)
        self.sampler = EngineSampler(
            self.manager,
            sampling.SamplingParams(
                temperature=float(ro.temperature),
                top_p=float(ro.top_p),
                max_new_tokens=int(ro.max_new_tokens_per_turn),
                stop_token_ids=tuple(tok.stop_ids),
            ),
        )

    def drop_versions_from(self, first_version: int) -> None:
        """Removes snapshots a previous process of this run published past its last checkpoint.

        A resumed run republishes those versions from the restored state (publishing never
        overwrites a version), and no engine of the new process reads the old ones.
        """
        for version in snapshots.list_versions(self.root):
            if version >= first_version:
                shutil.rmtree(snapshots.snapshot_path(self.root, version), ignore_errors=True)

    def publish(self, params, version: int) -> str:
        return self.manager.publish(params, int(version), self.root)

    def close(self) -> None:
        self.manager.close()


def trim_metrics(workdir: str, first_step: int) -> None:
    """Drops metric lines of steps that a resumed run will redo (no duplicates after a crash)."""
    path = os.path.join(workdir, metrics.METRICS_FILE)
    if not os.path.exists(path):
        return
    keep = [m for m in metrics.read_metrics(path) if int(m["step"]) < first_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for m in keep:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, path)


def tree_bytes(tree) -> int:
    """Bytes held by the arrays of a pytree (accumulator memory metric)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))
