"""The MoE block against a float64 numpy reference, and routing replay.

Replay (`routes=`) must: reproduce the model exactly when handed its own routes; use the
given experts otherwise, with gate weights recomputed from the learner's router (so the
router still gets a gradient); leave the correction bias without a gradient.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import lora, moe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_models import GLM_SLOW, QWEN, random_model  # noqa: E402  (tiny random MoE models)


def _reference_moe(block, x, experts):
    """float64 numpy: per token, sum over its experts of weight * SwiGLU_e(x)."""
    x = np.asarray(x, np.float64)
    kern = np.asarray(block.gate.kernel[...], np.float64)
    logits = x @ kern
    spec = block.spec
    if spec.scoring == "softmax":
        s = np.exp(logits - logits.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-logits))
    w = np.take_along_axis(s, experts, -1)
    if spec.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    if spec.scoring == "sigmoid":
        w = w * spec.routed_scaling_factor
    g, u, d = (
        np.asarray(p[...], np.float64)
        for p in (block.experts.gate_proj, block.experts.up_proj, block.experts.down_proj)
    )
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        for j, e in enumerate(experts[n]):
            a = x[n] @ g[e]
            out[n] += w[n, j] * ((a / (1 + np.exp(-a)) * (x[n] @ u[e])) @ d[e])
    return out


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_grouped_matmul_block_matches_float64_reference(cfg):
    model = random_model(cfg)
    block = model.layers[1].mlp
    x = jax.random.normal(jax.random.key(1), (2, 11, cfg.hidden_size))
    routes = jnp.argsort(jax.random.uniform(jax.random.key(2), (2, 11, cfg.moe.num_experts)))
    routes = routes[..., : cfg.moe.top_k]  # distinct experts per token, in random order
    out, own = block(x, routes)
    want = _reference_moe(block, np.asarray(x).reshape(22, -1), np.asarray(routes).reshape(22, -1))
    if block.shared_experts is not None:
        want = want + np.asarray(block.shared_experts(x)).reshape(22, -1)
    np.testing.assert_allclose(np.asarray(out).reshape(22, -1), want, rtol=2e-5, atol=2e-5)
    assert own.shape == routes.shape


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_replaying_own_routes_is_the_same_forward(cfg):
    model = random_model(cfg)
    ids = jax.random.randint(jax.random.key(3), (2, 10), 0, cfg.vocab_size)
    hidden, _, own = model.hidden_states(ids, return_routes=True)
    assert own.shape == (2, 10, sum(cfg.sparse_layers), cfg.moe.top_k)
    replayed, _, own_again = model.hidden_states(ids, routes=own, return_routes=True)
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(hidden))
    np.testing.assert_array_equal(np.asarray(own_again), np.asarray(own))


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_replay_uses_given_experts_and_trains_the_router(cfg):
    model = random_model(cfg)
    ids = jax.random.randint(jax.random.key(4), (1, 8), 0, cfg.vocab_size)
    own = model.hidden_states(ids, return_routes=True)[2]
    other = (own + 1) % cfg.moe.num_experts  # a different, still distinct, set per token
    graphdef, params = nnx.split(model, nnx.Param)

    @jax.jit  # one program instead of hundreds of op-by-op compiles (suite time)
    def loss(p, routes):
        logits = nnx.merge(graphdef, p)(ids, routes=routes)
        return jax.nn.logsumexp(logits, -1).mean()

    assert not np.allclose(loss(params, other), loss(params, own))
    grads = nnx.to_pure_dict(jax.jit(jax.grad(loss))(params, other))
    router = grads["layers"][1]["mlp"]["gate"]
    assert np.abs(np.asarray(router["kernel"])).max() > 0
    if cfg.moe.correction_bias:
        # The bias only shifts the (discrete) choice: no gradient can reach it.
        assert np.abs(np.asarray(router["e_score_correction_bias"])).max() == 0


def test_sigmoid_group_limited_choice_matches_hand_example():
    spec = moe.MoeSpec(
        hidden_size=2,
        num_experts=6,
        top_k=2,
        expert_size=1,
        scoring="sigmoid",
        n_group=3,
        topk_group=1,
        correction_bias=True,
    )
    router = moe.Router(spec, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    router.e_score_correction_bias.set_value(jnp.array([0.0, 0, 0, 0, 0.5, 0.5]))
    scores = jnp.array([[0.9, 0.1, 0.6, 0.55, 0.3, 0.3]])
    # Groups (sum of best 2, bias included): {0,1} 1.0, {2,3} 1.15, {4,5} 1.6 -> group {4,5}.
    assert sorted(np.asarray(router.select(scores))[0].tolist()) == [4, 5]
    w = router.weights(scores, jnp.array([[4, 5]]))
    np.testing.assert_allclose(np.asarray(w), [[0.5, 0.5]], rtol=1e-6)  # bias not in weights


def test_routing_disagreement_counts_sets():
    own = jnp.array([[[1, 2], [0, 3]], [[4, 5], [2, 1]]])
    given = jnp.array([[[2, 1], [0, 4]], [[4, 5], [1, 2]]])
    differ, total = moe.routing_disagreement(own, given)
    assert (float(differ), float(total)) == (1.0, 4.0)
    valid = jnp.array([[True, False], [True, True]])
    differ, total = moe.routing_disagreement(own, given, valid)
    assert (float(differ), float(total)) == (0.0, 3.0)


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_lora_adapts_each_routed_expert_separately(cfg):
    model = random_model(cfg)
    _, params = nnx.split(model, nnx.Param)
    adapters = lora.init(params, rank=2, alpha=4.0, key=jax.random.key(1))
    lay = dict(adapters.layouts)
    e, d, f = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.expert_size
    assert adapters.weights["layers/1/mlp/experts/gate_proj"]["a"].shape == (e, d, 2)
    assert adapters.weights["layers/1/mlp/experts/down_proj"]["b"].shape == (e, 2, d)
    assert lay["layers/1/mlp/experts/up_proj"].in_axes == (1,)
    assert "layers/1/mlp/gate/kernel" not in lay  # the router is not a LoRA target
    # Expert 3's delta is its own A_3 @ B_3 (float64 reference), no other expert's.
    w = adapters.weights["layers/1/mlp/experts/up_proj"]
    rng = np.random.default_rng(0)
    w["b"] = jnp.asarray(rng.standard_normal(w["b"].shape), jnp.float32)
    got = np.asarray(lora.delta(adapters, "layers/1/mlp/experts/up_proj"))
    a, b = np.asarray(w["a"], np.float64), np.asarray(w["b"], np.float64)
    assert got.shape == (e, d, f)
    np.testing.assert_allclose(got[3], adapters.scale * a[3] @ b[3], rtol=1e-5, atol=1e-6)
