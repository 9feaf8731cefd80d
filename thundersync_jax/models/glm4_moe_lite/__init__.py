"""GLM-4.7-Flash (`glm4_moe_lite`) in Flax NNX: MLA with a compressed cache, sigmoid-routed
experts with a correction bias and shared experts; load and save through `models.auto`."""

from thundersync_jax.models import hf_table, moe_decoder, qwen3_moe
from thundersync_jax.models.glm4_moe_lite._config import Glm4MoeLiteConfig
from thundersync_jax.models.glm4_moe_lite._mla import MLAttention, init_cache, rope


class Glm4MoeLite(moe_decoder.MoeCausalLM):
    """GLM-4.7-Flash causal LM (see `moe_decoder.MoeCausalLM` for the interface)."""

    attention_cls = MLAttention


def _attention_entries(cfg, hf: str, attn: tuple) -> list[hf_table.Entry]:
    Entry = hf_table.Entry
    d, n, h = cfg.hidden_size, cfg.num_attention_heads, cfg.qk_head_dim
    c, p, e = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim
    if cfg.q_lora_rank is None:
        table = [Entry(hf + "q_proj.weight", attn + ("q_proj", "kernel"), (d, n, h), 1)]
    else:
        r = cfg.q_lora_rank
        table = [
            Entry(hf + "q_a_proj.weight", attn + ("q_a_proj", "kernel"), (d, r), 1),
            Entry(hf + "q_a_layernorm.weight", attn + ("q_a_layernorm", "scale"), (r,)),
            Entry(hf + "q_b_proj.weight", attn + ("q_b_proj", "kernel"), (r, n, h), 1),
        ]
    table += [
        Entry(
            hf + "kv_a_proj_with_mqa.weight", attn + ("kv_a_proj_with_mqa", "kernel"), (d, c + p), 1
        ),
        Entry(hf + "kv_a_layernorm.weight", attn + ("kv_a_layernorm", "scale"), (c,)),
        Entry(
            hf + "kv_b_proj.weight",
            attn + ("kv_b_proj", "kernel"),
            (c, n, cfg.qk_nope_head_dim + e),
            1,
        ),
        Entry(hf + "o_proj.weight", attn + ("o_proj", "kernel"), (n, e, d), 2),
    ]
    if cfg.attention_bias:
        if cfg.q_lora_rank is not None:
            table.append(
                Entry(hf + "q_a_proj.bias", attn + ("q_a_proj", "bias"), (cfg.q_lora_rank,))
            )
        table += [
            Entry(hf + "kv_a_proj_with_mqa.bias", attn + ("kv_a_proj_with_mqa", "bias"), (c + p,)),
            Entry(hf + "o_proj.bias", attn + ("o_proj", "bias"), (d,)),
        ]
    return table


def tensor_table(cfg: Glm4MoeLiteConfig) -> list[hf_table.Entry]:
    """Every HF tensor of a GLM-4.7-Flash checkpoint (experts stacked per layer)."""
    return qwen3_moe.decoder_table(cfg, _attention_entries)


__all__ = [
    "Glm4MoeLite",
    "Glm4MoeLiteConfig",
    "MLAttention",
    "init_cache",
    "rope",
    "tensor_table",
]
