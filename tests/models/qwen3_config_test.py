"""Qwen3Config: HF config.json spellings, the project config section, and clear rejections."""

from __future__ import annotations

import pytest

from configs import common
from thundersync_jax.models import qwen3

QWEN3_HF = {  # the shape of a real Qwen3 config.json (transformers 4.x spelling)
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_sliding_window": False,
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def test_qwen3_config_json_round_trips():
    cfg = qwen3.Qwen3Config.from_hf(QWEN3_HF)
    assert (cfg.head_dim, cfg.num_query_groups, cfg.rope_theta) == (128, 2, 1e6)
    assert cfg.qk_norm and not cfg.qkv_bias and not cfg.o_bias and cfg.tie_word_embeddings
    assert qwen3.Qwen3Config.from_hf(cfg.to_hf()) == cfg
    hash(cfg)  # usable as a static jit argument


def test_transformers5_rope_parameters_spelling():
    hf = {k: v for k, v in QWEN3_HF.items() if k not in ("rope_theta", "rope_scaling")}
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    assert qwen3.Qwen3Config.from_hf(hf).rope_theta == 5000.0


def test_qwen2_derives_head_dim_and_biases():
    hf = dict(QWEN3_HF, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    del hf["head_dim"], hf["attention_bias"]
    cfg = qwen3.Qwen3Config.from_hf(hf)
    assert cfg.head_dim == 1024 // 16
    assert cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm
    assert cfg.to_hf()["architectures"] == ["Qwen2ForCausalLM"]
    assert qwen3.Qwen3Config.from_hf(cfg.to_hf()) == cfg


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0}), "rope_parameters"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(model_type="llama"), "model_type"),
        (dict(num_key_value_heads=5), "multiple of"),
    ],
)
def test_unsupported_architectures_are_rejected(change, match):
    with pytest.raises(ValueError, match=match):
        qwen3.Qwen3Config.from_hf({**QWEN3_HF, **change})


def test_from_project_config_section():
    section = common.get_base_config().model
    cfg = qwen3.Qwen3Config.from_config_dict(section)
    assert cfg.vocab_size == section.vocab_size and cfg.head_dim == section.head_dim
    assert cfg.tie_word_embeddings is section.tie_word_embeddings
    assert cfg.rope_theta == section.rope_theta
