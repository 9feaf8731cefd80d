"""Host-resident tallies: where a GRPO accumulator keeps its parameter-sized sums (issue 15).

With `placement="host"` every parameter-sized tally of a GRPO-family state (the global
`total` and the per-open-group stacks `shifted`, `plain`, `buckets`) lives in the host
memory of the devices that hold the parameters (JAX memory kinds: each shard in its
device's host space, same `NamedSharding` otherwise), as the paper's accumulators do. Per
add the device computes the chunk's increment w·h (params-sized, as before), it is copied
to host memory (`jax.device_put(..., jax.memory.Space.Host)`) and the slot update runs on
the host (`compute_on("device_host")`): one XLA program, dispatched asynchronously, so the
copy and the host add run while Python prepares and dispatches the next chunk; nothing is
read back per chunk. `finalize` brings only `total` (batch scope: also its one slot) back
to the device, once per step.

Memory kinds in jax 0.10.2: CPU devices list `device`, `pinned_host` and `unpinned_host`
(and jit computes on host-memory arrays); GPUs have `pinned_host` (page-locked, DMA-able).
`host_memory_kind` picks `pinned_host` where the platform has it, else `unpinned_host`.

The update math is the device path's own function (`_group_ops`), applied to the same
float32 operands, so host- and device-resident runs add the same numbers in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.experimental.compute_on import compute_on
from jax.sharding import NamedSharding, SingleDeviceSharding

PLACEMENTS = ("device", "host")
_HOST_KINDS = ("pinned_host", "unpinned_host")  # in order of preference


def check_placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    return placement


def tally_placement(config) -> str:
    """Where a run's parameter-sized tallies live: its `accum.placement` ("device" or "host")."""
    accum = config.get("accum")
    return "device" if accum is None else str(accum.get("placement", "device"))


def host_memory_kind(device: jax.Device | None = None) -> str:
    """`pinned_host` where `device` has it, else `unpinned_host`; ValueError if neither."""
    device = device or jax.devices()[0]
    kinds = [m.kind for m in device.addressable_memories()]
    for kind in _HOST_KINDS:
        if kind in kinds:
            return kind
    raise ValueError(
        f"device {device} ({device.platform}) has no host memory space (memory kinds: "
        f"{kinds}); use placement='device'"
    )


def host_sharding(leaf) -> jax.sharding.Sharding:
    """The host-memory twin of `leaf`'s sharding (the default device's for numpy leaves)."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, (NamedSharding, SingleDeviceSharding)):
        device = next(iter(sharding.device_set))
        return sharding.with_memory_kind(host_memory_kind(device))
    device = jax.devices()[0]
    return SingleDeviceSharding(device, memory_kind=host_memory_kind(device))


def to_host(tree):
    """Copies every leaf to its devices' host memory (asynchronous; inside jit: annotated)."""
    return jax.device_put(tree, jax.memory.Space.Host)


def to_device(tree):
    """Copies every leaf back to device memory, same sharding."""
    return jax.device_put(tree, jax.memory.Space.Device)


def keep_on_host(tree):
    """`tree` as a traced program's host-memory output (unchanged outside a trace)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)):
        return to_host(tree)
    return tree


def on_host(update: Callable) -> Callable:
    """`update(*args)` run on the host: args moved to host memory, body in `compute_on`."""
    body = compute_on("device_host")(jax.jit(update))

    def run(*args):
        return body(*to_host(args))

    return run
