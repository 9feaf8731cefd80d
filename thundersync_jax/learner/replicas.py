"""Data-parallel learner replicas: the one cross-process sum per step, and the replica check.

Each process keeps its parameters, optimizer state and tallies on its own devices (its
`fsdp` x `tp` mesh), so per-chunk work never waits for another process. At batch end each
process holds a partial gradient; `cross_process_sum` lifts every leaf onto the global
(dp, fsdp, tp) mesh with a leading `dp` axis of size P (no copy: the same device buffers),
sums over it in one jitted program, and hands back process-local arrays with the leaf's
original sharding. Every replica then applies the same optax update to the same sum, so the
replicas stay bitwise identical (`check_replicas_identical` proves it in debug mode).
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DP = "dp"


def _local_spec(leaf: jax.Array) -> PartitionSpec:
    sharding = leaf.sharding
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    return PartitionSpec()  # single-device or replicated leaf


def _lift(leaf: jax.Array, global_mesh: Mesh) -> jax.Array:
    """The process-local `leaf` as shard [process_index] of a global [P, ...] array."""
    if len(leaf.addressable_shards) != global_mesh.devices[0].size:
        # On fewer devices than the process's row (e.g. a tally counter): replicate it there.
        leaf = jax.device_put(leaf, NamedSharding(_row_mesh(global_mesh), PartitionSpec()))
    spec = PartitionSpec(DP, *_local_spec(leaf))
    sharding = NamedSharding(global_mesh, spec)
    shape = (global_mesh.shape[DP], *leaf.shape)
    by_device = {s.device: s for s in leaf.addressable_shards}
    order = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        shard = by_device[device]
        if tuple(index[1:]) != tuple(shard.index):
            # The process's own mesh and its row of the global mesh order devices differently.
            raise ValueError(
                f"device {device} holds slice {shard.index} locally but {index[1:]} in the "
                "global mesh: build both meshes with the same device order"
            )
        order.append(shard.data[None])
    return jax.make_array_from_single_device_arrays(shape, sharding, order)


def _lower(summed: jax.Array, like: jax.Array) -> jax.Array:
    """Back to a process-local array with `like`'s sharding (same device buffers)."""
    by_device = {s.device: s.data for s in summed.addressable_shards}
    local = [by_device[d] for d in like.sharding.addressable_devices_indices_map(like.shape)]
    return jax.make_array_from_single_device_arrays(like.shape, like.sharding, local)


def _sum_leaves(stacked: Any) -> Any:
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), stacked)


def make_cross_process_sum(global_mesh: Mesh, reduce=_sum_leaves):
    """Returns sum(tree) -> tree: Σ over processes of every leaf, one jitted program per tree.

    `reduce`: the stacked tree (every leaf [P, ...]) -> a tree of the same structure and
    leaf shapes [...]; the default sums each leaf. Deterministic mode passes the exact sum
    of fixed-point tallies (`accumulators._exact.sum_stacked`), not a float sum.
    """
    cache: dict[Any, Any] = {}

    def summed(tree: Any) -> Any:
        leaves, treedef = jax.tree.flatten(tree)
        lifted = [_lift(x, global_mesh) for x in leaves]
        key = (treedef, tuple((x.shape, x.dtype, x.sharding.spec) for x in lifted))
        if key not in cache:
            out = tuple(
                NamedSharding(global_mesh, PartitionSpec(*x.sharding.spec[1:])) for x in lifted
            )

            def program(xs, treedef=treedef):
                return tuple(jax.tree.leaves(reduce(jax.tree.unflatten(treedef, xs))))

            cache[key] = jax.jit(program, out_shardings=out)
        result = cache[key](tuple(lifted))
        return jax.tree.unflatten(
            treedef, [_lower(r, x) for r, x in zip(result, leaves, strict=True)]
        )

    summed.compiled_programs = cache  # for tests: count the collectives of the lowered program
    return summed


def tree_digest(tree: Any) -> str:
    """A hash of every leaf's bytes (process-local view): equal digests = identical replicas."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        for shard in sorted(leaf.addressable_shards, key=lambda s: str(s.index)):
            h.update(np.asarray(shard.data).tobytes())
    return h.hexdigest()


def check_replicas_identical(tree: Any, step: int) -> None:
    """Debug mode: every process's copy of `tree` has the same bits; raises naming the step."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return
    digest = np.frombuffer(bytes.fromhex(tree_digest(tree)), dtype=np.uint8)
    every = np.asarray(multihost_utils.process_allgather(digest))
    if not (every == every[0]).all():
        bad = [i for i in range(every.shape[0]) if not (every[i] == every[0]).all()]
        raise RuntimeError(f"step {step}: replicas diverged: processes {bad} differ from process 0")


def _row_mesh(global_mesh: Mesh) -> Mesh:
    """This process's row of the global mesh, as an ("fsdp", "tp") mesh."""
    return Mesh(global_mesh.devices[jax.process_index()], global_mesh.axis_names[1:])


def to_global(leaf: jax.Array, global_mesh: Mesh) -> jax.Array:
    """The process-local `leaf` as a global array replicated over `dp` (same buffers).

    Orbax writes a global array's replica 0 only, so a save of identical replicas writes
    each byte once (process 0's devices) while every process takes part.
    """
    if len(leaf.addressable_shards) != global_mesh.devices[0].size:
        leaf = jax.device_put(leaf, NamedSharding(_row_mesh(global_mesh), PartitionSpec()))
    sharding = NamedSharding(global_mesh, _local_spec(leaf))
    by_device = {s.device: s for s in leaf.addressable_shards}
    buffers = []
    for device, index in sharding.addressable_devices_indices_map(leaf.shape).items():
        shard = by_device[device]
        if tuple(index) != tuple(shard.index):
            raise ValueError(
                f"device {device} holds slice {shard.index} locally but {index} in the "
                "global mesh: build both meshes with the same device order"
            )
        buffers.append(shard.data)
    return jax.make_array_from_single_device_arrays(leaf.shape, sharding, buffers)


def global_sharding(leaf: Any, global_mesh: Mesh) -> NamedSharding:
    """The replicated-over-dp sharding `to_global` gives `leaf` (for restore targets)."""
    sharding = getattr(leaf, "sharding", None)
    spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
    return NamedSharding(global_mesh, spec)


def to_local(global_leaf: jax.Array, like: Any) -> jax.Array:
    """A global replicated array back to process-local with `like`'s sharding."""
    return _lower(global_leaf, like)
