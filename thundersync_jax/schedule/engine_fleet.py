"""The run's rollout engines: their processes, the snapshot root they load from, the sampler
the agent loop calls, and publication of each new policy version to all of them."""

from __future__ import annotations

import hashlib
import os
import shutil

import jax

from thundersync_jax.envs.agent_samplers import EngineSampler
from thundersync_jax.models import qwen3, sampling
from thundersync_jax.rollout import engine_cmd, snapshots
from thundersync_jax.rollout.manager import EngineManager


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
