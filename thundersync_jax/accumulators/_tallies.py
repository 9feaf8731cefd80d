"""Parameter-sized float32 tallies that keep the parameters' shardings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def zeros_like_params(params):
    """A float32 zero tally per leaf; `zeros_like` keeps each leaf's sharding."""
    return jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params)


def _stacked_sharding(leaf, lead: int):
    """The leaf's NamedSharding with `lead` unsharded axes in front, or None."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, jax.core.Tracer) or not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (jnp.ndim(leaf) - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*((None,) * lead + spec)))


@functools.partial(jax.jit, static_argnames="lead_dims")
def _unsharded_stacked_zeros(params, lead_dims):
    # One compilation per (structure, lead_dims) instead of one per leaf shape.
    return jax.tree.map(lambda p: jnp.zeros(lead_dims + jnp.shape(p), jnp.float32), params)


def stacked_zeros(params, *lead_dims: int):
    """Zero tallies of shape lead_dims + leaf.shape, sharded like the leaf on its own axes.

    The slot axes are never sharded, so each slot's tally is laid out exactly
    like the parameter it accumulates.
    """
    leaves = jax.tree.leaves(params)
    if not any(_stacked_sharding(p, len(lead_dims)) for p in leaves):
        return _unsharded_stacked_zeros(params, tuple(lead_dims))

    def one(p):
        shape = tuple(lead_dims) + tuple(jnp.shape(p))
        sharding = _stacked_sharding(p, len(lead_dims))
        if sharding is None:
            return jnp.zeros(shape, jnp.float32)
        return jnp.zeros(shape, jnp.float32, device=sharding)

    return jax.tree.map(one, params)


def scaled_sum(coefficients, tallies):
    """Σ_j coefficients[j] · tallies[j] over the leading axis of each leaf."""
    return jax.tree.map(lambda t: jnp.tensordot(coefficients, t, axes=1), tallies)
