"""Scaled dot-product attention behind one function (naive reference implementation).

Axis letters: B batch, T queries, S keys, N query heads, K key/value heads, G = N // K,
H query/key head width, E value head width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def dot_product_attention(
    q: Float[Array, "B T N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K E"],
    *,
    q_slots: Int[Array, "B T"],
    kv_valid: Bool[Array, "B S"] | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
    block_q: int = 512,
    block_k: int = 512,
) -> Float[Array, "B T N E"]:
    """Causal grouped-query attention; softmax statistics in float32.

    Key slot s is visible to query t iff s <= q_slots[b, t], kv_valid[b, s] (when given) and
    the segment ids match (when given). Query head n reads key/value head n // (N // K).
    A query that sees nothing gets a uniform (finite) distribution, never NaN.
    `impl`, `block_q` and `block_k` select kernels in the full implementation; this one is
    the naive reference and ignores them.
    """
    del impl, block_q, block_k
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    scale = h**-0.5 if scale is None else scale
    qg = q.reshape(b, t, kv_heads, n // kv_heads, h)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32)
    slots = jnp.arange(k.shape[1], dtype=jnp.int32)
    mask = slots[None, None, :] <= q_slots[:, :, None]  # [B, T, S]
    if kv_valid is not None:
        mask = mask & kv_valid[:, None, :]
    if q_segment_ids is not None and kv_segment_ids is not None:
        mask = mask & (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])
    scores = jnp.where(mask[:, None, None], scores * scale, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BSKE->BTKGE", probs, v)  # [B, T, K, G, E]
    return out.reshape(b, t, n, v.shape[-1])
