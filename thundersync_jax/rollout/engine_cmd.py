"""The engine processes of a run, from its config: command line, GPUs, interpreter, load probe.

    spec = engine_cmd.rollout_engines(config, model_cfg, workdir)
    manager = EngineManager(spec.server_args, spec.num_engines, engine_envs=spec.envs,
                            python=spec.python, load_probe=spec.load_probe)
    teacher_spec = engine_cmd.teacher_engines(config, teacher_cfg)        # OPD's teacher

Engine devices (`config.node`, GPU configs): the node's GPUs are handed out in order — rollout
engines first (engine i gets GPUs [i·rollout_tp, (i+1)·rollout_tp)), then teacher engines, then the
learner — so engines and the learner never share a GPU. Each engine process sees only its GPUs
(CUDA_VISIBLE_DEVICES), runs vLLM with tensor parallelism over all of them and takes
`node.rollout_memory_fraction` of each. Teacher engines are embedded JAX engines (they only
score): each sees its GPUs and XLA takes `node.teacher_memory_fraction` (default: the rollout
fraction) of them. Without a `node` section (CPU configs) engines get no GPU.
`check_engine_config(config)` refuses a GPU layout or engine setting that could not run; the
trainer calls it at start-up, before anything is built.

vLLM pins its own torch and transformers, so it usually lives in a second environment; the
engine interpreter is `rollout.engine_python`, else $THUNDERSYNC_VLLM_PYTHON, else the
repository's `.venv-vllm` (what `make test` builds), else this interpreter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from thundersync_jax.gpu_node import node_gpus
from thundersync_jax.rollout import load_probe
from thundersync_jax.rollout import server as rollout_server

ENGINES = ("embedded", "vllm")
VLLM_PYTHON_ENV = "THUNDERSYNC_VLLM_PYTHON"
_REPO_VLLM_PYTHON = os.path.join(
    os.path.dirname(__file__), "..", "..", ".venv-vllm", "bin", "python"
)


@dataclasses.dataclass(frozen=True)
class EngineDevices:
    """Where one engine process runs.

    Attributes:
      gpus: the node's GPU indices it owns (empty: no GPU, a CPU engine).
      tp_size: tensor-parallel size (= len(gpus) on a GPU, 1 on CPU).
      memory_fraction: of each of its GPUs that vLLM (or XLA, for a JAX engine) may take.
      jax_on_gpu: the engine is a JAX one (embedded) that runs on its GPUs; a vLLM engine's JAX
        only converts snapshots, on the CPU.
    """

    gpus: tuple[int, ...]
    tp_size: int
    memory_fraction: float
    jax_on_gpu: bool = False

    def env(self) -> dict[str, str]:
        """Environment of the engine process: its GPUs only (JAX on them, or on the CPU)."""
        if not self.gpus:
            return {"JAX_PLATFORMS": "cpu"}
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}
        if self.jax_on_gpu:
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{self.memory_fraction:.2f}"
        else:
            env["JAX_PLATFORMS"] = "cpu"
        return env


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything EngineManager needs to start a role's engines (see the module docstring)."""

    server_args: list[str]
    devices: list[EngineDevices]
    python: str
    load_probe: Callable[[Any, str], dict | None] | None
    start_timeout_s: float = 180.0

    @property
    def num_engines(self) -> int:
        return len(self.devices)

    @property
    def envs(self) -> list[dict[str, str]]:
        return [p.env() for p in self.devices]


def _check_fraction(name: str, value: float) -> float:
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return float(value)


def engine_devices(config: Any, role: str = "rollout") -> list[EngineDevices]:
    """The engines of `role` ("rollout" or "teacher") and their GPUs, from `config.node`."""
    if role not in ("rollout", "teacher"):
        raise ValueError(f"role must be 'rollout' or 'teacher', got {role!r}")
    num = int(config.rollout.num_engines) if role == "rollout" else int(config.teacher.num_engines)
    if num < 1:
        raise ValueError(f"{role}: num_engines must be >= 1, got {num}")
    owned = node_gpus(config)
    if owned is None:
        return [EngineDevices((), 1, 0.9)] * num
    node = config.node
    first, gpus = owned[role].start, len(owned[role])
    tp = int(node.rollout_tp) if role == "rollout" else int(node.teacher_tp)
    if tp < 1 or num * tp != gpus:
        raise ValueError(
            f"node: {num} {role} engine(s) x tensor parallel {tp} must use exactly the "
            f"{gpus} {role} GPUs (set {role}.num_engines x node.{role}_tp = node.{role}_gpus)"
        )
    fraction = _check_fraction("node.rollout_memory_fraction", node.rollout_memory_fraction)
    jax_on_gpu = role == "teacher" or config.rollout.engine == "embedded"
    if role == "teacher":
        fraction = _check_fraction(
            "node.teacher_memory_fraction", float(node.teacher_memory_fraction) or fraction
        )
    if jax_on_gpu and tp != 1:
        raise ValueError(
            f"node.{role}_tp={tp}: the embedded (JAX) {role} engine runs on one GPU; set "
            f"node.{role}_tp=1 and {role}.num_engines = node.{role}_gpus ({gpus})"
        )
    return [
        EngineDevices(tuple(range(first + i * tp, first + (i + 1) * tp)), tp, fraction, jax_on_gpu)
        for i in range(num)
    ]


def engine_python(config: Any) -> str:
    """The interpreter of the engine processes (see the module docstring)."""
    if config.rollout.engine != "vllm":
        return sys.executable
    chosen = config.rollout.engine_python or os.environ.get(VLLM_PYTHON_ENV, "")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise ValueError(
                f"rollout.engine_python / ${VLLM_PYTHON_ENV}: {chosen!r} is not "
                "an executable interpreter"
            )
        return chosen
    repo = os.path.normpath(_REPO_VLLM_PYTHON)
    return repo if os.access(repo, os.X_OK) else sys.executable


def find_vllm_python() -> str | None:
    """An interpreter with vLLM installed ($THUNDERSYNC_VLLM_PYTHON or .venv-vllm), else None.

    The probe finds the package without importing it (`import vllm` costs ~4 CPU-s, and the
    test suite asks once per module and worker); a broken install then fails at engine start
    with vLLM's own error rather than reading as "not installed".
    """
    import subprocess

    chosen = os.environ.get(VLLM_PYTHON_ENV) or os.path.normpath(_REPO_VLLM_PYTHON)
    if not os.access(chosen, os.X_OK):
        return None
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    probe = subprocess.run([chosen, "-I", "-c", code], capture_output=True, timeout=60)
    return chosen if probe.returncode == 0 else None


def engine_checkpoint(config: Any, model_cfg: Any, workdir: str) -> tuple[str, dict]:
    """(HF directory, extra vllm.LLM kwargs) the vLLM engine starts from.

    `model.checkpoint` when given; otherwise a directory with the model's config.json only and
    vLLM's dummy weights (the trainer publishes and verifies the real ones before sampling).
    """
    if config.model.checkpoint:
        return str(config.model.checkpoint), {}
    path = os.path.join(workdir, "engine_config")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**model_cfg.to_hf(), "torch_dtype": str(config.model.param_dtype)}, f, indent=2)
    return path, {"load_format": "dummy"}


def check_engine_config(config: Any) -> None:
    """Refuses engine settings that could not run, naming the value and what is valid."""
    engine = config.rollout.engine
    if engine not in ENGINES:
        raise ValueError(f"rollout.engine must be one of {ENGINES}, got {engine!r}")
    if engine == "vllm" and config.lora.enabled and config.lora.publish != "merged":
        raise ValueError(
            "rollout.engine='vllm' loads full weights: set lora.publish='merged' "
            f"(got {config.lora.publish!r})"
        )
    check_routing(config)
    engine_devices(config, "rollout")
    if config.rl.algorithm == "opd" and config.get("teacher") is not None:
        engine_devices(config, "teacher")


def replays_vllm_routes(config: Any) -> bool:
    """Whether the run replays a MoE policy's routes from vLLM engines (they must return them)."""
    from thundersync_jax.models import auto

    if config.rollout.engine != "vllm" or str(config.model.routing) != "replay":
        return False
    return any(auto.layer_pattern(auto.config_from_section(config.model)))


def check_routing(config: Any) -> None:
    """Refuses routing replay of a MoE policy on vLLM's CPU backend, which returns no routes.

    vLLM 0.32 returns routed experts only from Model Runner V2, which needs Triton: not on its
    CPU backend. Recomputing instead would silently drop the on-policy guarantee `replay` was
    asked for, so the run is refused and the user chooses `recompute` knowingly.
    """
    if replays_vllm_routes(config) and not engine_devices(config, "rollout")[0].gpus:
        raise ValueError(
            "model.routing='replay' needs the engine's routed experts, and vLLM's CPU backend "
            "(rollout.engine='vllm' without GPUs) reports none (vLLM 0.32 returns them only "
            "from Model Runner V2, which needs Triton): set model.routing='recompute' (the "
            "learner routes every token itself; routing_disagreement is not reported)"
        )


def rollout_engines(config: Any, model_cfg: Any, workdir: str) -> EngineSpec:
    """The rollout engines' command line, devices, interpreter and load probe."""
    check_engine_config(config)
    ro = config.rollout
    places = engine_devices(config, "rollout")
    kwargs: dict[str, Any] = dict(
        engine=ro.engine,
        max_batch=int(ro.max_batch),
        max_seq_len=int(ro.max_traj_tokens),
        dtype=str(config.model.dtype),
        param_dtype=str(config.model.param_dtype),
        init_seed=int(config.seed),
        tp_size=places[0].tp_size,
        memory_fraction=places[0].memory_fraction,
    )
    probe = None
    if ro.engine == "vllm":
        checkpoint, vllm_kwargs = engine_checkpoint(config, model_cfg, workdir)
        vllm_kwargs.update(json.loads(ro.vllm_kwargs or "{}"))
        if not places[0].gpus:  # vLLM's CPU backend: a small KV cache (vllm_engine: eager)
            kwargs["memory_fraction"] = float(ro.cpu_memory_fraction)
        elif replays_vllm_routes(config):  # each result then carries its tokens' routes
            vllm_kwargs.setdefault("enable_return_routed_experts", True)
        args = rollout_server.server_args(
            None, checkpoint=checkpoint, vllm_kwargs=vllm_kwargs, **kwargs
        )
        atol = float(ro.probe_atol) or load_probe.default_atol(str(config.model.dtype))
        probe = load_probe.learner_probe(model_cfg, int(ro.probe_tokens), atol=atol)
    else:
        args = rollout_server.server_args(model_cfg.to_hf(), **kwargs)
    # vLLM starts in ~0.5-2 min on CPU (shared machine), minutes for a large model on GPUs.
    start_timeout_s = 900.0 if ro.engine == "vllm" else 180.0
    return EngineSpec(args, places, engine_python(config), probe, start_timeout_s)


def teacher_engines(config: Any, model_cfg: Any = None) -> EngineSpec:
    """The teacher engines' command line and devices (embedded engines that only score).

    Args:
      config: the run config (`teacher`, `rollout.max_traj_tokens`, `node`).
      model_cfg: the embedded teacher's `Qwen3Config` (its weights arrive as a published
        snapshot); None serves `teacher.checkpoint`, which the process loads itself.
    """
    t = config.teacher
    places = engine_devices(config, "teacher")
    if model_cfg is None and not t.checkpoint:
        raise ValueError("teacher_engines: give the teacher's model config or teacher.checkpoint")
    dtype = str(t.model.dtype)
    args = rollout_server.server_args(
        None if model_cfg is None else model_cfg.to_hf(),
        checkpoint=str(t.checkpoint) if model_cfg is None else "",
        engine="embedded",
        max_batch=int(t.max_batch),
        max_seq_len=int(config.rollout.max_traj_tokens),
        dtype=dtype,
        param_dtype=dtype,
        tp_size=places[0].tp_size,
        memory_fraction=places[0].memory_fraction,
    )
    return EngineSpec(args, places, sys.executable, None)
