"""The step-time predictor prices a chunk's compute by the weights a token runs through
(MoE: top-k experts), by hand from the recipe's config (tests/models/active_counts.py), and
keeps the total for what touches every expert (publication)."""

from __future__ import annotations

import os
import sys

import pytest

from configs import b200, h200
from thundersync_jax.bench import scale_model
from thundersync_jax.learner import memory

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
)
import active_counts  # noqa: E402  (counts by hand)

SEQ = 4096


def test_glm_flash_chunk_is_priced_by_active_parameters():
    cfg = h200.get_config("glm_flash")
    hf = cfg.model.to_dict()
    qk = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    width = hf["num_attention_heads"] * (qk + hf["v_head_dim"])
    # LoRA: forward twice (remat) + the backward's input gradients, 2 + 2 + 2 per weight;
    # causal QK^T and AV over SEQ / 2 keys, 2 FLOPs each, in each of 4 passes.
    attention = 4 * 2 * hf["num_hidden_layers"] * width * SEQ / 2
    expected = 6 * active_counts.glm4_moe_lite(hf) + attention
    assert scale_model.chunk_flops(cfg, SEQ) == pytest.approx(expected, rel=1e-12)

    a = scale_model.ASSUMED
    plan = memory.plan(cfg)
    # GLM-4.7-Flash: ~3.6B of 29.9B parameters per token; pricing by the total would be ~6x.
    assert 6 * plan.num_params > 5 * expected
    cost = scale_model.cost_model(cfg, a)
    shapes = {(r, n): s for r, n, s in cost.shape_s}
    gpus = int(cfg.node.learner_gpus)
    assert shapes[(2, SEQ)] == pytest.approx(
        2 * SEQ * expected / (gpus * a["bf16_flops"] * a["mfu"]), rel=1e-12
    )
    # Publication moves every expert's bf16 weights.
    snapshot = 2 * plan.num_params
    expected_pub = (
        snapshot / (gpus * a["d2h_bytes_s"])
        + snapshot / int(cfg.node.rollout_gpus) / a["publish_h2d_bytes_s"]
    )
    assert cost.pub_s == pytest.approx(expected_pub, rel=1e-12)


@pytest.mark.parametrize("variant", ["lora", "full"])
def test_dense_recipe_chunk_flops(variant):
    """Dense Qwen3: every matmul weight is active (the LM head, not the embedding lookup)."""
    cfg = b200.get_config(variant)
    hf = cfg.model.to_dict()
    per_weight = 6 if cfg.lora.enabled else 8
    width = 2 * hf["num_attention_heads"] * hf["head_dim"]
    attention = 4 * 2 * hf["num_hidden_layers"] * width * SEQ / 2
    expected = per_weight * active_counts.qwen3_dense(hf) + attention
    assert scale_model.chunk_flops(cfg, SEQ) == pytest.approx(expected, rel=1e-12)
