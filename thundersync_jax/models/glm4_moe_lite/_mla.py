"""Multi-head latent attention (MLA, DeepSeek-V2 / GLM-4.7-Flash) with a compressed cache.

Axis letters: B batch, T queries, S key slots, D hidden, N heads, R q_lora_rank,
C kv_lora_rank, P qk_rope_head_dim, H qk_nope_head_dim + P, E v_head_dim.

Per token the cache holds what MLA compresses keys and values into: the normed latent
(C numbers) and the rotated shared rope key (P numbers), not N·(H + E) per-head keys and
values. It is a `qwen3.KVCache` whose `k` field holds the latents [L, B, S, 1, C] and whose
`v` field the rope keys [L, B, S, 1, P]; keys and values are re-expanded per call.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from thundersync_jax.models import attention, qwen3

_LATENT_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the default eps


def rope(x, positions, theta: float, interleave: bool):
    """RoPE over the last axis. interleave: DeepSeek's pairs (x0, x1), (x2, x3), ... rotated
    and written out as [evens', odds'] (transformers' apply_rotary_pos_emb_interleave);
    else rotate-half."""
    if not interleave:
        return qwen3.apply_rope(x, positions, theta)
    p = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, p, 2, dtype=jnp.float32) / p))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, P/2]
    cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class MLAttention(nnx.Module):
    """MLA as transformers' Glm4MoeLiteAttention computes it (eager path)."""

    def __init__(self, cfg, *, dtype, param_dtype, rngs: nnx.Rngs):
        d, n = cfg.hidden_size, cfg.num_attention_heads
        c, p, e = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim
        h = cfg.qk_head_dim
        self.cfg, self.dtype = cfg, dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        bias = cfg.attention_bias
        if cfg.q_lora_rank is None:
            self.q_proj = qwen3.Linear(
                "BTD,DNH->BTNH", (d, n, h), ("embed", "q_heads", "head_dim"), **kw
            )
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            r = cfg.q_lora_rank
            self.q_proj = None
            self.q_a_proj = qwen3.Linear(
                "BTD,DR->BTR", (d, r), ("embed", "latent"), ("latent",) if bias else None, **kw
            )
            self.q_a_layernorm = qwen3.RMSNorm(r, _LATENT_EPS, **kw)
            self.q_b_proj = qwen3.Linear(
                "BTR,RNH->BTNH", (r, n, h), ("latent", "q_heads", "head_dim"), **kw
            )
        self.kv_a_proj_with_mqa = qwen3.Linear(
            "BTD,DC->BTC", (d, c + p), ("embed", "latent"), ("latent",) if bias else None, **kw
        )
        self.kv_a_layernorm = qwen3.RMSNorm(c, _LATENT_EPS, **kw)
        self.kv_b_proj = qwen3.Linear(
            "BSC,CNH->BSNH",
            (c, n, cfg.qk_nope_head_dim + e),
            ("latent", "q_heads", "head_dim"),
            **kw,
        )
        self.o_proj = qwen3.Linear(
            "BTNE,NED->BTD",
            (n, e, d),
            ("q_heads", "head_dim", "embed"),
            ("embed",) if bias else None,
            **kw,
        )

    def queries(self, x, positions):
        """[B, T, N, H]: the no-rope part, then the rotated rope part, per head."""
        cfg = self.cfg
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_rot = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
        q_rot = rope(q_rot, positions, cfg.rope_theta, cfg.rope_interleave)
        return jnp.concatenate([q_nope, q_rot], axis=-1)

    def compress(self, x, positions):
        """What the cache stores per token: normed latent [B,T,1,C], rotated rope key
        [B,T,1,P]."""
        cfg = self.cfg
        ckv = self.kv_a_proj_with_mqa(x)  # [B, T, C + P]
        latent = self.kv_a_layernorm(ckv[..., : cfg.kv_lora_rank])[:, :, None]
        k_rot = ckv[..., cfg.kv_lora_rank :][:, :, None]
        return latent, rope(k_rot, positions, cfg.rope_theta, cfg.rope_interleave)

    def expand(self, latent, k_rot):
        """Per-head keys [B,S,N,H] and values [B,S,N,E] from the compressed cache."""
        cfg = self.cfg
        kv = self.kv_b_proj(latent[:, :, 0])  # [B, S, N, nope + E]
        k_nope, v = kv[..., : cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim :]
        k_rot = jnp.broadcast_to(k_rot, k_nope.shape[:3] + (k_rot.shape[-1],))
        return jnp.concatenate([k_nope, k_rot.astype(k_nope.dtype)], axis=-1), v

    def __call__(self, x, positions, q_slots, kv_valid, cache_layer=None):
        """Output [B, T, D] and, with `cache_layer` (latents, rope keys, layer, write_index),
        the updated full compressed-cache arrays."""
        q = self.queries(x, positions)
        latent, k_rot = self.compress(x, positions)
        new_kv = None
        if cache_layer is not None:
            lat_all, rot_all, layer, write_index = cache_layer
            lat_all = qwen3.write_layer(lat_all, layer, latent, write_index)
            rot_all = qwen3.write_layer(rot_all, layer, k_rot, write_index)
            new_kv = (lat_all, rot_all)
            latent = lat_all[layer].astype(self.dtype)
            k_rot = rot_all[layer].astype(self.dtype)
        k, v = self.expand(latent, k_rot)
        out = attention.dot_product_attention(
            q, k, v, q_slots=q_slots, kv_valid=kv_valid, scale=self.cfg.softmax_scale
        )
        return self.o_proj(out), new_kv


def init_cache(cfg, batch_size: int, max_len: int, dtype=jnp.float32) -> qwen3.KVCache:
    """An empty compressed cache: latents [L,B,S,1,C] in `k`, rope keys [L,B,S,1,P] in `v`."""
    if batch_size < 1 or max_len < 1:
        raise ValueError(f"batch_size={batch_size} and max_len={max_len} must both be >= 1")
    lead = (cfg.num_hidden_layers, batch_size, max_len, 1)
    return qwen3.KVCache(
        k=jnp.zeros(lead + (cfg.kv_lora_rank,), dtype),
        v=jnp.zeros(lead + (cfg.qk_rope_head_dim,), dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )
