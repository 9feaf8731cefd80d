"""The OPD accumulator: −(1/N) Σ_turns grad, only N waits for the batch."""

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference


def test_opd_by_hand():
    # Turns [1, 2] (1 token) and [3, 4] (3 tokens): −(1/4)·[4, 6] = [−1, −1.5].
    acc = accumulators.opd()
    state = acc.init({"v": np.zeros(2, np.float32)})
    state = acc.add(state, grad={"v": np.array([1.0, 2.0], np.float32)}, num_tokens=1)
    state = acc.add(state, grad={"v": np.array([3.0, 4.0], np.float32)}, num_tokens=3)
    np.testing.assert_allclose(acc.finalize(state)["v"], [-1.0, -1.5], rtol=1e-7)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_opd_jitted_matches_reference(params, random_grad, loss_agg):
    rng = np.random.default_rng(0)
    turns = [(random_grad(rng), int(rng.integers(1, 50))) for _ in range(6)]
    acc = accumulators.opd(loss_agg=loss_agg)
    add = jax.jit(acc.add, donate_argnums=0)
    state = acc.init(params)
    for grad, n in turns:
        state = add(state, grad, n)
    want = reference.direct_gradient(turns, coef=-1.0, loss_agg=loss_agg)
    assert reference.relative_error(jax.jit(acc.finalize)(state), want) < 1e-6


def test_opd_rejects_nan_or_drops_it(params, random_grad):
    rng = np.random.default_rng(0)
    bad = jax.tree.map(lambda x: x * np.nan, random_grad(rng))
    with pytest.raises(ValueError, match="gradient contains NaN or inf"):
        accumulators.opd().add(accumulators.opd().init(params), bad, 3)
    acc = accumulators.opd(on_invalid="drop")
    state = acc.add(acc.init(params), bad, 3)
    assert int(state.dropped) == 1 and int(state.num_tokens) == 0
    recorded = jax.jit(accumulators.opd().add)(acc.init(params), bad, 3)
    with pytest.raises(ValueError, match="recorded an invalid add"):
        accumulators.opd().check(recorded)


def test_deterministic_opd_is_order_free_and_exact(params, random_grad):
    rng = np.random.default_rng(8)
    # Turn gradients of very different sizes: float32 sums would depend on the order.
    items = [
        (jax.tree.map(lambda g, s=10.0 ** (i % 5): g * s, random_grad(rng)), int(n))
        for i, n in enumerate(rng.integers(1, 40, size=17))
    ]
    acc = accumulators.opd(deterministic=True)
    jit_add = jax.jit(acc.add, donate_argnums=0)
    outputs = []
    for add in (acc.add, jit_add, acc.add):
        state = acc.init(params)
        for i in rng.permutation(len(items)):
            state = add(state, *items[i])
        outputs.append(acc.finalize(state))
    for other in outputs[1:]:
        for a, b in zip(jax.tree.leaves(outputs[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(
                np.asarray(a).view(np.int32), np.asarray(b).view(np.int32)
            )
    want = reference.direct_gradient(items)
    assert reference.relative_error(outputs[0], want) <= 1e-6


def test_deterministic_opd_overflow_is_an_error(params, random_grad):
    from thundersync_jax.accumulators import _exact

    acc = accumulators.opd(deterministic=True)
    state = acc.init(params)
    state = state._replace(total=state.total._replace(adds=np.int32(_exact.MAX_ADDS)))
    with pytest.raises(ValueError, match="exact tally is full"):
        acc.add(state, random_grad(np.random.default_rng(0)), 3)
