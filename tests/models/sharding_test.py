"""Logical-axis sharding of the real Qwen3 on 8 fake CPU devices (tests/conftest.py)."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from thundersync_jax.learner import chunks
from thundersync_jax.models import qwen3, sharding

# Divisible by 2 and 4 where the default rules shard (embed->fsdp; heads, mlp, vocab->tp), and
# otherwise all different so a swapped dim would fail the shape checks.
CFG = qwen3.Qwen3Config(
    vocab_size=52,
    hidden_size=20,
    intermediate_size=44,
    num_hidden_layers=1,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=6,
)
BUCKETS = (16,)


def _abstract(cfg):
    return nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param)


@pytest.fixture(scope="module")
def single_device():
    graphdef, abstract = _abstract(CFG)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    tokens = rng.integers(0, CFG.vocab_size, (2, 11))
    mask = np.ones((2, 11), np.float32)
    mask[:, :3] = 0
    logits = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens)
    h, _ = chunks.make_score_grad_fn(graphdef, BUCKETS)(params, tokens, mask)
    return graphdef, params, tokens, mask, logits, h


def test_default_rules_give_expected_specs():
    graphdef, abstract = _abstract(CFG)
    specs = sharding.param_specs(abstract, sharding.DEFAULT_RULES, sharding.make_mesh(2, 4))
    attn = specs["layers"][0]["self_attn"]
    assert attn["q_proj"]["kernel"].get_value() == P("fsdp", "tp", None)
    assert attn["o_proj"]["kernel"].get_value() == P("tp", None, "fsdp")
    assert specs["layers"][0]["mlp"]["down_proj"]["kernel"].get_value() == P("tp", "fsdp")
    assert specs["embed_tokens"]["embedding"].get_value() == P("tp", "fsdp")
    assert specs["norm"]["scale"].get_value() == P(None)


@pytest.mark.parametrize("fsdp, tp", [(2, 4), (4, 2)])
def test_sharded_forward_and_gradients_match_single_device(single_device, fsdp, tp):
    graphdef, params, tokens, mask, logits_ref, h_ref = single_device
    mesh = sharding.make_mesh(fsdp, tp)
    shardings = sharding.param_shardings(params, sharding.DEFAULT_RULES, mesh)
    sharded = sharding.shard_params(params, sharding.DEFAULT_RULES, mesh)
    q = sharded["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    assert q.sharding.spec == P("fsdp", "tp", None)
    assert q.addressable_shards[0].data.shape == (20 // fsdp, 8 // tp, 6)

    logits = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(sharded, tokens)
    np.testing.assert_allclose(logits, logits_ref, rtol=1e-5, atol=1e-5)

    fn = chunks.make_score_grad_fn(graphdef, BUCKETS, out_shardings=shardings)
    h, _ = fn(sharded, tokens, mask)
    for got, want, s in zip(*map(jax.tree.leaves, (h, h_ref, shardings)), strict=True):
        assert got.sharding.is_equivalent_to(s, got.ndim), (got.sharding, s)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_indivisible_dim_error_names_param_dim_and_axis():
    bad = qwen3.Qwen3Config(
        vocab_size=52,
        hidden_size=18,  # not divisible by fsdp=4
        intermediate_size=44,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=6,
    )
    _, abstract = _abstract(bad)
    with pytest.raises(
        ValueError, match=r"embed_tokens/embedding: dim 1 \('embed', size 18\).*fsdp"
    ):
        sharding.param_shardings(abstract, sharding.DEFAULT_RULES, sharding.make_mesh(4, 2))
    # Replicating the offending logical axis is the documented way out.
    rules = {**sharding.DEFAULT_RULES, "embed": None}
    sharding.param_shardings(abstract, rules, sharding.make_mesh(4, 2))


def test_rules_from_config_and_validation():
    mesh_cfg = ml_collections.ConfigDict(dict(fsdp=2, tp=4, rules=(("vocab", None),)))
    rules = sharding.rules_from_config(mesh_cfg)
    assert rules["vocab"] is None and rules["embed"] == "fsdp"
    with pytest.raises(ValueError, match="unknown logical axis 'hidden'"):
        sharding.validate_rules({"hidden": "fsdp"})
    with pytest.raises(ValueError, match="mesh axis 'data'"):
        sharding.validate_rules({"embed": "data"})
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh(4, 4)
