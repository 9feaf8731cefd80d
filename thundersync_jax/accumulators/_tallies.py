"""Parameter-sized float32 tallies that keep the parameters' shardings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from thundersync_jax.accumulators import _host


def zeros_like_params(params, host: bool = False):
    """A float32 zero tally per leaf; `zeros_like` keeps each leaf's sharding.

    host: made directly in the host memory of the leaf's devices (never on the device).
    """
    if host:
        return stacked_zeros(params, host=True)
    return jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params)


def _stacked_sharding(leaf, lead: int):
    """The leaf's NamedSharding with `lead` unsharded axes in front, or None."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, jax.core.Tracer) or not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (jnp.ndim(leaf) - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*((None,) * lead + spec)))


@functools.partial(jax.jit, static_argnames=("lead_dims", "dtype"))
def _unsharded_stacked_zeros(params, lead_dims, dtype):
    # One compilation per (structure, lead_dims) instead of one per leaf shape.
    return jax.tree.map(lambda p: jnp.zeros(lead_dims + jnp.shape(p), dtype), params)


def stacked_zeros(params, *lead_dims: int, host: bool = False, dtype=jnp.float32):
    """Zero tallies of shape lead_dims + leaf.shape, sharded like the leaf on its own axes.

    The slot axes are never sharded, so each slot's tally is laid out exactly
    like the parameter it accumulates. host: in the host memory of the leaf's devices
    (`_host.host_sharding`), made there directly (float32 only).
    """
    leaves = jax.tree.leaves(params)
    if host:
        return _host_zeros(params, tuple(lead_dims))
    if not any(_stacked_sharding(p, len(lead_dims)) for p in leaves):
        return _unsharded_stacked_zeros(params, tuple(lead_dims), jnp.dtype(dtype))

    def one(p):
        shape = tuple(lead_dims) + tuple(jnp.shape(p))
        sharding = _stacked_sharding(p, len(lead_dims))
        if sharding is None:
            return jnp.zeros(shape, dtype)
        return jnp.zeros(shape, dtype, device=sharding)

    return jax.tree.map(one, params)


def on_mesh_of(params, small):
    """`small` (a pytree of arrays) replicated on the mesh of params' sharded leaves, if any.

    A jitted add's outputs carry the mesh in their types; state made outside a jit does not,
    so its first add would trace and compile a second program for the later adds (measured: two
    traces of `add_weighted` per training run). Made on the mesh, every add is the same one.
    """
    for p in jax.tree.leaves(params):
        if isinstance(p, jax.core.Tracer):
            return small
        sharding = getattr(p, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return jax.device_put(small, NamedSharding(sharding.mesh, PartitionSpec()))
    return small


def _host_stacked_sharding(leaf, lead: int):
    sharding = _host.host_sharding(leaf)
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = tuple(sharding.spec) + (None,) * (jnp.ndim(leaf) - len(sharding.spec))
    spec = PartitionSpec(*((None,) * lead + spec))
    return NamedSharding(sharding.mesh, spec, memory_kind=sharding.memory_kind)


def _host_zeros(params, lead_dims: tuple[int, ...]):
    """Zeros made by one program whose outputs live in host memory (never on the device)."""
    shapes = jax.tree.map(lambda p: lead_dims + tuple(jnp.shape(p)), params)
    zeros = lambda: jax.tree.map(
        lambda shape: jnp.zeros(shape, jnp.float32), shapes, is_leaf=lambda x: isinstance(x, tuple)
    )
    if any(isinstance(p, jax.core.Tracer) for p in jax.tree.leaves(params)):
        return _host.to_host(zeros())  # under a trace: an annotated transfer
    shardings = jax.tree.map(lambda p: _host_stacked_sharding(p, len(lead_dims)), params)
    return jax.jit(zeros, out_shardings=shardings)()
