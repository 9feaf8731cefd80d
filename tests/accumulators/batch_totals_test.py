"""Finalizing per-process partial states with the global batch totals (issue 15).

Groups split over two "processes" (k mod 2), each state finalized with the global counts,
summed: the whole batch's gradient (float64 numpy oracle, and the one-state finalize).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax import accumulators

K, G = 4, 3


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=(K, G)).astype(np.float64)
    grads = rng.normal(size=(K, G, 5))
    tokens = rng.integers(1, 9, size=(K, G))
    return rewards, grads, tokens


def _oracle(rewards, grads, tokens, loss_agg, eps=1e-6):
    mu = rewards.mean(1, keepdims=True)
    sd = rewards.std(1, ddof=1, keepdims=True)
    adv = (rewards - mu) / (sd + eps)
    w = 1.0 / tokens if loss_agg == "seq-mean-token-mean" else np.ones_like(tokens, float)
    z = K * G if loss_agg == "seq-mean-token-mean" else tokens.sum()
    return -(adv[..., None] * w[..., None] * grads).sum((0, 1)) / z


def _fold(acc, groups, rewards, grads, tokens):
    state = acc.init({"w": jnp.zeros(5)})
    for k in groups:
        for m in range(G):
            g = {"w": jnp.asarray(grads[k, m], jnp.float32)}
            state = acc.add(state, k, float(rewards[k, m]), g, int(tokens[k, m]))
    return state


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_partial_states_with_global_totals_sum_to_the_batch_gradient(loss_agg, deterministic):
    rewards, grads, tokens = _batch()
    acc = accumulators.grpo(K, G, loss_agg=loss_agg, deterministic=deterministic)
    owned = [[k for k in range(K) if k % 2 == p] for p in (0, 1)]  # group k on process k mod 2
    parts = [_fold(acc, groups, rewards, grads, tokens) for groups in owned]
    totals = np.sum([accumulators.batch_totals(s) for s in parts], axis=0)
    assert tuple(totals) == (K * G, int(tokens.sum()))
    summed = sum(
        np.asarray(acc.finalize(accumulators.with_batch_totals(s, *totals))["w"], np.float64)
        for s in parts
    )
    whole = np.asarray(acc.finalize(_fold(acc, range(K), rewards, grads, tokens))["w"])
    np.testing.assert_allclose(summed, _oracle(rewards, grads, tokens, loss_agg), rtol=1e-5)
    np.testing.assert_allclose(summed, whole, rtol=1e-5, atol=1e-7)
    # Without the global totals each part is normalised by its own half: twice too large.
    alone = np.asarray(acc.finalize(parts[0])["w"])
    with_global = np.asarray(acc.finalize(accumulators.with_batch_totals(parts[0], *totals))["w"])
    assert not np.allclose(alone, with_global)


def test_opd_and_combined_states_take_the_totals():
    opd = accumulators.opd()
    params = {"w": jnp.zeros(2)}
    s = opd.add(opd.init(params), {"w": jnp.ones(2)}, 4)
    np.testing.assert_allclose(opd.finalize(s)["w"], -1 / 4)  # Z = its own 4 tokens
    np.testing.assert_allclose(opd.finalize(accumulators.with_batch_totals(s, 1, 8))["w"], -1 / 8)
    comb = accumulators.combine(accumulators.grpo(2, 2))
    state = comb.init(params)
    assert accumulators.batch_totals(accumulators.with_batch_totals(state, 3, 7)) == (3, 7)


def test_totals_below_the_states_own_are_refused():
    rewards, grads, tokens = _batch()
    acc = accumulators.grpo(K, G)
    state = _fold(acc, [0], rewards, grads, tokens)
    with pytest.raises(ValueError, match="below this state's own"):
        accumulators.with_batch_totals(state, 1, 1)


@pytest.mark.parametrize("deterministic", [False, True])
def test_batch_advantage_takes_the_batch_rewards(deterministic):
    """`batch`: each part finalized with the summed rewards and members gives the batch's ∇L."""
    rewards, grads, tokens = _batch(seed=3)
    acc = accumulators.grpo(K, G, advantage="batch", deterministic=deterministic)
    parts = [
        _fold(acc, [k for k in range(K) if k % 2 == p], rewards, grads, tokens) for p in (0, 1)
    ]
    totals = np.sum([accumulators.batch_totals(s) for s in parts], axis=0)
    gathered = [accumulators.batch_rewards(s) for s in parts]
    batch_r = sum(r for r, _ in gathered)
    batch_m = sum(m for _, m in gathered)
    summed = sum(
        np.asarray(
            acc.finalize(accumulators.with_batch_totals(s, *totals, batch_r, batch_m))["w"],
            np.float64,
        )
        for s in parts
    )
    eps, w = 1e-6, 1.0 / tokens
    adv = (rewards - rewards.mean()) / (rewards.std(ddof=1) + eps)  # batch-wide mean and std
    oracle = -(adv[..., None] * w[..., None] * grads).sum((0, 1)) / (K * G)
    np.testing.assert_allclose(summed, oracle, rtol=1e-5, atol=1e-7)
    whole = np.asarray(acc.finalize(_fold(acc, range(K), rewards, grads, tokens))["w"])
    np.testing.assert_allclose(summed, whole, rtol=1e-5, atol=1e-7)


def test_batch_advantage_needs_the_batch_rewards():
    rewards, grads, tokens = _batch()
    acc = accumulators.grpo(K, G, advantage="batch")
    part = _fold(acc, [0, 2], rewards, grads, tokens)
    with pytest.raises(ValueError, match="pass the batch's rewards and members"):
        accumulators.with_batch_totals(part, K * G, int(tokens.sum()))
    own_r, own_m = accumulators.batch_rewards(part)
    with pytest.raises(ValueError, match="disagree with this state's own groups"):
        accumulators.with_batch_totals(part, K * G, int(tokens.sum()), own_r + 1, own_m + G)
    with pytest.raises(ValueError, match="members sum to 6"):
        accumulators.with_batch_totals(part, K * G, int(tokens.sum()), own_r, own_m)
    per_group = _fold(accumulators.grpo(K, G), [0], rewards, grads, tokens)
    assert accumulators.batch_rewards(per_group) == (None, None)
    with pytest.raises(ValueError, match="need only the counts"):
        accumulators.with_batch_totals(per_group, K * G, 99, own_r, own_m)
