"""Tiny Qwen3-MoE and GLM-4.7-Flash configs and random models for tests (not a test module)."""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from thundersync_jax.models import auto, glm4_moe_lite, qwen3_moe

QWEN = qwen3_moe.Qwen3MoeConfig(
    vocab_size=53,
    hidden_size=20,
    intermediate_size=28,
    moe_intermediate_size=9,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=6,
    num_experts=7,
    num_experts_per_tok=3,
    norm_topk_prob=True,
    mlp_only_layers=(0,),
)
GLM = glm4_moe_lite.Glm4MoeLiteConfig(
    vocab_size=53,
    hidden_size=20,
    intermediate_size=28,
    moe_intermediate_size=9,
    num_hidden_layers=3,
    num_attention_heads=3,
    n_routed_experts=6,
    num_experts_per_tok=2,
    kv_lora_rank=8,
    q_lora_rank=5,
    qk_rope_head_dim=4,
    qk_nope_head_dim=6,
    v_head_dim=5,
    n_group=3,
    topk_group=2,
    routed_scaling_factor=1.5,
)
# GLM's variant of a test parametrized over both families: in `make test`, not in
# `make test-quick` (the Qwen3-MoE variant keeps the edit loop's MoE coverage; GLM's MLA
# programs are the slowest to compile of the unit tier).
GLM_SLOW = pytest.param(GLM, marks=pytest.mark.slow)


def random_model(cfg, seed=0):
    """`cfg`'s model with every param random (norm scales near 1, correction bias nonzero)."""
    model = auto.build(cfg)
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(nnx.to_pure_dict(state))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [
        0.3 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    values = jax.tree.unflatten(tree, leaves)
    nnx.replace_by_pure_dict(state, values)
    for path, var in nnx.to_flat_state(state):
        if path[-1] == "scale":
            var.set_value(1.0 + var.get_value())
    return nnx.merge(graphdef, state)
