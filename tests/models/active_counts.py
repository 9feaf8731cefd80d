"""Per-token active matmul weights counted by hand from an HF config.json dict (float64),
term by term, for the tests of `auto.active_params` and the FLOP counts built on it (not a
test module). The embedding lookup is not a matmul; the LM head (V·D) always is."""

from __future__ import annotations

import numpy as np


def _f(hf: dict, key: str) -> np.float64:
    return np.float64(hf[key])


def swiglu(d: np.float64, f: np.float64) -> np.float64:
    return d * f + d * f + f * d  # gate, up, down


def qwen3_dense(hf: dict) -> np.float64:
    """Qwen3: L · (q, k, v, o + the SwiGLU MLP) + LM head."""
    d, v, layers = _f(hf, "hidden_size"), _f(hf, "vocab_size"), _f(hf, "num_hidden_layers")
    q = _f(hf, "num_attention_heads") * _f(hf, "head_dim")
    kv = _f(hf, "num_key_value_heads") * _f(hf, "head_dim")
    attention = d * q + d * kv + d * kv + q * d
    return layers * (attention + swiglu(d, _f(hf, "intermediate_size"))) + v * d


def qwen3_moe(hf: dict) -> np.float64:
    """Qwen3-MoE: Qwen3 attention; sparse layers the router (D·E) + K experts; layers in
    mlp_only_layers (or off the decoder_sparse_step) a dense SwiGLU."""
    d, v, layers = _f(hf, "hidden_size"), _f(hf, "vocab_size"), hf["num_hidden_layers"]
    q = _f(hf, "num_attention_heads") * _f(hf, "head_dim")
    kv = _f(hf, "num_key_value_heads") * _f(hf, "head_dim")
    attention = d * q + d * kv + d * kv + q * d
    # transformers 5 writes the expert count as num_local_experts, earlier as num_experts.
    router = d * np.float64(hf.get("num_experts") or hf["num_local_experts"])
    routed = _f(hf, "num_experts_per_tok") * swiglu(d, _f(hf, "moe_intermediate_size"))
    dense = swiglu(d, _f(hf, "intermediate_size"))
    step = hf.get("decoder_sparse_step", 1)
    total = np.float64(0.0)
    for i in range(layers):
        sparse = i not in (hf.get("mlp_only_layers") or []) and (i + 1) % step == 0
        total += attention + (router + routed if sparse else dense)
    return total + v * d


def glm4_moe_lite(hf: dict) -> np.float64:
    """GLM-4.7-Flash: MLA (q_a D·r, q_b r·n·(nope+rope), kv_a D·(c+rope), kv_b c·n·(nope+v),
    o n·v·D); sparse layers the router + K routed + the shared experts; the first dense."""
    d, v, layers = _f(hf, "hidden_size"), _f(hf, "vocab_size"), hf["num_hidden_layers"]
    n, r, c = _f(hf, "num_attention_heads"), _f(hf, "q_lora_rank"), _f(hf, "kv_lora_rank")
    nope, rope, v_head = (
        _f(hf, "qk_nope_head_dim"),
        _f(hf, "qk_rope_head_dim"),
        _f(hf, "v_head_dim"),
    )
    attention = (
        d * r + r * n * (nope + rope) + d * (c + rope) + c * n * (nope + v_head) + n * v_head * d
    )
    f_moe = _f(hf, "moe_intermediate_size")
    router = d * _f(hf, "n_routed_experts")
    routed = _f(hf, "num_experts_per_tok") * swiglu(d, f_moe)
    shared = _f(hf, "n_shared_experts") * swiglu(d, f_moe)
    dense = swiglu(d, _f(hf, "intermediate_size"))
    types = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    total = np.float64(0.0)
    for kind in types:
        total += attention + (router + routed + shared if kind == "sparse" else dense)
    return total + v * d
