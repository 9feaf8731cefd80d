"""`auto.active_params` (the weights one token's forward multiplies by) of tiny checkpoints
written by transformers, against a count by hand from their config.json (tests/models/
active_counts.py, float64 term by term) and against transformers' own parameter shapes."""

from __future__ import annotations

import json
import os
import sys

import pytest

from thundersync_jax.bench import flops
from thundersync_jax.models import auto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import active_counts  # noqa: E402  (counts by hand)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_COMMON = dict(vocab_size=67, hidden_size=24, intermediate_size=40, max_position_embeddings=64)
CONFIGS = {
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=10), active_counts.qwen3_dense),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_hidden_layers=3, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=10,
                                         moe_intermediate_size=11, num_experts=7,
                                         num_experts_per_tok=3, mlp_only_layers=[1]),
                  active_counts.qwen3_moe),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", dict(num_hidden_layers=4, num_attention_heads=3,
                                                num_key_value_heads=3,
                                                moe_intermediate_size=11, n_routed_experts=6,
                                                num_experts_per_tok=2, n_shared_experts=2,
                                                kv_lora_rank=8, q_lora_rank=5,
                                                qk_rope_head_dim=4, qk_nope_head_dim=6,
                                                v_head_dim=5, n_group=3, topk_group=2,
                                                mlp_layer_types=["dense", "sparse", "dense",
                                                                 "sparse"]),
                      active_counts.glm4_moe_lite),
}  # fmt: skip


def _write(tmp_path, name: str, tie: bool):
    """A tiny random checkpoint written by transformers: (its dir, config.json, torch model)."""
    cls_name, kw, _ = CONFIGS[name]
    config = getattr(transformers, cls_name)(**_COMMON, **kw, tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    with open(tmp_path / "config.json") as f:
        return str(tmp_path), json.load(f), model


def _count_torch(model, hf: dict) -> float:
    """transformers' own matrices a token multiplies by: every >= 2-D weight except the
    embedding lookup (tied: the LM head is that table), routed experts at top-k / E."""
    experts = hf.get("num_local_experts") or hf.get("num_experts") or hf.get("n_routed_experts")
    experts = experts or 1
    top_k = hf.get("num_experts_per_tok", 1)
    total = 0.0
    for name, p in model.named_parameters():
        if p.ndim < 2 or ("embed_tokens" in name and not hf["tie_word_embeddings"]):
            continue
        total += p.numel() * top_k / experts if ".experts." in name else p.numel()
    return total


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_active_params_equal_the_count_by_hand(tmp_path, name, tie):
    path, hf, model = _write(tmp_path, name, tie)
    active = auto.active_params(auto.read_config(path))
    assert active == CONFIGS[name][2](hf)
    assert active == _count_torch(model, hf)
    total = sum(p.numel() for p in model.parameters())
    if name != "qwen3":  # a token skips most routed experts
        assert active < total - hf["vocab_size"] * hf["hidden_size"]


def test_dense_qwen3_equals_the_dense_formula(tmp_path):
    """Dense: the active count is the formula flops.py priced before MoE existed."""
    path, hf, _ = _write(tmp_path, "qwen3", False)
    cfg = auto.read_config(path)
    d, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    attn = hf["num_attention_heads"] * hf["head_dim"]
    kv = hf["num_key_value_heads"] * hf["head_dim"]
    layers, seq = hf["num_hidden_layers"], 10
    dense = layers * (d * (2 * attn + 2 * kv) + 3 * d * f) + v * d
    assert auto.active_params(cfg) == dense
    assert flops.model_flops_per_token(cfg, seq) == 6 * dense + 12 * layers * seq * attn


def test_mla_moe_flops_per_token(tmp_path):
    """6 · active + 6 · L · T · n · (d_qk + d_v): MLA's query/key and value widths differ."""
    path, hf, _ = _write(tmp_path, "glm4_moe_lite", False)
    seq = 10
    qk = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    attention = hf["num_hidden_layers"] * seq * hf["num_attention_heads"] * (qk + hf["v_head_dim"])
    expected = 6 * active_counts.glm4_moe_lite(hf) + 6 * attention
    assert flops.model_flops_per_token(auto.read_config(path), seq) == pytest.approx(expected)
