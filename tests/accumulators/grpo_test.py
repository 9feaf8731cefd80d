"""The streaming GRPO accumulator equals the batch-synchronous update.

Hand-checkable cases first (numbers a reader can verify), then property tests
over arrival orders, group sizes, ties, reward scales, early close and
singleton groups, for every estimator × aggregation mode, against the float64
reference in `thundersync_jax.accumulators.reference`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import peak_open_groups, replay

AFFINE = ["grpo", "drgrpo", "rloo", "batch"]
MODES = ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean", "seq-mean-token-sum-norm"]
MAX_LEN = 31


def standardize(r):
    """A group-wise callable (population std), written with array methods for np and jnp."""
    return (r - r.mean()) / (r.std() + 1e-6)


def wins_minus_losses(r):
    """A non-affine (rank) estimator: members beaten minus members beating."""
    return (r[:, None] > r[None, :]).sum(1) * 1.0 - (r[:, None] < r[None, :]).sum(1)


CALLABLES = {"standardize": standardize, "wins-minus-losses": wins_minus_losses}


def _vec(values):
    return {"v": np.asarray(values, np.float32)}


def _run(acc, trajectories):
    state = acc.init(_vec(np.zeros(len(trajectories[0][2]["v"]))))
    for group, reward, grad, n in trajectories:
        state = acc.add(state, group=group, reward=reward, grad=grad, num_tokens=n)
    return acc.finalize(state)["v"]


def test_drgrpo_two_members_by_hand():
    # Rewards 1 and 0: μ = 0.5, A = ±0.5. Token counts 2 and 4: w = 1/2, 1/4. Z = B = 2.
    # ∇L = −(1/2)(0.5·0.5·[1, 0] − 0.5·0.25·[0, 1]) = [−0.125, 0.0625].
    acc = accumulators.grpo(num_groups=1, group_size=2, advantage="drgrpo")
    got = _run(acc, [(0, 1.0, _vec([1, 0]), 2), (0, 0.0, _vec([0, 1]), 4)])
    np.testing.assert_allclose(got, [-0.125, 0.0625], rtol=1e-7)


def test_rloo_three_members_by_hand():
    # Rewards 1, 2, 6: leave-one-out baselines 4, 3.5, 1.5, so A = −3, −1.5, 4.5.
    # seq-mean-token-sum: w = 1, Z = 3; ∇L = −(1/3)·A = [1, 0.5, −1.5].
    acc = accumulators.grpo(1, 3, advantage="rloo", loss_agg="seq-mean-token-sum")
    grads = [_vec([1, 0, 0]), _vec([0, 1, 0]), _vec([0, 0, 1])]
    got = _run(acc, [(0, r, g, 5) for r, g in zip([1.0, 2.0, 6.0], grads, strict=True)])
    np.testing.assert_allclose(got, [1.0, 0.5, -1.5], rtol=1e-6)


def test_grpo_two_members_by_hand():
    # Rewards 3 and 1: μ = 2, σ (Bessel) = √2, A = ±1/(√2 + ε). token-mean: Z = N = 2 + 2.
    acc = accumulators.grpo(1, 2, advantage="grpo", loss_agg="token-mean")
    got = _run(acc, [(0, 3.0, _vec([1, 0]), 2), (0, 1.0, _vec([0, 1]), 2)])
    a = 1 / (np.sqrt(2) + 1e-6)
    np.testing.assert_allclose(got, [-a / 4, a / 4], rtol=1e-6)


def test_singleton_group_follows_verl():
    # A group of one: μ = 0, σ = 1, so A = r/(1 + ε) under grpo and A = r under drgrpo, rloo.
    for advantage, a in [("grpo", 2 / (1 + 1e-6)), ("drgrpo", 2.0), ("rloo", 2.0)]:
        acc = accumulators.grpo(1, 1, advantage=advantage, loss_agg="token-mean")
        got = _run(acc, [(0, 2.0, _vec([3.0]), 3)])
        np.testing.assert_allclose(got, [-a * 3 / 3], rtol=1e-6)


@pytest.mark.parametrize("advantage", ["grpo", "drgrpo", "rloo", "batch"])
@pytest.mark.parametrize("reward", [5.0, 1000.0 + 1 / 64, 0.1])
def test_all_equal_rewards_contribute_exactly_nothing(advantage, reward):
    acc = accumulators.grpo(2, 3, advantage=advantage)
    rng = np.random.default_rng(0)
    trajs = [(k, reward, _vec(rng.normal(size=3) * 1e4), 7) for k in range(2) for _ in range(3)]
    got = _run(acc, trajs)
    assert np.all(got == 0.0), got


def test_early_close_uses_the_members_it_has():
    # Group 0 has G = 4 slots but only 2 members arrive: it is the drgrpo group {1, 0}.
    acc = accumulators.grpo(1, 4, advantage="drgrpo", loss_agg="seq-mean-token-sum")
    state = acc.init(_vec([0.0, 0.0]))
    state = acc.add(state, 0, 1.0, _vec([1, 0]), 3)
    state = acc.add(state, 0, 0.0, _vec([0, 1]), 3)
    with pytest.raises(ValueError, match=r"groups \[0\] are still open"):
        acc.finalize(state)
    state = acc.close(state, 0)
    np.testing.assert_allclose(acc.finalize(state)["v"], [-0.25, 0.25], rtol=1e-7)


def test_batch_estimator_pools_every_group():
    # Rewards 0, 2 | 4, 6 pooled: μ_B = 3, σ_B = √(20/3); w = 1, Z = 4.
    acc = accumulators.grpo(2, 2, advantage="batch", loss_agg="seq-mean-token-sum", eps=0.0)
    eye = np.eye(4)
    got = _run(acc, [(k // 2, 2.0 * k, _vec(eye[k]), 1) for k in range(4)])
    want = -np.array([-3, -1, 1, 3]) / np.sqrt(20 / 3) / 4
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _batch(draw, random_grad, reward_offset, reward_scale, max_distinct=4):
    """Draws K groups of 0..G members (0: the group never arrives) with tied rewards.

    K and G are fixed so eager op compilations are shared between examples; the
    drawn member counts still give full, short (closed early) and singleton groups.
    """
    num_groups, group_size = 3, 4
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    trajectories = []
    for group in range(num_groups):
        members = draw(st.integers(0 if group else 1, group_size))
        for _ in range(members):
            level = int(rng.integers(0, max_distinct))
            trajectories.append(
                (
                    group,
                    reward_offset + reward_scale * level,
                    random_grad(rng),
                    int(rng.integers(1, 40)),
                )
            )
    order = draw(st.permutations(range(len(trajectories))))
    return num_groups, group_size, trajectories, list(order)


def _check_stream(draw, params, random_grad, advantage, loss_agg, offset, scale, tol):
    num_groups, group_size, trajectories, order = _batch(draw, random_grad, offset, scale)
    # Exactly as many tally slots as this interleaving needs: slots must be reused.
    cap = peak_open_groups(trajectories, order)
    acc = accumulators.grpo(
        num_groups,
        group_size,
        advantage=advantage,
        loss_agg=loss_agg,
        max_len=MAX_LEN,
        max_open_groups=cap,
    )
    state = replay(acc, params, trajectories, order)
    got = acc.finalize(state)
    want = reference.grpo_gradient(trajectories, advantage, loss_agg, max_len=MAX_LEN)
    err = reference.relative_error(got, want)
    assert err <= tol, (err, trajectories, order)
    assert jax.tree.structure(got) == jax.tree.structure(params)
    assert int(state.open_peak) <= cap


FAST = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
MODERATE = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("advantage", AFFINE)
@MODERATE
@given(
    data=st.data(),
    loss_agg=st.sampled_from(MODES),
    scale=st.sampled_from([1.0, 1 / 64, 0.37, 1e3]),
)
def test_affine_stream_matches_reference(params, random_grad, advantage, loss_agg, data, scale):
    _check_stream(data.draw, params, random_grad, advantage, loss_agg, 0.0, scale, 1e-5)


@pytest.mark.parametrize("advantage", AFFINE)
@FAST
@given(data=st.data())
def test_affine_stream_with_large_reward_offset(params, random_grad, advantage, data):
    # Rewards 1000 + j/64: the shifted tallies keep these to ~1e-7.
    _check_stream(
        data.draw, params, random_grad, advantage, "seq-mean-token-mean", 1000.0, 1 / 64, 1e-4
    )


@pytest.mark.parametrize("name", sorted(CALLABLES))
@MODERATE
@given(data=st.data(), loss_agg=st.sampled_from(MODES), scale=st.sampled_from([1.0, 0.5]))
def test_callable_stream_matches_reference(params, random_grad, name, loss_agg, data, scale):
    _check_stream(data.draw, params, random_grad, CALLABLES[name], loss_agg, 0.0, scale, 1e-5)


def test_packed_chunks_equal_single_adds(params, random_grad):
    # Chunks of one (group, reward): grad = Σ_j w_j h_j, num_tokens = Σ_j n_j, count = m.
    rng = np.random.default_rng(3)
    for loss_agg in MODES:
        acc = accumulators.grpo(2, 5, advantage="grpo", loss_agg=loss_agg, max_len=MAX_LEN)
        trajectories = [
            (k, float(r), random_grad(rng), int(rng.integers(1, 30)))
            for k, rewards in enumerate([[1, 1, 0, 1, 0], [0, 0, 1, 0, 0]])
            for r in rewards
        ]
        state = acc.init(params)
        for k in (1, 0):
            for r in (0.0, 1.0):
                chunk = [t for t in trajectories if t[0] == k and t[1] == r]
                weights = [np.float32(acc.loss_weight(t[3])) for t in chunk]
                grad = jax.tree.map(
                    lambda *g, weights=weights: sum(w * x for w, x in zip(weights, g, strict=True)),
                    *[t[2] for t in chunk],
                )
                n = sum(t[3] for t in chunk)
                state = acc.add_weighted(state, k, r, grad, n, len(chunk))
        want = reference.grpo_gradient(trajectories, "grpo", loss_agg, max_len=MAX_LEN)
        assert reference.relative_error(acc.finalize(state), want) < 1e-5


def test_bf16_grads_accumulate_in_float32(params, random_grad):
    rng = np.random.default_rng(4)
    acc = accumulators.grpo(1, 3, advantage="grpo")
    state = acc.init(jax.tree.map(lambda p: jnp.asarray(p, jnp.bfloat16), params))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.total))
    trajectories = []
    for r in (0.0, 1.0, 3.0):
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), random_grad(rng))
        trajectories.append((0, r, g, 4))
        state = acc.add(state, 0, r, g, 4)
    want = reference.grpo_gradient(
        [
            (k, r, jax.tree.map(lambda x: np.asarray(x, np.float64), g), n)
            for k, r, g, n in trajectories
        ]
    )
    assert reference.relative_error(acc.finalize(state), want) < 1e-5
