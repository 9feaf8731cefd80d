"""`Qwen3.scan_layers`: layers under one lax.scan equal the unrolled loop (values, gradients)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import common
from thundersync_jax.learner import model_state
from thundersync_jax.models import lora, qwen3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_models import GLM  # noqa: E402  (tiny random MoE models)

LAYERS = 3  # more than one scan step, distinct random weights per layer


@pytest.fixture(scope="module")
def parts(tiny_qwen3_config):
    cfg = tiny_qwen3_config(num_hidden_layers=LAYERS)
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] >= np.array([[0], [3]]))  # row 1 left-padded
    return graphdef, params, ids, mask


def _model(graphdef, params, scan, remat=False, offload=False):
    model = nnx.merge(graphdef, params)
    model.scan_layers, model.remat, model.remat_offload = scan, remat, offload
    return model


def _objective(model, ids, mask):
    hidden, _ = model.hidden_states(ids, attention_mask=mask)
    logp, ent = model.token_terms(hidden, jnp.roll(ids, -1, axis=1), with_entropy=True)
    return jnp.sum(jnp.where(mask, logp + 0.1 * ent, 0.0))


def _close(got, want, rtol=1e-6):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = max(float(jnp.max(jnp.abs(w))), 1e-30)
        assert float(jnp.max(jnp.abs(g - w))) / scale <= rtol


def _full_grad(graphdef, ids, mask, scan, remat, offload):
    def loss(params):
        return _objective(_model(graphdef, params, scan, remat, offload), ids, mask)

    return jax.jit(jax.value_and_grad(loss))


@pytest.fixture(scope="module")
def loop_grad(parts):
    """The reference: the unrolled loop's objective and full gradient (compiled once)."""
    graphdef, params, ids, mask = parts
    return _full_grad(graphdef, ids, mask, False, False, False)(params)


@pytest.mark.parametrize("remat, offload", [(False, False), (True, False), (True, True)])
def test_scanned_forward_and_full_gradient_equal_the_loop(parts, loop_grad, remat, offload):
    graphdef, params, ids, mask = parts
    want = loop_grad
    got = _full_grad(graphdef, ids, mask, True, remat, offload)(params)
    assert float(want[0]) != 0.0
    _close(got, want)
    # Every layer's gradient is its own (the scan's stacked gradient split back correctly).
    layers = want[1]["layers"]
    assert float(jnp.max(jnp.abs(layers[0]["mlp"]["up_proj"]["kernel"][...]))) > 0.0
    assert not np.allclose(
        layers[0]["mlp"]["up_proj"]["kernel"][...], layers[1]["mlp"]["up_proj"]["kernel"][...]
    )


def test_scanned_lora_gradient_equals_the_loop(parts):
    graphdef, params, ids, mask = parts
    adapters = lora.init(params, rank=2, alpha=4.0, key=jax.random.key(1))
    rng = np.random.default_rng(2)
    adapters = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(x.dtype), adapters)

    def grad(scan):
        def loss(adapters, base):
            full = lora.merge(jax.lax.stop_gradient(base), adapters)
            return _objective(_model(graphdef, full, scan, remat=True), ids, mask)

        return jax.jit(jax.value_and_grad(loss))(adapters, params)

    _close(grad(True), grad(False))


def test_scanned_segment_equals_the_loop_with_cache_gradients(parts):
    graphdef, params, ids, _ = parts
    cfg = nnx.merge(graphdef, params).cfg
    rng = np.random.default_rng(3)
    shape = (LAYERS, 1, 7, cfg.num_key_value_heads, cfg.head_dim)
    past_k = jnp.asarray(rng.normal(0, 1, shape), jnp.float32)
    past_v = jnp.asarray(rng.normal(0, 1, shape), jnp.float32)
    valid = jnp.asarray(np.arange(7) < 5)[None]
    new, pos = ids[:1, :4], jnp.arange(5, 9, dtype=jnp.int32)[None]

    def grad(scan):
        def loss(params, past_k, past_v):
            model = _model(graphdef, params, scan, remat=True)
            out = qwen3.segment_hidden_states(
                model, new, pos, jnp.ones(new.shape, bool), past_k, past_v, valid
            )
            logp, _ = model.token_terms(out.hidden, new)
            return jnp.sum(logp) + 0.1 * jnp.sum(out.k * out.v)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(params, past_k, past_v)

    want = grad(False)
    assert float(jnp.max(jnp.abs(want[1][1][1]))) > 0.0  # layer 1's past keys get a gradient
    _close(grad(True), want)


def test_the_config_key_reaches_the_learners_graphdef_and_moe_refuses_it():
    config = common.get_base_config()
    config.model.scan_layers = True
    graphdef, abstract = model_state.abstract_model(config, model_state.model_config(config))
    assert nnx.merge(graphdef, abstract).scan_layers  # abstract leaves: nothing allocated
    with pytest.raises(ValueError, match="model.scan_layers=True"):
        model_state.abstract_model(config, GLM)
