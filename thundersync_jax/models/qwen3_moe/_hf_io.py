"""Qwen3-MoE HF checkpoints: the tensor table (per-expert tensors stacked into [E, ...])."""

from __future__ import annotations

from thundersync_jax.models import hf_table
from thundersync_jax.models.qwen3_moe._config import Qwen3MoeConfig

Entry = hf_table.Entry


def attention_entries(cfg, hf: str, attn: tuple) -> list[Entry]:
    """Qwen3 attention tensors of one layer (`hf` prefix, `attn` our path)."""
    d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    table = [
        Entry(hf + "q_proj.weight", attn + ("q_proj", "kernel"), (d, n, h), 1),
        Entry(hf + "k_proj.weight", attn + ("k_proj", "kernel"), (d, k, h), 1),
        Entry(hf + "v_proj.weight", attn + ("v_proj", "kernel"), (d, k, h), 1),
        Entry(hf + "o_proj.weight", attn + ("o_proj", "kernel"), (n, h, d), 2),
        Entry(hf + "q_norm.weight", attn + ("q_norm", "scale"), (h,)),
        Entry(hf + "k_norm.weight", attn + ("k_norm", "scale"), (h,)),
    ]
    if cfg.attention_bias:
        table += [
            Entry(hf + "q_proj.bias", attn + ("q_proj", "bias"), (n, h)),
            Entry(hf + "k_proj.bias", attn + ("k_proj", "bias"), (k, h)),
            Entry(hf + "v_proj.bias", attn + ("v_proj", "bias"), (k, h)),
            Entry(hf + "o_proj.bias", attn + ("o_proj", "bias"), (d,)),
        ]
    return table


def swiglu_entries(hf: str, path: tuple, d: int, f: int) -> list[Entry]:
    return [
        Entry(hf + "gate_proj.weight", path + ("gate_proj", "kernel"), (d, f), 1),
        Entry(hf + "up_proj.weight", path + ("up_proj", "kernel"), (d, f), 1),
        Entry(hf + "down_proj.weight", path + ("down_proj", "kernel"), (f, d), 1),
    ]


def moe_entries(spec, hf: str, path: tuple) -> list[Entry]:
    """Router, stacked routed experts, correction bias and shared experts of one MoE block."""
    d, f, e = spec.hidden_size, spec.expert_size, spec.num_experts
    table = [Entry(hf + "gate.weight", path + ("gate", "kernel"), (d, e), 1)]
    if spec.correction_bias:
        table.append(
            Entry(
                hf + "gate.e_score_correction_bias",
                path + ("gate", "e_score_correction_bias"),
                (e,),
            )
        )
    table += hf_table.experts(
        hf + "experts.",
        path + ("experts",),
        e,
        (("gate_proj", (d, f)), ("up_proj", (d, f)), ("down_proj", (f, d))),
    )
    if spec.shared_size:
        table += swiglu_entries(
            hf + "shared_experts.", path + ("shared_experts",), d, spec.shared_size
        )
    return table


def decoder_table(cfg, attention) -> list[Entry]:
    """Every tensor of a dense-or-sparse decoder; `attention(cfg, hf, path)` its attention."""
    d, v = cfg.hidden_size, cfg.vocab_size
    table = [Entry("model.embed_tokens.weight", ("embed_tokens", "embedding"), (v, d))]
    for i, sparse in enumerate(cfg.sparse_layers):
        hf, ours = f"model.layers.{i}.", ("layers", i)
        table += [
            Entry(hf + "input_layernorm.weight", ours + ("input_layernorm", "scale"), (d,)),
            Entry(
                hf + "post_attention_layernorm.weight",
                ours + ("post_attention_layernorm", "scale"),
                (d,),
            ),
        ]
        table += attention(cfg, hf + "self_attn.", ours + ("self_attn",))
        if sparse:
            table += moe_entries(cfg.moe, hf + "mlp.", ours + ("mlp",))
        else:
            table += swiglu_entries(hf + "mlp.", ours + ("mlp",), d, cfg.intermediate_size)
    table.append(Entry("model.norm.weight", ("norm", "scale"), (d,)))
    if not cfg.tie_word_embeddings:
        table.append(Entry("lm_head.weight", ("lm_head", "kernel"), (d, v), 1))
    return table


def tensor_table(cfg: Qwen3MoeConfig) -> list[Entry]:
    return decoder_table(cfg, attention_entries)
