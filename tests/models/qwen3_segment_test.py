"""The differentiable segment forward equals the one-shot forward, split anywhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3
from thundersync_jax.models.qwen3 import _segment


@pytest.fixture(scope="module")
def model(tiny_qwen3_config):
    cfg = tiny_qwen3_config(qkv_bias=True)  # Qwen2-style biases exercise the bias path too
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    return nnx.merge(graphdef, params)


def _empty(model, slots):
    cfg = model.cfg
    shape = (cfg.num_hidden_layers, 1, slots, cfg.num_key_value_heads, cfg.head_dim)
    return jnp.zeros(shape), jnp.zeros(shape)


def test_two_segments_equal_the_one_shot_hidden_states(model):
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (1, 13)), jnp.int32)
    full, _ = model.hidden_states(ids)
    cut, slots = 5, 11  # 11 slots: 5 used, 6 free (must be ignored)
    k0, v0 = _empty(model, slots)
    k0 = k0 + 1e3  # garbage in every slot: none of it is valid for the first segment
    pos = jnp.arange(13, dtype=jnp.int32)[None]
    first = _segment.segment_hidden_states(
        model,
        ids[:, :cut],
        pos[:, :cut],
        jnp.ones((1, cut), bool),
        k0,
        v0,
        jnp.zeros((1, slots), bool),
    )
    past_k = k0.at[:, :, :cut].set(first.k)
    past_v = v0.at[:, :, :cut].set(first.v)
    valid = (jnp.arange(slots) < cut)[None]
    # The second segment is right-padded by 3 tokens that nobody may attend to.
    tail = jnp.pad(ids[:, cut:], ((0, 0), (0, 3)), constant_values=7)
    tail_pos = jnp.arange(cut, 16, dtype=jnp.int32)[None]
    real = (jnp.arange(11) < 13 - cut)[None]
    second = _segment.segment_hidden_states(model, tail, tail_pos, real, past_k, past_v, valid)
    np.testing.assert_allclose(first.hidden, full[:, :cut], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second.hidden[:, : 13 - cut], full[:, cut:], rtol=1e-5, atol=1e-6)


def test_segment_keys_equal_the_sampling_cache_keys(model):
    """The segment's K/V are those the sampling cache stores (after k_norm and RoPE)."""
    ids = jnp.asarray(np.arange(1, 8)[None] % model.cfg.vocab_size, jnp.int32)
    cache = qwen3.init_cache(model.cfg, 1, 7)
    _, cache = model(ids, cache=cache)
    k0, v0 = _empty(model, 1)
    out = _segment.segment_hidden_states(
        model, ids, jnp.arange(7)[None], jnp.ones((1, 7), bool), k0, v0, jnp.zeros((1, 1), bool)
    )
    np.testing.assert_allclose(out.k, cache.k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.v, cache.v, rtol=1e-5, atol=1e-6)


def test_shape_errors_name_the_shapes(model):
    k0, v0 = _empty(model, 4)
    ids = jnp.ones((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="past_valid"):
        _segment.segment_hidden_states(
            model,
            ids,
            jnp.zeros((1, 3), jnp.int32),
            jnp.ones((1, 3), bool),
            k0,
            v0,
            jnp.zeros((1, 5), bool),
        )
    with pytest.raises(ValueError, match="L="):
        _segment.segment_hidden_states(
            model,
            ids,
            jnp.zeros((1, 3), jnp.int32),
            jnp.ones((1, 3), bool),
            k0[:1],
            v0[:1],
            jnp.zeros((1, 4), bool),
        )
