"""The teacher's own engine process, and where the frozen teacher comes from.

    service = TeacherService.from_checkpoint(hf_dir, max_seq_len=1536)   # any Qwen3 HF dir
    service = TeacherService.from_model(model, snapshot_root, max_seq_len=1536)  # published
    spec = engine_cmd.teacher_engines(config, model.cfg)   # the run's command line, GPUs
    service = TeacherService.from_model(model, snapshot_root, max_seq_len=1536, spec=spec)
    future = service.scorer.score_turn(prefix, start, end)
    service.close()

The teacher runs in a rollout engine process (`thundersync_jax.rollout.server`, supervised
and restarted by `EngineManager`) and answers `score` calls only; it never samples. An
in-memory teacher (e.g. one trained by `learner.sft` on demonstrations) reaches the process
as a published weight snapshot, version 0, exactly like the student's weights reach its
engines; a checkpoint on disk is loaded by the process itself. With `spec`
(`rollout.engine_cmd.teacher_engines`) the processes get the run's command line and
devices (GPUs, memory fraction from `config.node`); without, one CPU process per engine.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence

from flax import nnx

from thundersync_jax.models import qwen3
from thundersync_jax.rollout.engine_cmd import EngineDevices, EngineSpec
from thundersync_jax.rollout.manager import EngineManager
from thundersync_jax.teacher._scorer import TeacherScorer

log = logging.getLogger(__name__)

TEACHER_VERSION = 0


def _server_args(
    model_cfg: qwen3.Qwen3Config | None,
    checkpoint: str,
    max_batch: int,
    max_seq_len: int,
    dtype: str,
) -> list[str]:
    args = ["--engine", "embedded", "--max-batch", str(int(max_batch))]
    args += ["--max-seq-len", str(int(max_seq_len)), "--dtype", dtype, "--param-dtype", dtype]
    if checkpoint:
        args += ["--checkpoint", checkpoint]
    else:
        args += ["--model-config", json.dumps(model_cfg.to_hf())]
    return args


def _default_spec(server_args: list[str], num_engines: int) -> EngineSpec:
    """No devices given: `num_engines` processes in this process's environment."""
    return EngineSpec(
        server_args, [EngineDevices((), 1, 0.9)] * int(num_engines), sys.executable, None
    )


def _manager(spec: EngineSpec, request_timeout_s: float, placed: bool) -> EngineManager:
    return EngineManager(
        spec.server_args,
        num_engines=spec.num_engines,
        request_timeout_s=request_timeout_s,
        engine_envs=spec.envs if placed else None,
        python=spec.python,
    ).start()


class TeacherService:
    """A frozen teacher served by `num_engines` engine processes, with a `TeacherScorer`.

    Use the constructors `from_checkpoint` / `from_model`.

    Attributes:
      manager: the EngineManager of the teacher processes.
      scorer: the asynchronous per-turn scorer over them.
      source: the checkpoint directory or snapshot path the teacher weights came from.
    """

    def __init__(self, manager: EngineManager, source: str, num_workers: int, max_batch: int):
        self.manager = manager
        self.source = source
        self.scorer = TeacherScorer(manager, num_workers=num_workers, max_batch=max_batch)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str,
        *,
        max_seq_len: int,
        max_batch: int = 8,
        num_engines: int = 1,
        dtype: str = "float32",
        request_timeout_s: float = 300.0,
        spec: EngineSpec | None = None,
    ) -> TeacherService:
        """Serves the Qwen3 HF safetensors directory `checkpoint` (loaded by the process)."""
        placed = spec is not None
        if spec is None:
            spec = _default_spec(
                _server_args(None, checkpoint, max_batch, max_seq_len, dtype), num_engines
            )
        manager = _manager(spec, request_timeout_s, placed)
        log.info("teacher: serving checkpoint %s (pids %s)", checkpoint, manager.pids)
        return cls(manager, checkpoint, num_workers=spec.num_engines, max_batch=max_batch)

    @classmethod
    def from_model(
        cls,
        model: qwen3.Qwen3,
        snapshot_root: str,
        *,
        max_seq_len: int,
        max_batch: int = 8,
        num_engines: int = 1,
        dtype: str = "float32",
        request_timeout_s: float = 300.0,
        spec: EngineSpec | None = None,
    ) -> TeacherService:
        """Serves an in-memory teacher: publishes its weights under `snapshot_root` as
        version 0 and waits until every teacher process loaded them."""
        placed = spec is not None
        if spec is None:
            spec = _default_spec(
                _server_args(model.cfg, "", max_batch, max_seq_len, dtype), num_engines
            )
        manager = _manager(spec, request_timeout_s, placed)
        try:
            _, params = nnx.split(model, nnx.Param)
            path = manager.publish(params, TEACHER_VERSION, snapshot_root)
        except BaseException:
            manager.close()
            raise
        log.info("teacher: serving snapshot %s (pids %s)", path, manager.pids)
        return cls(manager, path, num_workers=spec.num_engines, max_batch=max_batch)

    def score(self, token_lists: Sequence[Sequence[int]]) -> list:
        """Synchronous teacher log-probs of whole sequences (see EngineClient.score)."""
        return self.manager.score(token_lists)

    def close(self) -> None:
        """Finishes the queued scoring, then shuts the teacher processes down."""
        try:
            self.scorer.close()
        finally:
            self.manager.close()

    def __enter__(self) -> TeacherService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
