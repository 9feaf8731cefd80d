"""Qwen3-MoE in Flax NNX: Qwen3's attention over `models.attention`, sparse MoE blocks."""

from __future__ import annotations

from thundersync_jax.models import attention, moe_decoder, qwen3


class Attention(qwen3.Attention):
    """Qwen3's grouped-query attention (q/k norm, RoPE) through `dot_product_attention`."""

    def __call__(self, x, positions, q_slots, kv_valid, cache_layer=None):
        """Output [B, T, D] and, with `cache_layer` (k_all, v_all, layer, write_index), the
        updated full cache arrays (keys after k_norm and RoPE, values)."""
        q, k, v = self.project_qkv(x, positions)  # [B,T,N,H], [B,T,K,H], [B,T,K,H]
        new_kv = None
        if cache_layer is not None:
            k_all, v_all, layer, write_index = cache_layer
            k_all = qwen3.write_layer(k_all, layer, k, write_index)
            v_all = qwen3.write_layer(v_all, layer, v, write_index)
            new_kv = (k_all, v_all)
            k, v = k_all[layer].astype(self.dtype), v_all[layer].astype(self.dtype)
        out = attention.dot_product_attention(q, k, v, q_slots=q_slots, kv_valid=kv_valid)
        return self.o_proj(out), new_kv


class Qwen3Moe(moe_decoder.MoeCausalLM):
    """Qwen3-MoE causal LM (see `moe_decoder.MoeCausalLM` for the interface)."""

    attention_cls = Attention


def init_cache(cfg, batch_size: int, max_len: int, dtype=None) -> qwen3.KVCache:
    """An empty per-head key/value cache (as the dense Qwen3's)."""
    return qwen3.init_cache(cfg, batch_size, max_len, dtype)
