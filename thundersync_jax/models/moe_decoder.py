"""A decoder-only causal LM whose feed-forward blocks are dense or sparse (MoE), in Flax NNX.

`MoeCausalLM` is the body Qwen3-MoE and GLM-4.7-Flash share; a subclass names its attention
class (`attention_cls`). Its interface is the dense `qwen3.Qwen3`'s (`__call__`,
`hidden_states`, `logits_from_hidden`, a `KVCache`), plus routing:

  routes: int [B, T, L_moe, K], the experts each token was routed to in each MoE layer (in
    layer order), e.g. by the inference engine that sampled it; given, the MoE blocks use
    them instead of their own top-k (routing replay, see `models/moe.py`).
  return_routes=True: `hidden_states` also returns the router's own choice, same shape.

The config (`cfg`) provides vocab_size, hidden_size, intermediate_size, num_hidden_layers,
rms_norm_eps, tie_word_embeddings, `sparse_layers` (bool per layer) and `moe` (a MoeSpec).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Int

from thundersync_jax.models import moe, qwen3


class DecoderLayer(nnx.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)); ffn is a SwiGLU or a sparse MoE block."""

    def __init__(self, cfg, sparse: bool, attention_cls, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.sparse = sparse
        self.input_layernorm = qwen3.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.self_attn = attention_cls(cfg, **kw)
        self.post_attention_layernorm = qwen3.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        if sparse:
            self.mlp = moe.SparseMoe(cfg.moe, **kw)
        else:
            self.mlp = moe.SwiGLU(cfg.hidden_size, cfg.intermediate_size, **kw)

    def __call__(self, x, positions, q_slots, kv_valid, cache_layer, routes):
        attn, new_kv = self.self_attn(
            self.input_layernorm(x), positions, q_slots, kv_valid, cache_layer
        )
        x = x + attn
        h = self.post_attention_layernorm(x)
        if not self.sparse:
            return x + self.mlp(h), new_kv, None
        out, own = self.mlp(h, routes)
        return x + out, new_kv, own


def _run_layer(layer, x, positions, q_slots, kv_valid, cache_layer, routes):
    return layer(x, positions, q_slots, kv_valid, cache_layer, routes)


class MoeCausalLM(nnx.Module):
    """Token ids -> float32 next-token logits, with dense-first / sparse layers.

    Args:
      cfg: architecture (see the module docstring).
      dtype: activation dtype; norms' statistics, softmaxes, routers and logits are float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialize each layer in the backward pass.
      rngs: initialization randomness (keyword-only).
    """

    attention_cls: type = None  # set by the architecture's subclass

    def __init__(
        self,
        cfg,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        remat=False,
        remat_offload=False,
        attention_impl="auto",
        attention_block=512,
        logits_tile=1024,
        rngs,
    ):
        # remat_offload / attention_impl / attention_block are the dense model's long-sequence
        # options; the MoE layers attend through models.attention's "auto" (blockwise past one
        # block pair) and keep their inputs on the device.
        del remat_offload, attention_impl, attention_block
        self.cfg = cfg
        self.dtype = dtype
        self.remat = remat
        self.logits_tile = logits_tile
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embed_tokens = qwen3.Embed(cfg.vocab_size, cfg.hidden_size, **kw)
        self.layers = nnx.List(
            [DecoderLayer(cfg, s, self.attention_cls, **kw) for s in cfg.sparse_layers]
        )
        self.norm = qwen3.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = qwen3.Linear(
                "BTD,DV->BTV", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), **kw
            )

    @property
    def num_moe_layers(self) -> int:
        return sum(self.cfg.sparse_layers)

    def _slots(self, b, t, positions, attention_mask, cache):
        """(positions, q_slots, kv_valid, write_index, new_lengths) for a call."""
        if cache is None:
            if positions is None:
                positions = jnp.maximum(jnp.cumsum(attention_mask, axis=1, dtype=jnp.int32) - 1, 0)
            q_slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            return positions, q_slots, attention_mask, None, None
        if cache.lengths.shape[0] != b:
            raise ValueError(f"cache has {cache.lengths.shape[0]} rows, input_ids has {b}")
        if positions is None:
            positions = qwen3.cache_positions(cache.lengths, attention_mask)
        own_slot, write_index, new_lengths = qwen3.write_slots(
            cache.lengths, attention_mask, cache.max_len
        )
        return positions, own_slot, None, write_index, new_lengths

    def hidden_states(
        self,
        input_ids: Int[Array, "B T"],
        *,
        positions: Int[Array, "B T"] | None = None,
        attention_mask: Bool[Array, "B T"] | None = None,
        cache: qwen3.KVCache | None = None,
        routes: Int[Array, "B T M K"] | None = None,
        return_routes: bool = False,
    ):
        """Final-norm hidden states, the updated cache (or None) and, with `return_routes`,
        the router's own top-k per MoE layer [B, T, M, K] (M = MoE layers)."""
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T]; got shape {input_ids.shape}")
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if routes is not None and routes.shape[:3] != (b, t, self.num_moe_layers):
            raise ValueError(
                f"routes {routes.shape} must be [B={b}, T={t}, M={self.num_moe_layers}, K]"
            )
        positions, q_slots, kv_valid, write_index, new_lengths = self._slots(
            b, t, positions, mask, cache
        )
        positions = jnp.asarray(positions, jnp.int32)
        run = nnx.remat(_run_layer) if self.remat else _run_layer
        x = self.embed_tokens(input_ids)
        kv = None if cache is None else (cache.k, cache.v)
        own_routes, m = [], 0
        for i, layer in enumerate(self.layers):
            cache_layer = None if kv is None else (kv[0], kv[1], i, write_index)
            given = None
            if layer.sparse and routes is not None:
                given = routes[:, :, m]
            x, new_kv, own = run(layer, x, positions, q_slots, kv_valid, cache_layer, given)
            kv = new_kv if kv is not None else None
            if own is not None:
                own_routes.append(own)
                m += 1
        x = self.norm(x)
        new_cache = None if cache is None else qwen3.KVCache(kv[0], kv[1], new_lengths)
        if not return_routes:
            return x, new_cache
        return x, new_cache, jnp.stack(own_routes, axis=2)

    # The dense model's LM head and its token-tiled log-softmax (never [T, V]).
    token_terms = qwen3.Qwen3.token_terms

    logits_from_hidden = qwen3.Qwen3.logits_from_hidden  # LM head (tied or untied), float32

    def __call__(
        self,
        input_ids: Int[Array, "B T"],
        *,
        positions: Int[Array, "B T"] | None = None,
        attention_mask: Bool[Array, "B T"] | None = None,
        cache: qwen3.KVCache | None = None,
        routes: Int[Array, "B T M K"] | None = None,
    ):
        """Next-token logits float32 [B, T, V]; with a cache, (logits, updated cache).

        Arguments as `qwen3.Qwen3.__call__`, plus `routes` (replayed experts, see above).
        """
        hidden, new_cache = self.hidden_states(
            input_ids,
            positions=positions,
            attention_mask=attention_mask,
            cache=cache,
            routes=routes,
        )
        logits = self.logits_from_hidden(hidden)
        return logits if cache is None else (logits, new_cache)
