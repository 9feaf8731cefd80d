"""Numpy advantage callables run on the host; a bad output is an error naming the group."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import replay

REWARDS = [[1.0, 0.0, 0.0, 2.0], [0.5, 0.25, 0.5], [3.0, -1.0]]


def numpy_ranks(r):
    """Centred tie-averaged ranks through np.argsort (JAX cannot trace the item assignment)."""
    order = np.argsort(r, kind="stable")
    ranks = np.empty(len(r))
    ranks[order] = np.arange(len(r))
    for value in np.unique(r):
        ranks[r == value] = ranks[r == value].mean()
    return ranks - ranks.mean()


def numpy_loo_std(r):
    """(r_i − mean of the others)/(std of the others + ε), a Python loop over members."""
    if len(r) == 1:
        return np.array(r, np.float64)
    out = np.empty(len(r))
    for i in range(len(r)):
        others = np.delete(r, i)
        out[i] = (r[i] - others.mean()) / (others.std(ddof=1 if len(others) > 1 else 0) + 1e-6)
    return out


def _batch(random_grad, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (k, r, random_grad(rng), int(rng.integers(1, 20)))
        for k, group in enumerate(REWARDS)
        for r in group
    ]


def test_numpy_callables_run_on_the_host_and_jnp_ones_are_traced():
    assert accumulators.grpo(3, 4, advantage=numpy_ranks).config.advantage.host
    assert accumulators.grpo(3, 4, advantage=numpy_loo_std).config.advantage.host
    assert not accumulators.grpo(3, 4, advantage=lambda r: r - jnp.mean(r)).config.advantage.host


@pytest.mark.parametrize(
    "deterministic,estimator",
    [
        (False, numpy_ranks),
        (False, numpy_loo_std),
        (True, numpy_ranks),
        # in make test, not test-quick: the exact path with a host callable is the line above
        pytest.param(True, numpy_loo_std, marks=pytest.mark.slow),
    ],
)
def test_numpy_callable_matches_float64_eager_and_jitted(
    params, random_grad, estimator, deterministic
):
    acc = accumulators.grpo(3, 4, advantage=estimator, deterministic=deterministic)
    trajectories = _batch(random_grad)
    want = reference.grpo_gradient(trajectories, estimator)
    order = [4, 0, 7, 1, 5, 8, 2, 6, 3]  # interleaved groups; the short ones close early
    eager = acc.finalize(replay(acc, params, trajectories, order))
    jit_add = jax.jit(acc.add, donate_argnums=0)
    jit_close = jax.jit(acc.close, donate_argnums=0)
    state = replay(acc, params, trajectories, order, add=jit_add, close=jit_close)
    acc.check(state)
    jitted = jax.jit(acc.finalize)(state)
    assert reference.relative_error(eager, want) <= 1e-5
    assert reference.relative_error(jitted, want) <= 1e-5


def _fill(acc, params, random_grad, rewards):
    rng = np.random.default_rng(1)
    state = acc.init(params)
    for r in rewards[:-1]:
        state = acc.add(state, 1, r, random_grad(rng), 3)
    return state, random_grad(rng)


# np.asarray(r) makes each of these numpy-only (JAX cannot trace it): the host path.
BAD = {
    "shape": (lambda r: np.append(np.asarray(r), 0.0), "wrong shape for group 1"),
    "nan": (lambda r: np.asarray(r) * np.nan, "returned NaN or inf for group 1"),
    "not group-wise": (lambda r: np.arange(np.asarray(r).size) * 1.0, "equal rewards in group 1"),
}


@pytest.mark.parametrize(
    ("case", "deterministic"), [(case, False) for case in sorted(BAD)] + [("shape", True)]
)
def test_bad_host_callable_is_a_clear_error_naming_the_group(
    params, random_grad, case, deterministic
):
    fn, message = BAD[case]
    acc = accumulators.grpo(2, 3, advantage=fn, deterministic=deterministic)
    state, grad = _fill(acc, params, random_grad, [1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=message):
        acc.add(state, 1, 0.0, grad, 3)  # the group folds here
    recorded = jax.jit(acc.add)(state, 1, 0.0, grad, 3)
    with pytest.raises(ValueError, match=message):
        acc.check(recorded)


def test_bad_traced_callable_is_a_clear_error_naming_the_group(params, random_grad):
    # A traced callable's shape is checked while tracing: at the group's first add.
    acc = accumulators.grpo(2, 3, advantage=lambda r: jnp.zeros(r.shape[0] + 1))
    with pytest.raises(ValueError, match=r"group 1: advantage callable returned shape \(2,\)"):
        acc.add(acc.init(params), 1, 0.0, random_grad(np.random.default_rng(0)), 3)
    nan_acc = accumulators.grpo(2, 3, advantage=lambda r: r / 0.0 * 0.0)
    state, grad = _fill(nan_acc, params, random_grad, [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="returned NaN or inf for group 1"):
        nan_acc.add(state, 1, 0.0, grad, 3)
