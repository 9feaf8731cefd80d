"""LoRA on the real Qwen3 param tree: layouts, merge/unmerge, adapter-only gradients and optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from thundersync_jax.models import lora, qwen3

# Prime-sized dims so a transposed axis cannot go unnoticed.
CFG = qwen3.Qwen3Config(
    vocab_size=37,
    hidden_size=22,
    intermediate_size=26,
    num_hidden_layers=1,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
)


@pytest.fixture(scope="module")
def model_parts():
    # Random values on the abstract tree: eager init would compile one program per op.
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(x.dtype), abstract)
    return graphdef, params


def _random_b(adapters, seed=1):
    """Adapters with nonzero B (a fresh adapter has B = 0 and changes nothing)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(x.dtype), adapters)


def test_init_finds_every_projection_with_zero_b(model_parts):
    _, params = model_parts
    adapters = lora.init(params, rank=3, alpha=6.0, key=jax.random.key(0))
    assert len(adapters.weights) == 7 * CFG.num_hidden_layers
    q = adapters.weights["layers/0/self_attn/q_proj/kernel"]
    assert q["a"].shape == (22, 3) and q["b"].shape == (3, 6 * 10)
    o = adapters.weights["layers/0/self_attn/o_proj/kernel"]
    assert o["a"].shape == (6 * 10, 3) and o["b"].shape == (3, 22)
    down = adapters.weights["layers/0/mlp/down_proj/kernel"]
    assert down["a"].shape == (26, 3) and down["b"].shape == (3, 22)
    assert all(float(jnp.abs(p["b"]).max()) == 0.0 for p in adapters.weights.values())
    assert all(float(jnp.abs(p["a"]).max()) > 0.0 for p in adapters.weights.values())
    merged = jax.jit(lora.merge)(params, adapters)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(merged), strict=True):
        np.testing.assert_array_equal(x, y)


def test_targets_subset_and_errors(model_parts):
    _, params = model_parts
    adapters = lora.init(params, rank=2, alpha=2.0, targets=("q_proj", "v_proj"))
    assert sorted({p.split("/")[-2] for p in adapters.weights}) == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        lora.init(params, rank=2, alpha=2.0, targets=("qkv",))
    with pytest.raises(ValueError, match="rank"):
        lora.init(params, rank=0, alpha=2.0)


@pytest.mark.parametrize(
    "module_path, x_shape",
    [
        (("layers", 0, "self_attn", "q_proj"), (2, 3, 22)),
        (("layers", 0, "self_attn", "o_proj"), (2, 3, 6, 10)),
        (("layers", 0, "mlp", "down_proj"), (2, 3, 26)),
    ],
)
def test_merged_projection_equals_x_w_plus_scaled_low_rank(model_parts, module_path, x_shape):
    """The merged layer computes x·W + (alpha/r)·(x·A)·B: A is on the input side."""
    graphdef, params = model_parts
    adapters = _random_b(lora.init(params, rank=3, alpha=7.5, key=jax.random.key(2)))
    base = nnx.merge(graphdef, params)
    merged = nnx.merge(graphdef, jax.jit(lora.merge)(params, adapters))

    def module(m):
        for part in module_path:
            m = m[part] if isinstance(part, int) else getattr(m, part)
        return m

    x = np.random.default_rng(0).normal(size=x_shape).astype(np.float32)
    pair = adapters.weights["/".join(map(str, module_path)) + "/kernel"]
    a, b = np.asarray(pair["a"], np.float64), np.asarray(pair["b"], np.float64)
    in_dims = 2 if module_path[-1] == "o_proj" else 1
    x_flat = x.reshape(*x.shape[: x.ndim - in_dims], -1).astype(np.float64)
    low_rank = (x_flat @ a @ b) * (7.5 / 3)
    expected = np.asarray(module(base)(x), np.float64)
    expected = expected + low_rank.reshape(expected.shape)
    np.testing.assert_allclose(module(merged)(x), expected, rtol=1e-5, atol=1e-5)


def test_unmerge_inverts_merge(model_parts):
    _, params = model_parts
    adapters = _random_b(lora.init(params, rank=4, alpha=8.0))
    restored = jax.jit(lambda p, a: lora.unmerge(lora.merge(p, a), a))(params, adapters)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.fixture(scope="module")
def adapter_grads(model_parts):
    """Adapters with nonzero B and the jitted gradient of a loss of the adapted model."""
    graphdef, params = model_parts
    adapters = _random_b(lora.init(params, rank=3, alpha=6.0, key=jax.random.key(3)))

    def loss(adapters, base, tokens):
        return jnp.sum(jnp.sin(lora.apply(graphdef, base, adapters, tokens)))

    grads = jax.jit(jax.grad(loss))(adapters, params, _TOKENS)
    return adapters, grads


_TOKENS = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 7)).astype(np.int32)


def test_gradients_cover_only_adapters_and_match_chain_rule(model_parts, adapter_grads):
    graphdef, params = model_parts
    adapters, grads = adapter_grads
    assert jax.tree.structure(grads) == jax.tree.structure(adapters)

    # Independent reference: the full-weight gradient G at the merged point, then the chain
    # rule of W' = W + s·A@B: dA = s·G_flat·Bᵀ, dB = s·Aᵀ·G_flat.
    merged = jax.jit(lora.merge)(params, adapters)
    loss = lambda p: jnp.sum(jnp.sin(nnx.merge(graphdef, p)(_TOKENS)))
    full = jax.jit(jax.grad(loss))(merged)
    g_o = np.asarray(full["layers"][0]["self_attn"]["o_proj"]["kernel"][...], np.float64)
    pair = adapters.weights["layers/0/self_attn/o_proj/kernel"]
    a, b = np.asarray(pair["a"], np.float64), np.asarray(pair["b"], np.float64)
    g_flat = g_o.reshape(6 * 10, 22)
    got = grads.weights["layers/0/self_attn/o_proj/kernel"]
    np.testing.assert_allclose(got["a"], 2.0 * g_flat @ b.T, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(got["b"], 2.0 * a.T @ g_flat, rtol=2e-4, atol=1e-6)


def test_optax_state_and_update_are_adapter_sized(adapter_grads):
    adapters, grads = adapter_grads
    opt = optax.adamw(1e-2)
    opt_state = opt.init(adapters)
    n_adapter = lora.num_params(adapters)
    n_state = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim > 0)
    assert n_state == 2 * n_adapter  # two moments, nothing param-sized

    @jax.jit
    def step(adapters, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state

    new_adapters, new_state = step(adapters, opt_state, grads)
    assert jax.tree.structure(new_adapters) == jax.tree.structure(adapters)
    assert jax.tree.structure(new_state) == jax.tree.structure(opt_state)
    moved = [
        float(np.abs(np.asarray(x) - np.asarray(y)).max())
        for x, y in zip(*map(jax.tree.leaves, (new_adapters, adapters)), strict=True)
    ]
    assert min(moved) > 0  # every factor trains (B too, though A's gradient is what moves B)
