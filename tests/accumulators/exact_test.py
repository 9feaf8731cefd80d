"""Exact int32-limb tallies: hand-checkable values, order-free bits, range and headroom."""

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.accumulators import _exact

TRUE = jnp.asarray(True)


def _sum(values, params):
    tally = _exact.zeros(params)
    for v in values:
        tally, overflow = _exact.add(tally, v, TRUE)
        assert not bool(overflow)
    return tally


def test_small_sums_are_exact_by_hand():
    # 1.5 − 0.25 + 2^-30 = 1.2500000009313226: exact in the limbs, rounded once to float32.
    params = {"x": np.zeros(2, np.float32)}
    values = [{"x": np.float32([1.5, -3.0])}, {"x": np.float32([-0.25, 1.0])}]
    values.append({"x": np.float32([2.0**-30, 0.0])})
    got = _exact.to_float(_sum(values, params))["x"]
    np.testing.assert_array_equal(got, np.float32([1.25 + 2.0**-30, -2.0]))


def test_cancellation_leaves_the_small_part_exactly():
    # (1e8 + 1) − 1e8 in float32 order-dependent sums gives 0 or 8; exact gives the 1.
    params = {"x": np.zeros(1, np.float32)}
    values = [{"x": np.float32([1e8])}, {"x": np.float32([1.0])}, {"x": np.float32([-1e8])}]
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        got = _exact.to_float(_sum([values[i] for i in order], params))["x"]
        np.testing.assert_array_equal(got, np.float32([1.0]))


def test_any_order_same_bits_and_float64_accuracy():
    rng = np.random.default_rng(0)
    params = {"a": np.zeros((5, 3), np.float32), "b": np.zeros(7, np.float32)}
    values = [
        {
            "a": (rng.normal(size=(5, 3)) * 10.0 ** rng.integers(-12, 12)).astype(np.float32),
            "b": rng.normal(size=7).astype(np.float32),
        }
        for _ in range(24)
    ]
    want = jax.tree.map(lambda *v: np.sum(np.asarray(v, np.float64), axis=0), *values)
    results = []
    for _ in range(4):
        tally = _sum([values[i] for i in rng.permutation(len(values))], params)
        results.append(_exact.to_float(tally))
    for other in results[1:]:
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(
                np.asarray(a).view(np.int32), np.asarray(b).view(np.int32)
            )
    for got, ref in zip(jax.tree.leaves(results[0]), jax.tree.leaves(want), strict=True):
        # Each element to ~1 float32 rounding, except where the leaf's window truncates
        # values 2^-42 below its largest (here: never above 1e-12 of the leaf's scale).
        err = np.abs(np.asarray(got, np.float64) - ref)
        assert np.all(err <= 2.0**-23 * np.abs(ref) + 2.0**-40 * np.max(np.abs(ref)))


def test_window_rise_drops_what_a_later_add_would_truncate():
    # A value 2^-60 of a later big one: kept while it is alone, gone once the big one
    # arrives, and the same bits whichever came first.
    params = {"x": np.zeros(1, np.float32)}
    tiny, big = {"x": np.float32([2.0**-40])}, {"x": np.float32([2.0**20])}
    np.testing.assert_array_equal(_exact.to_float(_sum([tiny], params))["x"], [2.0**-40])
    first = _exact.to_float(_sum([tiny, big], params))["x"]
    second = _exact.to_float(_sum([big, tiny], params))["x"]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, [2.0**20])


def test_headroom_overflow_is_reported_and_skipped():
    params = {"x": np.zeros(3, np.float32)}
    tally = _exact.zeros(params)._replace(adds=jnp.int32(_exact.MAX_ADDS))
    after, overflow = _exact.add(tally, {"x": np.ones(3, np.float32)}, TRUE)
    assert bool(overflow)
    np.testing.assert_array_equal(after.limbs["x"], tally.limbs["x"])


def test_float32_range_overflow_reads_out_as_inf():
    params = {"x": np.zeros(1, np.float32)}
    big = {"x": np.float32([3e38])}
    value = _exact.to_float(_sum([big, big], params))["x"]
    assert np.isinf(value).all()  # callers turn this into an error (see grpo/opd finalize)


def test_stacked_tallies_keep_separate_windows():
    # Two buckets of one stack: a huge value in one must not truncate the other.
    params = {"x": np.zeros(2, np.float32)}
    stack = _exact.zeros(params, 2)
    stack, _ = _exact.add(stack, {"x": np.float32([1e30, 1e30])}, TRUE, (0,))
    stack, _ = _exact.add(stack, {"x": np.float32([1e-3, 3.0])}, TRUE, (1,))
    values = _exact.stack_to_float(stack.limbs["x"])
    np.testing.assert_array_equal(values[1], np.float32([1e-3, 3.0]))
    np.testing.assert_array_equal(np.asarray(stack.adds), [1, 1])
