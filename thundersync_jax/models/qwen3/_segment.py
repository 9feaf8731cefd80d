"""A differentiable forward of new tokens against keys/values computed earlier (segments).

The sampling cache (`_cache.py`) scatters new keys into one [L, B, S, K, H] array inside the
model, which is fine for decoding but makes the cached keys hard to differentiate as inputs.
The learner's segments (DESIGN §2, "Segments: linear cost") need the opposite: the past keys
and values are explicit inputs (so the gradient has a cotangent for them) and the segment's
own keys and values are explicit outputs (so a later cotangent can be pushed back through
them). The output equals the one-shot forward over the whole sequence, because attention
over [past, new] is the same softmax as the one-shot's causal row, split in two blocks.

Axis letters as in `_modules.py`; L layers, S past slots, T new tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from thundersync_jax.models import attention
from thundersync_jax.models.qwen3 import _depth


class SegmentOutput(NamedTuple):
    """What a segment forward produces.

    Attributes:
      hidden: [B, T, D] final-norm hidden states of the new tokens (before the LM head).
      k: [L, B, T, K, H] the new tokens' keys (after k_norm and RoPE), one block per layer.
      v: [L, B, T, K, H] the new tokens' values.
    """

    hidden: Float[Array, "B T D"]
    k: Float[Array, "L B T K H"]
    v: Float[Array, "L B T K H"]


def _attend_two_blocks(attn, x, positions, token_mask, past_k, past_v, past_valid, impl):
    """One layer's attention of the new tokens over [past slots, new tokens].

    The keys are the past slots followed by the new tokens: new token t sits at slot S + t and
    sees every valid past slot and the real new tokens up to itself.
    """
    q, k, v = attn.project_qkv(x, positions)  # [B,T,N,H], [B,T,K,H], [B,T,K,H]
    b, t = q.shape[:2]
    past_s = past_k.shape[1]
    keys = jnp.concatenate([past_k.astype(attn.dtype), k], axis=1)  # [B, S+T, K, H]
    values = jnp.concatenate([past_v.astype(attn.dtype), v], axis=1)
    out = attention.dot_product_attention(
        q,
        keys,
        values,
        q_slots=jnp.broadcast_to(past_s + jnp.arange(t, dtype=jnp.int32), (b, t)),
        kv_valid=jnp.concatenate([past_valid, token_mask.astype(bool)], axis=1),
        impl=impl[0],
        block_q=impl[1],
        block_k=impl[1],
    )  # [B, T, N, H]
    return attn.o_proj(out), k, v


def _segment_layer(layer, x, positions, token_mask, past_k, past_v, past_valid, impl):
    attn, k, v = _attend_two_blocks(
        layer.self_attn,
        layer.input_layernorm(x),
        positions,
        token_mask,
        past_k,
        past_v,
        past_valid,
        impl,
    )
    x = x + attn
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, k, v


def segment_hidden_states(
    model,
    input_ids: Int[Array, "B T"],
    positions: Int[Array, "B T"],
    token_mask: Bool[Array, "B T"],
    past_k: Float[Array, "L B S K H"],
    past_v: Float[Array, "L B S K H"],
    past_valid: Bool[Array, "B S"],
) -> SegmentOutput:
    """Runs `model` (a `Qwen3`) over new tokens that attend to given past keys and values.

    Args:
      model: the Qwen3 module; `model.remat` rematerializes each layer in the backward pass,
        `model.scan_layers` runs the layers as one `lax.scan` (`_depth.py`).
      input_ids: int32 [B, T] the new tokens.
      positions: int32 [B, T] their absolute RoPE positions (continuing the past).
      token_mask: bool [B, T], False = padding: never attended to by any query.
      past_k: [L, B, S, K, H] keys of earlier tokens (after k_norm and RoPE), e.g. an earlier
        segment's `SegmentOutput.k` written into a per-trajectory cache. S may be 0.
      past_v: [L, B, S, K, H] their values.
      past_valid: bool [B, S], False = an empty or padded slot, masked out exactly.

    Returns:
      `SegmentOutput`; queries see every valid past slot and the real new tokens up to
      themselves, so with the past of tokens 0..P-1 this equals rows P.. of the one-shot
      forward over the whole sequence.
    """
    input_ids = jnp.asarray(input_ids, jnp.int32)
    num_layers = len(model.layers)
    if input_ids.ndim != 2 or positions.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {input_ids.shape} and positions {positions.shape} must be equal [B, T]"
        )
    if past_k.shape != past_v.shape or past_k.shape[0] != num_layers:
        raise ValueError(
            f"past_k {past_k.shape} and past_v {past_v.shape} must both be "
            f"[L={num_layers}, B, S, K, H]"
        )
    if past_valid.shape != (input_ids.shape[0], past_k.shape[2]):
        raise ValueError(f"past_valid {past_valid.shape} must be [B, S={past_k.shape[2]}]")
    impl = (model.attention_impl, model.attention_block)  # static: (impl, block size)
    x = model.embed_tokens(input_ids)  # [B, T, D]
    if model.scan_layers:
        # One compiled layer body; each step slices its layer's past keys/values.
        def step(layer, x, k_past, v_past):
            x, k, v = _segment_layer(
                layer, x, positions, token_mask, k_past, v_past, past_valid, impl
            )
            return x, (k, v)

        x, (new_k, new_v) = _depth.scan_layers(
            model.layers, x, step, remat=model.remat, offload=False, per_layer=(past_k, past_v)
        )
        return SegmentOutput(model.norm(x), new_k, new_v)
    run = nnx.remat(_segment_layer, static_argnums=7) if model.remat else _segment_layer
    new_k, new_v = [], []
    for i, layer in enumerate(model.layers):
        x, k, v = run(layer, x, positions, token_mask, past_k[i], past_v[i], past_valid, impl)
        new_k.append(k)
        new_v.append(v)
    return SegmentOutput(model.norm(x), jnp.stack(new_k), jnp.stack(new_v))
