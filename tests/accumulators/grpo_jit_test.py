"""The accumulator under jax.jit: donated state, traced inputs, one compilation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import replay


def _trajectories(random_grad, seed=0):
    rng = np.random.default_rng(seed)
    rewards = [[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [2.0, 0.0]]  # the last group closes early
    return [
        (k, r, random_grad(rng), int(rng.integers(1, 20)))
        for k, group in enumerate(rewards)
        for r in group
    ]


@pytest.mark.parametrize("advantage", ["grpo", "batch", "wins-minus-losses"])
def test_jitted_add_compiles_once_and_matches_reference(params, random_grad, advantage):
    def wins_minus_losses(r):
        return (r[:, None] > r[None, :]).sum(1) * 1.0 - (r[:, None] < r[None, :]).sum(1)

    estimator = wins_minus_losses if advantage == "wins-minus-losses" else advantage
    acc = accumulators.grpo(3, 3, advantage=estimator, max_open_groups=2)
    traces = {"add": 0, "close": 0}

    def add(state, group, reward, grad, num_tokens):
        traces["add"] += 1  # runs only while tracing
        return acc.add(state, group, reward, grad, num_tokens)

    def close(state, group):
        traces["close"] += 1
        return acc.close(state, group)

    jit_add = jax.jit(add, donate_argnums=0)
    jit_close = jax.jit(close, donate_argnums=0)
    trajectories = _trajectories(random_grad)
    order = [0, 3, 1, 4, 2, 6, 5, 7]  # groups 0 and 1 interleave; group 2 takes 0's slot
    state = replay(acc, params, trajectories, order, add=jit_add, close=jit_close)
    assert traces == {"add": 1, "close": 1}, traces
    acc.check(state)
    got = jax.jit(acc.finalize)(state)
    want = reference.grpo_gradient(trajectories, estimator)
    assert reference.relative_error(got, want) < 1e-5


def test_state_dtypes_are_fixed(params):
    # Weak types or int64 in the state would change the jit signature after the first add.
    acc = accumulators.grpo(2, 2)
    state = acc.init(params)
    after = jax.jit(acc.add)(state, 1, 0.5, params, 3)
    for before_leaf, after_leaf in zip(jax.tree.leaves(state), jax.tree.leaves(after), strict=True):
        assert before_leaf.dtype == after_leaf.dtype
        assert not getattr(after_leaf, "weak_type", False)
        assert before_leaf.shape == after_leaf.shape


def test_jitted_bad_input_is_recorded_not_applied(params, random_grad):
    acc = accumulators.grpo(2, 2)
    jit_add = jax.jit(acc.add, donate_argnums=0)
    rng = np.random.default_rng(1)
    state = jit_add(acc.init(params), 0, 1.0, random_grad(rng), 4)
    state = jit_add(state, 1, float("nan"), random_grad(rng), 4)
    assert int(state.error) != 0 and int(state.members[1]) == 0
    with pytest.raises(ValueError, match=r"reward=nan for group 1 is not finite"):
        acc.check(state, allow_open=True)
    grads = jax.jit(acc.finalize)(state)
    assert all(bool(jnp.all(jnp.isnan(g))) for g in jax.tree.leaves(grads))
    with pytest.raises(ValueError, match="recorded an invalid add"):
        acc.finalize(state)


def test_jitted_group_out_of_range_and_closed_group(params, random_grad):
    acc = accumulators.grpo(2, 1)
    jit_add = jax.jit(acc.add)
    rng = np.random.default_rng(2)
    state = jit_add(acc.init(params), 0, 1.0, random_grad(rng), 4)  # group 0 is now full
    bad = jit_add(state, 0, 1.0, random_grad(rng), 4)
    with pytest.raises(ValueError, match="group 0 is already closed"):
        acc.check(bad)
    bad = jit_add(state, 7, 1.0, random_grad(rng), 4)
    with pytest.raises(ValueError, match=r"group=7 is out of range; valid groups are 0..1"):
        acc.check(bad)


def test_jitted_cap_overflow_is_recorded(params, random_grad):
    acc = accumulators.grpo(3, 2, max_open_groups=1)
    jit_add = jax.jit(acc.add)
    rng = np.random.default_rng(3)
    state = jit_add(acc.init(params), 0, 1.0, random_grad(rng), 4)
    state = jit_add(state, 2, 1.0, random_grad(rng), 4)
    with pytest.raises(ValueError, match="max_open_groups=1"):
        acc.check(state, allow_open=True)
