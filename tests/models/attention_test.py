"""Blockwise attention equals the naive path (values and gradients), masks as slots/ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.models.attention import balanced_tile, dot_product_attention


def _inputs(seed, b, t, s, n, nkv, hq, hv):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, t, n, hq)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, s, nkv, hq)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, nkv, hv)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(b, t, n, hv)), jnp.float32)  # a cotangent to pull back
    return q, k, v, w


def _value_and_grads(impl, q, k, v, w, block_q=8, block_k=4, **masks):
    def loss(q, k, v, w, masks):
        out = dot_product_attention(q, k, v, impl=impl, block_q=block_q, block_k=block_k, **masks)
        return jnp.sum(out * w), out

    # One jitted program (eagerly, every op of both paths would be its own compile).
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, out), grads = grad(q, k, v, w, masks)
    return out, grads


def _assert_same(masks, *shape, seed=0, blocks=(8, 4)):
    q, k, v, w = _inputs(seed, *shape)
    ref, ref_g = _value_and_grads("naive", q, k, v, w, **masks)
    out, g = _value_and_grads("blockwise", q, k, v, w, *blocks, **masks)
    assert not np.any(np.isnan(out)) and not np.any(np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, ref_g, strict=True):
        assert not np.any(np.isnan(a))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return out


@pytest.mark.parametrize("n,nkv,hq,hv", [(4, 4, 8, 8), (4, 2, 8, 8), (6, 2, 8, 12), (2, 1, 6, 4)])
def test_causal_full_gqa_and_value_dims(n, nkv, hq, hv):
    b, t = 2, 19  # not a multiple of the blocks: padding inside the blockwise path
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _assert_same({"q_slots": slots}, b, t, t, n, nkv, hq, hv)


@pytest.mark.parametrize("t,block", [(37, 32), (70, 32), (64, 32)])
def test_tiles_balanced_to_the_length(t, block):
    # 37 tokens in tiles of at most 32: two of 24 (48 padded, not 64); 70: three of 24; 64: two
    # of 32. Each pads less than a whole tile and still equals the naive path.
    b = 2
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _assert_same({"q_slots": slots}, b, t, t, 4, 2, 8, 8, blocks=(block, block))
    assert [balanced_tile(n, 32) for n in (37, 70, 64, 20)] == [24, 24, 32, 20]


def test_query_block_at_an_offset_into_a_cache_with_empty_slots():
    b, t, s = 2, 5, 23
    lengths = np.array([9, 14])
    slots = jnp.asarray(lengths[:, None] + np.arange(t)[None], jnp.int32)
    valid = jnp.asarray(np.arange(s)[None] < (lengths + t)[:, None])
    valid = valid.at[0, 3].set(False)  # a hole in the cache
    _assert_same({"q_slots": slots, "kv_valid": valid}, b, t, s, 4, 2, 8, 8)


def test_padding_and_queries_that_see_nothing_give_zeros():
    b, t = 2, 12
    mask = np.ones((b, t), bool)
    mask[0, :3] = False  # left padding: the first queries see no key at all
    mask[1, 9:] = False  # right padding
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    masks = {"q_slots": slots, "kv_valid": jnp.asarray(mask)}
    out = _assert_same(masks, b, t, t, 2, 1, 4, 4)
    np.testing.assert_array_equal(out[0, :3], 0.0)


def test_segment_ids_separate_packed_sequences():
    b, t = 1, 16
    seg = jnp.asarray([[0] * 5 + [1] * 7 + [2] * 4], jnp.int32)
    slots = jnp.arange(t, dtype=jnp.int32)[None]
    masks = {"q_slots": slots, "q_segment_ids": seg, "kv_segment_ids": seg}
    _assert_same(masks, b, t, t, 2, 2, 4, 4)


def test_naive_matches_a_float64_numpy_reference():
    q, k, v, _ = _inputs(3, 1, 6, 6, 2, 1, 4, 3)
    slots = jnp.arange(6, dtype=jnp.int32)[None]
    out = dot_product_attention(q, k, v, q_slots=slots, impl="naive")
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    for h in range(2):
        s = qn[0, :, h] @ kn[0, :, 0].T / 2.0
        s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(out[0, :, h], p @ vn[0, :, 0], rtol=1e-5, atol=1e-6)


def test_compiled_temp_memory_is_linear_in_length():
    def temp(t, impl):
        q = jax.ShapeDtypeStruct((1, t, 2, 16), jnp.float32)
        slots = jax.ShapeDtypeStruct((1, t), jnp.int32)

        def f(q, slots):
            g = jax.grad(lambda q: dot_product_attention(q, q, q, q_slots=slots, impl=impl).sum())
            return g(q)

        return jax.jit(f).lower(q, slots).compile().memory_analysis().temp_size_in_bytes

    small, big = temp(2048, "blockwise"), temp(8192, "blockwise")
    assert big <= 4.5 * small, (small, big)
    assert temp(8192, "naive") > 8 * big  # the [T, S] scores the blockwise path avoids
