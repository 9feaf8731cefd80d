"""The learner's device mesh from `config.mesh`, and the sharding of chunk rows.

    mesh = learner_mesh(config.mesh)             # ("fsdp", "tp") over this process's devices
    rows = batch_sharding(mesh)                  # chunk rows split over "fsdp"

The mesh takes the first fsdp·tp local devices. On a GPU node the learner process only
sees its own GPUs (`gpu_node.learner_env` sets CUDA_VISIBLE_DEVICES from `config.node`),
so there the sizes use every device; under tests, 8 fake CPU devices host meshes of any
size up to 8. Multi-process runs (issue 15) add a leading "dp" axis across processes over
this per-process mesh; nothing here assumes a single process beyond `jax.local_devices()`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from thundersync_jax.models import sharding

log = logging.getLogger(__name__)


def valid_mesh_sizes(num_devices: int) -> list[tuple[int, int]]:
    """Every (fsdp, tp) whose product is `num_devices`."""
    return [(f, num_devices // f) for f in range(1, num_devices + 1) if num_devices % f == 0]


def check_mesh_sizes(fsdp: Any, tp: Any, num_devices: int) -> tuple[int, int]:
    """Validated (fsdp, tp) for `num_devices` devices; ValueError naming what would be valid."""
    for name, value in (("fsdp", fsdp), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.mesh.{name}={value!r} must be an int >= 1")
    if fsdp * tp > num_devices:
        choices = ", ".join(f"fsdp={f} tp={t}" for f, t in valid_mesh_sizes(num_devices))
        raise ValueError(
            f"config.mesh fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices but this process "
            f"has {num_devices} ({jax.default_backend()}); valid meshes using all of them: "
            f"{choices} (or any smaller product; the first fsdp·tp devices are used)"
        )
    return fsdp, tp


def _id(device) -> int:
    return int(device.id)


def learner_mesh(mesh_config: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ("fsdp", "tp") mesh of `config.mesh` over the first fsdp·tp local devices."""
    # Sorted by id, as `distributed.global_mesh` orders each process's row (replicas.py
    # lifts local buffers into that row and needs the same device for the same slice).
    devices = list(devices) if devices is not None else sorted(jax.local_devices(), key=_id)
    fsdp, tp = check_mesh_sizes(mesh_config.fsdp, mesh_config.tp, len(devices))
    if fsdp * tp < len(devices):
        log.info(
            "learner mesh fsdp=%d x tp=%d uses %d of %d devices", fsdp, tp, fsdp * tp, len(devices)
        )
    return sharding.make_mesh(fsdp, tp, devices[: fsdp * tp])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Chunk rows ([B, T] tokens, masks, weights) split over "fsdp", positions whole."""
    return NamedSharding(mesh, PartitionSpec("fsdp", None))


def replicated(mesh: Mesh) -> NamedSharding:
    """One copy on every device of the mesh (scalars, RNG keys, step counters)."""
    return NamedSharding(mesh, PartitionSpec())
