"""The Qwen3 model's building blocks: projections, RMSNorm, embedding and RoPE.

Axis letters and parameter naming as in `_modules.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

_INIT_STD = 0.02  # HF initializer_range for Qwen2/Qwen3


def _param(
    rngs: nnx.Rngs,
    init: Callable,
    shape: Sequence[int],
    dtype: jnp.dtype,
    axes: tuple[str, ...],
) -> nnx.Param:
    """A parameter annotated with logical axis names (mapped to a mesh by the sharding rules).

    eager_sharding=False: the names are metadata only; the model builds without a mesh, and
    the sharding rules decide placement later (e.g. jit with out_shardings under eval_shape).
    """
    annotated = nnx.with_partitioning(init, axes, eager_sharding=False)
    return nnx.Param(annotated(rngs.params(), tuple(shape), dtype))


class Linear(nnx.Module):
    """A projection written as one einsum, with an optional bias over the output axes."""

    def __init__(
        self,
        einsum_str: str,
        kernel_shape: Sequence[int],
        kernel_axes: tuple[str, ...],
        bias_axes: tuple[str, ...] | None = None,
        *,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.einsum_str = einsum_str
        self.dtype = dtype
        self.kernel = _param(
            rngs, nnx.initializers.normal(_INIT_STD), kernel_shape, param_dtype, kernel_axes
        )
        if bias_axes is None:
            self.bias = None
        else:
            bias_shape = kernel_shape[len(kernel_shape) - len(bias_axes) :]
            self.bias = _param(rngs, nnx.initializers.zeros, bias_shape, param_dtype, bias_axes)

    def __call__(self, x: Array) -> Array:
        y = jnp.einsum(self.einsum_str, x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, statistics in float32 (as HF's Qwen3RMSNorm)."""

    def __init__(
        self, dim: int, eps: float, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        self.eps = eps
        self.dtype = dtype
        self.scale = _param(rngs, nnx.initializers.ones, (dim,), param_dtype, ("norm",))

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        # HF rounds the normalized activations to the input dtype before scaling.
        return self.scale[...].astype(self.dtype) * normed.astype(x.dtype).astype(self.dtype)


class Embed(nnx.Module):
    """Token embedding; `attend` is the tied LM head (logits in float32)."""

    def __init__(
        self, vocab_size: int, dim: int, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        self.dtype = dtype
        self.embedding = _param(
            rngs,
            nnx.initializers.normal(_INIT_STD),
            (vocab_size, dim),
            param_dtype,
            ("vocab", "embed"),
        )

    def __call__(self, ids: Int[Array, "B T"]) -> Float[Array, "B T D"]:
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)

    def attend(self, x: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        table = self.embedding[...].astype(self.dtype)
        return jnp.einsum("BTD,VD->BTV", x, table, preferred_element_type=jnp.float32)


def apply_rope(
    x: Float[Array, "B T N H"], positions: Int[Array, "B T"], theta: float
) -> Float[Array, "B T N H"]:
    """Default RoPE, HF's rotate-half convention (first half of H pairs with the second half)."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rotated * sin
