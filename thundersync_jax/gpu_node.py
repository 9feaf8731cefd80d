"""The GPU node (`config.node`): which GPUs each role owns, and the learner process's settings.

`node_gpus(config)` hands the node's GPUs out in one order: rollout engines, then teacher
engines, then the learner (`rollout/engine_cmd.py` places the engines on theirs). On an 8-GPU
node the rollout (and teacher) engines own the first GPUs and the learner the rest. JAX
would otherwise see every GPU and preallocate 75% of each, including the engines' GPUs.
`learner_env(config)` gives the environment the learner needs before JAX starts:

  CUDA_VISIBLE_DEVICES               the learner's GPUs only (so the mesh uses all it sees)
  XLA_PYTHON_CLIENT_PREALLOCATE=true  preallocate, on its own GPUs only
  XLA_PYTHON_CLIENT_MEM_FRACTION     node.memory_headroom: the capacity the planner budgets

`apply_learner_env(config)` sets them in this process (the trainers call it first).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

log = logging.getLogger(__name__)


def node_gpus(config: Any) -> dict[str, range] | None:
    """The node's GPUs of each role, in the one order: rollout, then teacher, then learner.

    None without a GPU `node` (CPU configs). The learner's share is also what
    `learner_env` makes visible to the learner process.
    """
    node = config.get("node")
    if node is None or int(node.num_gpus) == 0:
        return None
    total, rollout = int(node.num_gpus), int(node.rollout_gpus)
    teacher, learner = int(node.teacher_gpus), int(node.learner_gpus)
    if min(rollout, teacher, learner) < 0 or rollout + teacher + learner > total:
        raise ValueError(
            f"node: rollout_gpus {rollout} + teacher_gpus {teacher} + learner_gpus {learner} "
            f"> num_gpus {total} (or one is negative)"
        )
    return {
        "rollout": range(0, rollout),
        "teacher": range(rollout, rollout + teacher),
        "learner": range(rollout + teacher, rollout + teacher + learner),
    }


def backends_started() -> bool:
    """Whether JAX has started its backends in this process (XLA read its flags already).

    Public API only: `jax_num_cpu_devices` may change only before the backends start, so asking
    to change it (and putting it back) tells which side of that moment this process is on.
    """
    import jax

    current = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", current + 1 if current > 0 else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", current)
    return False


def _gpu_node(config: Any):
    node = config.get("node")
    if node is None or int(node.num_gpus) == 0:
        return None
    return node


def learner_gpu_ids(config: Any) -> tuple[int, ...]:
    """The node's GPUs left to the learner after the rollout and teacher GPUs; () on CPU."""
    owned = node_gpus(config)  # the one GPU order of engines and learner
    if owned is None:
        return ()
    learner = len(owned["learner"])
    mesh_devices = int(config.mesh.fsdp) * int(config.mesh.tp)
    if mesh_devices != learner:
        raise ValueError(
            f"config.mesh fsdp={config.mesh.fsdp} x tp={config.mesh.tp} = {mesh_devices} "
            f"devices, but node.learner_gpus={learner}; make them equal"
        )
    return tuple(owned["learner"])


def learner_env(config: Any) -> dict[str, str]:
    """Environment variables for the learner process ({} without a GPU `node`)."""
    node = _gpu_node(config)
    if node is None:
        return {}
    fraction = float(node.memory_headroom)
    if not 0 < fraction <= 1:
        raise ValueError(f"node.memory_headroom={fraction} must be in (0, 1]")
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in learner_gpu_ids(config)),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.2f}",
    }


def apply_learner_env(
    config: Any, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Sets `learner_env(config)` in `environ` (default os.environ) unless CPU is forced.

    A launcher that already set CUDA_VISIBLE_DEVICES keeps its choice. Raises RuntimeError
    when a GPU backend already started, since XLA reads these variables only at start-up.
    """
    environ = os.environ if environ is None else environ
    wanted = learner_env(config)
    if not wanted or environ.get("JAX_PLATFORMS", "") == "cpu":
        return {}
    if backends_started():
        import jax

        if jax.default_backend() != "cpu":
            raise RuntimeError(
                "the learner's GPU settings must be set before JAX starts its GPU backend; "
                f"start the process with {wanted}"
            )
        return {}
    if "CUDA_VISIBLE_DEVICES" in environ:
        wanted.pop("CUDA_VISIBLE_DEVICES")
    for key, value in wanted.items():
        environ[key] = value
    log.info("learner placement: %s", wanted)
    return wanted
