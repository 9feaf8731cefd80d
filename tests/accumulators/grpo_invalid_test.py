"""Bad input: a clear error naming the value, or a counted drop; never a wrong update."""

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference


def test_nonfinite_reward_raises_naming_it(params, random_grad):
    acc = accumulators.grpo(2, 2)
    state = acc.init(params)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"add: reward={bad} for group 1 is not finite"):
            acc.add(state, 1, bad, random_grad(np.random.default_rng(0)), 3)


def test_nonfinite_grad_raises_naming_the_leaf(params, random_grad):
    acc = accumulators.grpo(2, 2)
    grad = random_grad(np.random.default_rng(0))
    grad["blocks"][0][1, 2] = np.inf
    with pytest.raises(ValueError, match=r"contains NaN or inf.*\['blocks'\]\[0\] \(1 non-finite"):
        acc.add(acc.init(params), 0, 1.0, grad, 3)


def test_group_out_of_range_raises(params, random_grad):
    acc = accumulators.grpo(3, 2)
    for group in (-1, 3):
        with pytest.raises(
            ValueError, match=rf"group={group} is out of range; valid groups are 0..2"
        ):
            acc.add(acc.init(params), group, 1.0, random_grad(np.random.default_rng(0)), 3)
    with pytest.raises(ValueError, match="group=5 is out of range"):
        acc.close(acc.init(params), 5)


def test_add_to_closed_group_raises(params, random_grad):
    rng = np.random.default_rng(0)
    acc = accumulators.grpo(2, 3)
    state = acc.add(acc.init(params), 0, 1.0, random_grad(rng), 3)
    state = acc.close(state, 0)
    state = acc.close(state, 0)  # closing twice is harmless
    with pytest.raises(ValueError, match="group 0 is already closed"):
        acc.add(state, 0, 0.0, random_grad(rng), 3)


def test_negative_tokens_and_overfull_chunk_raise(params, random_grad):
    rng = np.random.default_rng(0)
    acc = accumulators.grpo(1, 3)
    with pytest.raises(ValueError, match="num_tokens for group 0 is negative"):
        acc.add(acc.init(params), 0, 1.0, random_grad(rng), -2)
    with pytest.raises(ValueError, match="past group_size=3"):
        acc.add_weighted(acc.init(params), 0, 1.0, random_grad(rng), 12, 4)


def test_finalize_with_open_group_raises(params, random_grad):
    acc = accumulators.grpo(2, 3)
    state = acc.add(acc.init(params), 1, 1.0, random_grad(np.random.default_rng(0)), 3)
    with pytest.raises(ValueError, match=r"groups \[1\] are still open \(members \[1\] of"):
        acc.finalize(state)


def test_mismatched_tree_raises(params, random_grad):
    acc = accumulators.grpo(2, 3)
    grad = random_grad(np.random.default_rng(0))
    del grad["b"]
    with pytest.raises(ValueError, match="grad has tree structure"):
        acc.add(acc.init(params), 0, 1.0, grad, 3)
    grad = random_grad(np.random.default_rng(0))
    grad["w"] = grad["w"].T
    with pytest.raises(
        ValueError, match=r"grad leaf \['w'\] has shape \(3, 5\), expected \(5, 3\)"
    ):
        acc.add(acc.init(params), 0, 1.0, grad, 3)


def test_bad_configuration_raises():
    with pytest.raises(ValueError, match="unknown advantage 'ppo'; registered estimators"):
        accumulators.grpo(2, 2, advantage="ppo")
    with pytest.raises(ValueError, match="unknown loss_agg 'mean'"):
        accumulators.grpo(2, 2, loss_agg="mean")
    with pytest.raises(ValueError, match=r"needs max_len > 0 \(got max_len=None\)"):
        accumulators.grpo(2, 2, loss_agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="on_invalid must be one of"):
        accumulators.grpo(2, 2, on_invalid="ignore")


def test_drop_mode_drops_and_counts(params, random_grad):
    rng = np.random.default_rng(0)
    good = [(0, 1.0, random_grad(rng), 4), (0, 0.0, random_grad(rng), 5)]
    nan_grad = jax.tree.map(lambda x: x * np.nan, random_grad(rng))
    bad = [(0, float("nan"), random_grad(rng), 4), (0, 2.0, nan_grad, 4), (9, 1.0, good[0][2], 4)]
    acc = accumulators.grpo(1, 2, on_invalid="drop")
    state = acc.init(params)
    for group, reward, grad, n in [bad[0], good[0], bad[1], bad[2], good[1]]:
        state = acc.add(state, group, reward, grad, n)
    assert int(state.dropped) == 3 and int(state.error) == 0
    want = reference.grpo_gradient(good)
    assert reference.relative_error(acc.finalize(state), want) < 1e-6


def test_drop_mode_still_raises_past_the_open_group_cap(params, random_grad):
    rng = np.random.default_rng(0)
    acc = accumulators.grpo(2, 2, max_open_groups=1, on_invalid="drop")
    state = acc.add(acc.init(params), 0, 1.0, random_grad(rng), 4)
    with pytest.raises(ValueError, match="max_open_groups=1"):
        acc.add(state, 1, 1.0, random_grad(rng), 4)
