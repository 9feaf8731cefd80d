"""Dense Qwen3 / Qwen2 decoder in Flax NNX.

Axis letters in einsum strings and shape comments:
  B batch, T query tokens, S key slots, D hidden (embed), N query heads, K key/value heads,
  G query heads per key/value head (N = K*G), H head_dim, F mlp width, V vocab.

Attribute names follow the HF module tree (embed_tokens, layers[i].self_attn.q_proj, ...), so the
HF <-> NNX mapping in `_hf_io.py` is one table. Leaf parameters are named `kernel`, `bias`
(projections), `scale` (RMSNorm) and `embedding`; kernels are stored input-major ([in, ...out]),
and every parameter carries logical axis names (nnx.with_partitioning metadata) from
{"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm"} for a mesh mapping.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from thundersync_jax import losses
from thundersync_jax.models import attention
from thundersync_jax.models.qwen3 import _cache, _depth
from thundersync_jax.models.qwen3._config import Qwen3Config
from thundersync_jax.models.qwen3._layers import Embed, Linear, RMSNorm, apply_rope

__all__ = ["MLP", "Attention", "AttendTo", "DecoderLayer", "Embed", "Linear", "Qwen3"]
__all__ += ["RMSNorm", "apply_rope"]


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["q_slots", "kv_valid"],
    meta_fields=["impl", "block", "q_offset"],
)
@dataclasses.dataclass(frozen=True)
class AttendTo:
    """Which key slots each query sees, and how to attend (`models.attention`).

    Attributes:
      impl: the attention implementation ("auto", "naive", "blockwise", "cudnn").
      block: the blockwise path's query and key block size.
      q_slots: int32 [B, T], key slot s is visible to query t iff s <= q_slots[b, t].
      kv_valid: bool [B, S] or None (all valid); False slots are never attended.
      q_offset: static promise q_slots == q_offset + t (and kv_valid a prefix), or None.
    """

    impl: str
    block: int
    q_slots: Int[Array, "B T"]
    kv_valid: Bool[Array, "B S"] | None = None
    q_offset: int | None = None

    def attend(self, q, k, v):
        return attention.dot_product_attention(
            q,
            k,
            v,
            q_slots=self.q_slots,
            kv_valid=self.kv_valid,
            impl=self.impl,
            block_q=self.block,
            block_k=self.block,
            q_offset=self.q_offset,
        )


class Attention(nnx.Module):
    """Grouped-query attention with optional per-head q/k RMSNorm (Qwen3) and q/k/v bias (Qwen2)."""

    def __init__(
        self, cfg: Qwen3Config, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cfg = cfg
        self.dtype = dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        qkv_bias = cfg.qkv_bias
        self.q_proj = Linear(
            "BTD,DNH->BTNH",
            (d, n, h),
            ("embed", "q_heads", "head_dim"),
            ("q_heads", "head_dim") if qkv_bias else None,
            **kw,
        )
        self.k_proj = Linear(
            "BTD,DKH->BTKH",
            (d, k, h),
            ("embed", "kv_heads", "head_dim"),
            ("kv_heads", "head_dim") if qkv_bias else None,
            **kw,
        )
        self.v_proj = Linear(
            "BTD,DKH->BTKH",
            (d, k, h),
            ("embed", "kv_heads", "head_dim"),
            ("kv_heads", "head_dim") if qkv_bias else None,
            **kw,
        )
        self.o_proj = Linear(
            "BTNH,NHD->BTD",
            (n, h, d),
            ("q_heads", "head_dim", "embed"),
            ("embed",) if cfg.o_bias else None,
            **kw,
        )
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, cfg.rms_norm_eps, **kw)
            self.k_norm = RMSNorm(h, cfg.rms_norm_eps, **kw)
        else:
            self.q_norm = self.k_norm = None

    def project_qkv(
        self, x: Float[Array, "B T D"], positions: Int[Array, "B T"]
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B T K H"], Float[Array, "B T K H"]]:
        """Queries, keys and values of `x`, normed (Qwen3) and rotated at `positions`."""
        q = self.q_proj(x)  # [B, T, N, H]
        k = self.k_proj(x)  # [B, T, K, H]
        v = self.v_proj(x)  # [B, T, K, H]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions, self.cfg.rope_theta)
        k = apply_rope(k, positions, self.cfg.rope_theta)
        return q, k, v

    def __call__(
        self,
        x: Float[Array, "B T D"],
        positions: Int[Array, "B T"],
        visible: AttendTo,
        cache_layer: tuple[Array, Array, int, Array] | None = None,
    ) -> tuple[Float[Array, "B T D"], tuple[Array, Array] | None]:
        """Attention output and, with a cache, the updated full (k, v) cache arrays.

        visible: which key slots each query sees (`AttendTo`).
        cache_layer: (k [L,B,S,K,H], v [L,B,S,K,H], this layer's index, write_index [B,T]).
        """
        q, k, v = self.project_qkv(x, positions)
        new_kv = None
        if cache_layer is not None:
            k_all, v_all, layer, write_index = cache_layer
            k_all = _cache.write_layer(k_all, layer, k, write_index)  # [L, B, S, K, H]
            v_all = _cache.write_layer(v_all, layer, v, write_index)  # [L, B, S, K, H]
            new_kv = (k_all, v_all)
            k, v = k_all[layer].astype(self.dtype), v_all[layer].astype(self.dtype)  # [B, S, K, H]
        out = visible.attend(q, k, v)  # [B, T, N, H]
        return self.o_proj(out), new_kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(
        self, cfg: Qwen3Config, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        d, f = cfg.hidden_size, cfg.intermediate_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
        self.up_proj = Linear("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
        self.down_proj = Linear("BTF,FD->BTD", (f, d), ("mlp", "embed"), **kw)

    def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self, cfg: Qwen3Config, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.self_attn = Attention(cfg, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.mlp = MLP(cfg, **kw)

    def __call__(
        self,
        x: Float[Array, "B T D"],
        positions: Int[Array, "B T"],
        visible: AttendTo,
        cache_layer: tuple[Array, Array, int, Array] | None = None,
    ) -> tuple[Float[Array, "B T D"], tuple[Array, Array] | None]:
        attn, new_kv = self.self_attn(self.input_layernorm(x), positions, visible, cache_layer)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_kv


class Qwen3(nnx.Module):
    """Qwen3 (or Qwen2/Qwen2.5) causal LM: token ids -> float32 next-token logits.

    Args:
      cfg: architecture.
      dtype: activation / matmul dtype (e.g. bfloat16); RMSNorm statistics, softmax and the
        logits are always float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialize each decoder layer in the backward pass (saves activation memory).
      remat_offload: with remat (and no cache), keep the layers' inputs in pinned host memory
        between the forward and the backward instead of on the device.
      scan_layers: without a cache, run the decoder layers as one `lax.scan` (one compiled
        layer body for any depth; `_depth.py` says what it costs); a plain attribute. The
        sampling path (with a cache) stays a loop.
      attention_impl: `models.attention.dot_product_attention`'s impl ("auto", "naive",
        "blockwise", "cudnn"); a plain attribute, so callers may switch it after building.
      attention_block: the blockwise path's query/key block size (also a plain attribute).
      logits_tile: tokens per LM-head tile in `token_terms` (0 = whole [B, T, V] logits).
      rngs: parameter initialization randomness (keyword-only).
    """

    def __init__(
        self,
        cfg: Qwen3Config,
        *,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        remat: bool = False,
        remat_offload: bool = False,
        scan_layers: bool = False,
        attention_impl: str = "auto",
        attention_block: int = 512,
        logits_tile: int = 1024,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        self.dtype = dtype
        self.remat = remat
        self.remat_offload = remat_offload
        self.scan_layers = scan_layers
        self.attention_impl = attention_impl
        self.attention_block = attention_block
        self.logits_tile = logits_tile
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, **kw)
        self.layers = nnx.List([DecoderLayer(cfg, **kw) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(
                "BTD,DV->BTV", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), **kw
            )

    def hidden_states(
        self,
        input_ids: Int[Array, "B T"],
        *,
        positions: Int[Array, "B T"] | None = None,
        attention_mask: Bool[Array, "B T"] | None = None,
        cache: _cache.KVCache | None = None,
    ) -> tuple[Float[Array, "B T D"], _cache.KVCache | None]:
        """Final-norm hidden states (before the LM head), and the updated cache if one was given.

        See `__call__` for the arguments; split out so callers that need the logits of a few
        positions only (sampling, chunked log-softmax) can skip the [B, T, V] product.
        """
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T]; got shape {input_ids.shape}")
        b, t = input_ids.shape
        all_real = attention_mask is None
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = jnp.asarray(attention_mask).astype(bool)
        if attention_mask.shape != (b, t):
            raise ValueError(f"attention_mask shape {attention_mask.shape} != input_ids {(b, t)}")

        if cache is None:
            if positions is None:
                positions = jnp.maximum(jnp.cumsum(attention_mask, axis=1, dtype=jnp.int32) - 1, 0)
            # Causal over the row's own tokens; padding is never a key. With no mask given the
            # layout is plain causal (q_offset=0), which lets "auto" pick cuDNN on a GPU.
            visible = AttendTo(
                self.attention_impl,
                self.attention_block,
                jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
                attention_mask,
                q_offset=0 if all_real else None,
            )
            write_index = None
        else:
            if cache.lengths.shape[0] != b:
                raise ValueError(f"cache has {cache.lengths.shape[0]} rows, input_ids has {b}")
            if positions is None:
                positions = _cache.cache_positions(cache.lengths, attention_mask)
            own_slot, write_index, new_lengths = _cache.write_slots(
                cache.lengths, attention_mask, cache.max_len
            )
            # Query t sees the slots up to its own (older cached tokens and itself).
            visible = AttendTo(self.attention_impl, self.attention_block, own_slot)
        positions = jnp.asarray(positions, jnp.int32)
        if positions.shape != (b, t):
            raise ValueError(f"positions shape {positions.shape} != input_ids {(b, t)}")

        x = self.embed_tokens(input_ids)  # [B, T, D]
        if cache is None and self.scan_layers:
            x, _ = _depth.scan_layers(
                self.layers,
                x,
                lambda layer, x: (layer(x, positions, visible)[0], None),
                remat=self.remat,
                offload=self.remat_offload,
            )
            return self.norm(x), None
        if cache is None and self.remat and self.remat_offload:
            x = nnx.remat(_depth.offloaded_layers, policy=_depth.OFFLOAD_LAYER_INPUTS)(
                self.layers, x, positions, visible
            )
            return self.norm(x), None
        run = nnx.remat(_depth.run_layer) if self.remat else _depth.run_layer
        kv = None if cache is None else (cache.k, cache.v)
        for i, layer in enumerate(self.layers):
            cache_layer = None if kv is None else (kv[0], kv[1], i, write_index)
            x, kv = run(layer, x, positions, visible, cache_layer)
        x = self.norm(x)
        if cache is None:
            return x, None
        return x, _cache.KVCache(k=kv[0], v=kv[1], lengths=new_lengths)

    def logits_from_hidden(self, hidden: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        """LM head (tied or untied) in float32."""
        if self.lm_head is None:
            return self.embed_tokens.attend(hidden)
        kernel = self.lm_head.kernel[...].astype(self.dtype)
        return jnp.einsum(
            "BTD,DV->BTV", hidden.astype(self.dtype), kernel, preferred_element_type=jnp.float32
        )

    def token_terms(
        self,
        hidden: Float[Array, "B T D"],
        targets: Int[Array, "B T"],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[Float[Array, "B T"], Float[Array, "B T"] | None]:
        """(log π(targets), entropy or None) under softmax(LM head(hidden) / temperature).

        In tiles of `logits_tile` tokens (`losses.tiled_token_terms`: never [T, V]); with
        `logits_tile` = 0 the whole [B, T, V] logits at once (the reference path).
        """
        if self.logits_tile:
            return losses.tiled_token_terms(
                hidden,
                self.logits_from_hidden,
                targets,
                temperature=temperature,
                tile=self.logits_tile,
                with_entropy=with_entropy,
            )
        logits = self.logits_from_hidden(hidden)
        if temperature != 1.0:
            logits = logits / jnp.float32(temperature)
        ent = losses.entropy(logits) if with_entropy else None
        return losses.token_logprobs(logits, targets), ent

    def __call__(
        self,
        input_ids: Int[Array, "B T"],
        *,
        positions: Int[Array, "B T"] | None = None,
        attention_mask: Bool[Array, "B T"] | None = None,
        cache: _cache.KVCache | None = None,
    ) -> Float[Array, "B T V"] | tuple[Float[Array, "B T V"], _cache.KVCache]:
        """Next-token logits (float32).

        Args:
          input_ids: int32 [B, T].
          positions: int32 [B, T] RoPE positions. Default without a cache: the index among the
            row's real tokens (cumsum(attention_mask) - 1), so left padding gets positions 0..;
            with a cache: continuing from the row's cached length.
          attention_mask: bool [B, T], True = real token; padding is never attended to.
            Combined with the causal mask. Default: all True.
          cache: a KVCache (see `init_cache`); the real tokens are appended to their rows.

        Returns:
          logits [B, T, V] float32; with a cache, (logits, updated cache).
        """
        hidden, new_cache = self.hidden_states(
            input_ids, positions=positions, attention_mask=attention_mask, cache=cache
        )
        logits = self.logits_from_hidden(hidden)
        return logits if cache is None else (logits, new_cache)
