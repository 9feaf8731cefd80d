"""The model's blockwise attention and tiled log-probs equal the naive / whole-[T, V] paths.

Blocks and tiles are tiny (4 keys, 3 tokens) so short sequences cross many block edges.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3
from thundersync_jax.models.qwen3 import _segment


@pytest.fixture(scope="module")
def models(tiny_qwen3_config, random_qwen3):
    cfg = tiny_qwen3_config(num_attention_heads=4, num_key_value_heads=2)
    ref = random_qwen3(cfg, 0)
    ref.attention_impl, ref.logits_tile = "naive", 0
    new = random_qwen3(cfg, 0)
    new.attention_impl, new.attention_block, new.logits_tile = "blockwise", 4, 3
    return ref, new


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def test_full_forward_logprobs_entropy_and_gradient(models):
    ref, new = models
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, ref.cfg.vocab_size, (2, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] < np.array([[11], [7]]))  # row 1 right-padded

    def terms(model, ids):
        hidden, _ = model.hidden_states(ids[:, :-1], attention_mask=mask[:, :-1])
        return model.token_terms(hidden, ids[:, 1:], 0.7, with_entropy=True)

    jitted_terms = jax.jit(terms)  # one program per model instead of op-by-op compiles
    (lp_ref, ent_ref), (lp, ent) = jitted_terms(ref, ids), jitted_terms(new, ids)
    _close(lp, lp_ref)
    _close(ent, ent_ref)

    def grads(model):
        graphdef, params = nnx.split(model)

        def f(params):
            lp, ent = terms(nnx.merge(graphdef, params), ids)
            return jnp.sum(jnp.where(mask[:, 1:], lp + 0.1 * ent, 0.0))

        return _flat(jax.jit(jax.grad(f))(params))

    g_ref, g = grads(ref), grads(new)
    assert not np.any(np.isnan(g))
    assert np.linalg.norm(g - g_ref) <= 1e-5 * np.linalg.norm(g_ref)


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def test_prefill_and_decode_with_a_cache(models):
    """Engine-style: left-padded prefill of two rows, then two decode steps."""
    ref, new = models
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, ref.cfg.vocab_size, (2, 9)), jnp.int32)
    mask = jnp.asarray(np.arange(9)[None] >= np.array([[0], [4]]))  # row 1 left-padded
    outs = []
    for model in (ref, new):
        cache = qwen3.init_cache(model.cfg, 2, 16)
        logits, cache = model(ids, attention_mask=mask, cache=cache)
        steps = [logits[:, -1]]
        for tok in (3, 5):
            step, cache = model(jnp.full((2, 1), tok, jnp.int32), cache=cache)
            steps.append(step[:, 0])
        outs.append(jnp.stack(steps))
    assert not np.any(np.isnan(outs[1]))
    _close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_segment_against_a_cache_with_holes(models):
    ref, new = models
    cfg = ref.cfg
    rng = np.random.default_rng(2)
    slots, t = 13, 6
    shape = (cfg.num_hidden_layers, 1, slots, cfg.num_key_value_heads, cfg.head_dim)
    past_k = jnp.asarray(rng.normal(size=shape), jnp.float32)
    past_v = jnp.asarray(rng.normal(size=shape), jnp.float32)
    valid = jnp.asarray((np.arange(slots) < 10) & (np.arange(slots) != 2))[None]
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, t)), jnp.int32)
    pos = jnp.arange(10, 10 + t, dtype=jnp.int32)[None]
    real = jnp.asarray(np.arange(t) < 5)[None]

    def run(model):
        def f(past_k, past_v):
            out = _segment.segment_hidden_states(model, ids, pos, real, past_k, past_v, valid)
            lp, _ = model.token_terms(out.hidden, ids, 1.3)
            return jnp.sum(jnp.where(real, lp, 0.0)) + jnp.sum(out.k * 0.01), lp

        value_and_grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
        (_, lp), grads = value_and_grad(past_k, past_v)
        return lp, grads

    (lp_ref, g_ref), (lp, g) = run(ref), run(new)
    _close(lp * real, lp_ref * real)
    for a, b in zip(g, g_ref, strict=True):
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
