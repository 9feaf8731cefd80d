"""KV-cache decoding gives the logits of a full forward pass, row by row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3

ATOL = 2e-5


@pytest.fixture(scope="module")
def cfg(tiny_qwen3_config):
    return tiny_qwen3_config(rope_theta=5000.0)  # not the default, so a dropped theta shows


@pytest.fixture(scope="module")
def model(cfg, random_qwen3):
    # Norm scales away from 1 so a norm applied to the wrong tensor changes the logits.
    return random_qwen3(cfg, seed=7)


@jax.jit
def _jit_forward(graphdef, state, ids, mask, cache):
    return nnx.merge(graphdef, state)(ids, attention_mask=mask, cache=cache)


def _run(model, ids, mask=None, cache=None):
    """Forward under jit (eager dispatch of every op is slower than compiling these tiny shapes)."""
    ids = np.asarray(ids)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask)
    return _jit_forward(*nnx.split(model), ids, mask, cache)


def _alone(model, seq, length=7):
    """Logits of `seq` run by itself (no cache), right-padded to one compiled length."""
    ids = np.zeros((1, length), np.int32)
    ids[0, : len(seq)] = seq
    return np.asarray(_run(model, ids, np.arange(length)[None] < len(seq)))[0]


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 97, size=(3, 11)).astype(np.int32)
    mask = np.ones((3, 11), bool)
    mask[1, :4] = False  # left padding
    mask[2, 7:] = False  # right padding
    return ids, mask


def test_prefill_then_token_by_token_equals_full_forward(cfg, model):
    ids, mask = _batch()
    full = np.asarray(_run(model, ids, mask))
    cache = qwen3.init_cache(cfg, batch_size=3, max_len=16)
    prefill = 5
    logits, cache = _run(model, ids[:, :prefill], mask[:, :prefill], cache)
    steps = [np.asarray(logits)]
    np.testing.assert_array_equal(cache.lengths, mask[:, :prefill].sum(1))

    for t in range(prefill, ids.shape[1]):
        logits, cache = _run(model, ids[:, t : t + 1], mask[:, t : t + 1], cache)
        steps.append(np.asarray(logits))
    cached = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(cached[mask], full[mask], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(cache.lengths, mask.sum(1))


def test_rows_are_prefilled_and_reset_independently(cfg, model):
    """Continuous batching: row 1 is reset and refilled while row 0 decodes in the same call."""
    rng = np.random.default_rng(1)
    seq0 = rng.integers(0, 97, size=9).astype(np.int32)
    old1 = rng.integers(0, 97, size=5).astype(np.int32)
    new1 = rng.integers(0, 97, size=4).astype(np.int32)
    seq2 = rng.integers(0, 97, size=3).astype(np.int32)
    # max_len as in the first test: its one-token decode compilation is reused.
    cache = qwen3.init_cache(cfg, batch_size=3, max_len=16)

    # Prefill rows 0 (6 tokens), 1 (old request, 5 tokens), 2 (3 tokens) in one padded call.
    ids = np.zeros((3, 6), np.int32)
    mask = np.zeros((3, 6), bool)
    ids[0], mask[0] = seq0[:6], True
    ids[1, :5], mask[1, :5] = old1, True
    ids[2, 3:], mask[2, 3:] = seq2, True
    _, cache = _run(model, ids, mask, cache)
    row2_k, row2_v = cache.k[:, 2], cache.v[:, 2]

    # Free row 1; then one call prefills the new request into row 1 while row 0 decodes token 6
    # and row 2 idles (all padding).
    cache = qwen3.reset_rows(cache, np.array([False, True, False]))
    np.testing.assert_array_equal(cache.lengths, [6, 0, 3])
    ids = np.zeros((3, 4), np.int32)
    mask = np.zeros((3, 4), bool)
    ids[0, 0], mask[0, 0] = seq0[6], True
    ids[1], mask[1] = new1, True
    logits, cache = _run(model, ids, mask, cache)
    np.testing.assert_array_equal(cache.lengths, [7, 4, 3])
    np.testing.assert_array_equal(cache.k[:, 2], row2_k)
    np.testing.assert_array_equal(cache.v[:, 2], row2_v)

    alone0 = _alone(model, seq0[:7])
    alone1 = _alone(model, new1)[:4]
    np.testing.assert_allclose(logits[0, 0], alone0[6], atol=ATOL, rtol=0)
    np.testing.assert_allclose(logits[1], alone1, atol=ATOL, rtol=0)

    # Row 2 resumes decoding after idling: same logits as its sequence run alone.
    ids = np.zeros((3, 1), np.int32)
    ids[2, 0] = 5
    logits, cache = _run(model, ids, np.array([[False], [False], [True]]), cache)
    alone2 = _alone(model, np.append(seq2, 5))
    np.testing.assert_allclose(logits[2, 0], alone2[3], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(cache.lengths, [7, 4, 4])


def test_init_cache_and_reset_rows_validate(cfg):
    cache = qwen3.init_cache(cfg, 2, 8, jnp.bfloat16)
    assert cache.k.shape == (2, 2, 8, 1, 8) and cache.k.dtype == jnp.bfloat16
    assert cache.max_len == 8
    with pytest.raises(ValueError, match="batch_size=0"):
        qwen3.init_cache(cfg, 0, 8)
    with pytest.raises(ValueError, match="rows_mask has shape"):
        qwen3.reset_rows(cache, np.array([True, False, True]))
