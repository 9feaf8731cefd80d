"""Expert parallelism: routed experts split over a mesh axis give the one-device results.

8 fake CPU devices (tests/conftest.py); mesh fsdp=4 x tp=2 with the rule expert -> "fsdp"
(each device holds 2 of the 8 experts of a layer) on top of the default rules.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from thundersync_jax.models import auto, glm4_moe_lite, qwen3_moe, sharding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_models import random_model  # noqa: E402  (tiny random MoE models)

QWEN8 = qwen3_moe.Qwen3MoeConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=24,
    moe_intermediate_size=6,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
)
GLM8 = glm4_moe_lite.Glm4MoeLiteConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=24,
    moe_intermediate_size=6,
    num_hidden_layers=2,
    num_attention_heads=2,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    kv_lora_rank=8,
    q_lora_rank=None,
    qk_rope_head_dim=4,
    qk_nope_head_dim=4,
    v_head_dim=4,
)
GLM8_SLOW = pytest.param(GLM8, marks=pytest.mark.slow)  # in make test, not test-quick


@pytest.mark.parametrize("cfg", [QWEN8, GLM8_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_experts_split_over_the_mesh_match_one_device(cfg):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (fake) devices")
    model = random_model(cfg, seed=2)
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 9)), jnp.int32)

    def loss(p, ids):
        logits = nnx.merge(graphdef, p)(ids)
        return jax.nn.logsumexp(logits, -1).mean()

    want_loss, want_grad = jax.jit(jax.value_and_grad(loss))(params, tokens)
    mesh = sharding.make_mesh(4, 2)
    rules = {**sharding.DEFAULT_RULES, "expert": "fsdp"}
    shardings = sharding.param_shardings(params, rules, mesh)
    experts = nnx.to_pure_dict(shardings)["layers"][1]["mlp"]["experts"]["gate_proj"]
    assert experts.spec == PartitionSpec("fsdp", None, "tp")  # 2 experts per fsdp row
    placed = jax.device_put(params, shardings)
    rows = jax.sharding.NamedSharding(mesh, PartitionSpec("fsdp", None))
    fn = jax.jit(jax.value_and_grad(loss), out_shardings=(None, shardings))
    got_loss, got_grad = fn(placed, jax.device_put(tokens, rows))
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cfg", [QWEN8, GLM8_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_checkpoint_loads_block_by_block_onto_expert_shards(cfg, tmp_path):
    """Each device reads only its experts' rows from the per-expert HF tensors."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (fake) devices")
    model = random_model(cfg, seed=3)
    auto.save_pretrained(model, str(tmp_path))
    mesh = sharding.make_mesh(4, 2)
    rules = {**sharding.DEFAULT_RULES, "expert": "fsdp"}
    _, abstract = nnx.split(nnx.eval_shape(lambda: auto.build(cfg)), nnx.Param)
    shardings = sharding.param_shardings(abstract, rules, mesh)
    loaded = auto.load_sharded_params(str(tmp_path), cfg, shardings, jnp.float32)
    want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    got = nnx.to_pure_dict(loaded)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    up = got["layers"][1]["mlp"]["experts"]["up_proj"]
    assert up.sharding.spec == PartitionSpec("fsdp", None, "tp")
    assert up.addressable_shards[0].data.shape == (2, cfg.hidden_size, 3)
