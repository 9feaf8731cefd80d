"""Loss-aggregation modes: the per-trajectory weight w_i and the batch normalizer Z.

∇L = −(1/Z) Σ_i A_i w_i h_i (DESIGN §2). w_i must be known when trajectory i
arrives; Z may depend on batch totals (B trajectories, N tokens), so it is
evaluated only at `finalize`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossAgg(NamedTuple):
    """One aggregation mode.

    Attributes:
      weight: num_tokens (int32 scalar) -> w_i (float32 scalar).
      normalizer: (num_trajectories, num_tokens, max_len) -> Z (float32 scalar);
        the counts are int32 batch totals, max_len a Python int or None.
      needs_max_len: the mode is undefined without `max_len`.
    """

    weight: Callable[[jax.Array], jax.Array]
    normalizer: Callable[[jax.Array, jax.Array, int | None], jax.Array]
    needs_max_len: bool = False


def _inverse_tokens(num_tokens: jax.Array) -> jax.Array:
    # A trajectory with no loss tokens has h_i = 0; weight 0 keeps it finite.
    n = jnp.asarray(num_tokens, jnp.float32)
    return jnp.where(n > 0, 1.0 / jnp.maximum(n, 1.0), 0.0)


def _one(num_tokens: jax.Array) -> jax.Array:
    del num_tokens
    return jnp.float32(1.0)


def _trajectories(b, n, max_len):
    del n, max_len
    return jnp.asarray(b, jnp.float32)


def _tokens(b, n, max_len):
    del b, max_len
    return jnp.asarray(n, jnp.float32)


def _trajectories_times_max_len(b, n, max_len):
    del n
    return jnp.asarray(b, jnp.float32) * jnp.float32(max_len)


_REGISTRY: dict[str, LossAgg] = {
    "seq-mean-token-mean": LossAgg(_inverse_tokens, _trajectories),
    "seq-mean-token-sum": LossAgg(_one, _trajectories),
    "token-mean": LossAgg(_one, _tokens),
    "seq-mean-token-sum-norm": LossAgg(_one, _trajectories_times_max_len, needs_max_len=True),
}


def register_loss_agg(
    name: str,
    weight: Callable[[jax.Array], jax.Array],
    normalizer: Callable[[jax.Array, jax.Array, int | None], jax.Array],
    *,
    needs_max_len: bool = False,
) -> None:
    """Makes a loss-aggregation mode selectable by name in `grpo`, `opd`, `regularizer`.

    Args:
      name: the new mode's name (must not exist yet).
      weight: num_tokens -> per-trajectory weight w_i, jnp-traceable.
      normalizer: (num_trajectories, num_tokens, max_len) -> Z, jnp-traceable.
      needs_max_len: the accumulator factory then rejects max_len=None.
    """
    if name in _REGISTRY:
        raise ValueError(f"loss_agg {name!r} is already registered")
    _REGISTRY[name] = LossAgg(weight, normalizer, needs_max_len)


def loss_agg_names() -> tuple[str, ...]:
    """Names of every registered aggregation mode."""
    return tuple(_REGISTRY)


def resolve_loss_agg(name: str, max_len: int | None) -> LossAgg:
    """Looks a mode up by name and checks its arguments."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown loss_agg {name!r}; registered modes: {sorted(_REGISTRY)}")
    mode = _REGISTRY[name]
    if mode.needs_max_len and (max_len is None or max_len <= 0):
        raise ValueError(f"loss_agg {name!r} needs max_len > 0 (got max_len={max_len!r})")
    return mode
