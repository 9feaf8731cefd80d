"""Deterministic mode: any order of adds and closes gives bitwise the same finalize.

Each case streams one batch in several arrival patterns: sync-like (every
add, then every short group closed, in a random closing order), stream-like
(random interleaving, a short group closed right after its last member) and
group-like (group by group), and checks the bits are equal and the result is
within 1e-6 of the float64 batch-synchronous reference.
"""

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import replay

MODES = ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean", "seq-mean-token-sum-norm"]
MAX_LEN = 31
# Group 0 full, 1 with ties, 2 short (closed early), 3 a singleton, 4 all equal.
REWARDS = [[1.0, 0.0, 1.0, 1.0], [0.5, 0.25, 0.5], [2.0, -1.0], [3.0], [0.7, 0.7, 0.7, 0.7]]


def standardize(r):
    """A jnp-traceable group-wise callable (population std)."""
    return (r - r.mean()) / (r.std() + 1e-6)


def numpy_ranks(r):
    """Tie-averaged ranks, centred; numpy only (np.argsort, item assignment): runs on the host."""
    order = np.argsort(r, kind="stable")
    ranks = np.empty(len(r))
    ranks[order] = np.arange(len(r))
    for value in np.unique(r):
        ranks[r == value] = ranks[r == value].mean()
    return ranks - ranks.mean()


def numpy_loo_std(r):
    """(r_i − mean of the others) / (std of the others + ε); alone: r. numpy loop on the host."""
    if len(r) == 1:
        return np.array(r, np.float64)
    out = np.empty(len(r))
    for i in range(len(r)):
        others = np.delete(r, i)
        out[i] = (r[i] - others.mean()) / (others.std() + 1e-6)
    return out


ESTIMATORS = {
    "grpo": "grpo",
    "drgrpo": "drgrpo",
    "rloo": "rloo",
    "batch": "batch",
    "standardize": standardize,
    "numpy-ranks": numpy_ranks,
    "numpy-loo-std": numpy_loo_std,
}


def _batch(random_grad, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [
        (k, float(r * scale), random_grad(rng), int(rng.integers(0, 30)))
        for k, rewards in enumerate(REWARDS)
        for r in rewards
    ]


def _sync_like(acc, params, trajectories, rng):
    """Every add in batch order, then every short group closed in a random order."""
    state = acc.init(params)
    for group, reward, grad, n in trajectories:
        state = acc.add(state, group, reward, grad, n)
    for group in rng.permutation(len(REWARDS)):
        state = acc.close(state, int(group))
    return state


def _group_like(acc, params, trajectories, rng):
    """Groups in a random order, members in a random order, each group closed after its last."""
    state = acc.init(params)
    for group in rng.permutation(len(REWARDS)):
        members = [t for t in trajectories if t[0] == group]
        for i in rng.permutation(len(members)):
            state = acc.add(state, *members[i])
        state = acc.close(state, int(group))
    return state


def _bits(tree):
    return [np.asarray(leaf).view(np.int32).copy() for leaf in jax.tree.leaves(tree)]


def _assert_bitwise(outputs):
    first = _bits(outputs[0])
    for other in outputs[1:]:
        for a, b in zip(first, _bits(other), strict=True):
            np.testing.assert_array_equal(a, b)


def _schedules(acc, params, trajectories, seed):
    rng = np.random.default_rng(seed)
    states = [
        _sync_like(acc, params, trajectories, rng),
        _group_like(acc, params, trajectories, rng),
    ]
    for _ in range(3):
        states.append(replay(acc, params, trajectories, rng.permutation(len(trajectories))))
    return [acc.finalize(s) for s in states]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_order_gives_the_same_bits_and_matches_float64(params, random_grad, name):
    estimator = ESTIMATORS[name]
    for seed, loss_agg in enumerate(MODES):
        acc = accumulators.grpo(
            len(REWARDS), 4, advantage=estimator, loss_agg=loss_agg, max_len=MAX_LEN,
            deterministic=True,
        )  # fmt: skip
        trajectories = _batch(random_grad, seed)
        outputs = _schedules(acc, params, trajectories, seed)
        _assert_bitwise(outputs)
        want = reference.grpo_gradient(trajectories, estimator, loss_agg, max_len=MAX_LEN)
        assert reference.relative_error(outputs[0], want) <= 1e-6, (name, loss_agg)


@pytest.mark.parametrize("name", ["grpo", "rloo", "batch"])
def test_large_reward_offset_stays_accurate(params, random_grad, name):
    # Rewards 1000 + small: advantages come from sorted rewards shifted by their minimum.
    acc = accumulators.grpo(len(REWARDS), 4, advantage=name, deterministic=True)
    # float32-representable rewards: the reference must see what the accumulator sees.
    trajectories = [
        (k, float(np.float32(1000.0 + r / 64)), g, n) for k, r, g, n in _batch(random_grad, 7)
    ]
    outputs = _schedules(acc, params, trajectories, 7)
    _assert_bitwise(outputs)
    want = reference.grpo_gradient(trajectories, name)
    assert reference.relative_error(outputs[0], want) <= 1e-5


def test_default_path_is_order_dependent_but_deterministic_is_not():
    # Gradients of wildly different magnitudes: float32 sums depend on order, exact sums do not.
    rng = np.random.default_rng(5)
    params = {"w": np.zeros(13, np.float32)}
    grads = [(rng.normal(size=13) * 10.0 ** (i % 7)).astype(np.float32) for i in range(16)]
    trajectories = [(0, float(i % 2), {"w": g}, 1) for i, g in enumerate(grads)]
    results = {}
    for deterministic in (False, True):
        acc = accumulators.grpo(1, 16, advantage="drgrpo", deterministic=deterministic)
        results[deterministic] = [
            acc.finalize(replay(acc, params, trajectories, rng.permutation(16)))["w"]
            for _ in range(6)
        ]
    assert any(not np.array_equal(results[False][0], r) for r in results[False][1:])
    _assert_bitwise(results[True])


def test_add_weighted_chunks_are_exact(params, random_grad):
    # One chunk per (group, reward) with grad = Σ_j w_j h_j folds like single adds (order-free).
    trajectories = _batch(random_grad, 3)
    acc = accumulators.grpo(len(REWARDS), 4, advantage="grpo", deterministic=True)
    state = acc.init(params)
    chunks = {}
    for k, r, g, n in trajectories:
        chunks.setdefault((k, r), []).append((g, n))
    for (k, r), items in reversed(list(chunks.items())):
        weights = [np.float32(acc.loss_weight(n)) for _, n in items]
        grad = jax.tree.map(
            lambda *gs, weights=weights: sum(w * x for w, x in zip(weights, gs, strict=True)),
            *[g for g, _ in items],
        )
        state = acc.add_weighted(state, k, r, grad, sum(n for _, n in items), len(items))
    for k in range(len(REWARDS)):
        state = acc.close(state, k)
    want = reference.grpo_gradient(trajectories, "grpo")
    assert reference.relative_error(acc.finalize(state), want) <= 1e-6


def test_affine_estimator_past_max_buckets_is_a_clear_error(params, random_grad):
    acc = accumulators.grpo(1, 4, advantage="grpo", max_buckets=2, deterministic=True)
    rng = np.random.default_rng(0)
    state = acc.init(params)
    state = acc.add(state, 0, 0.0, random_grad(rng), 3)
    state = acc.add(state, 0, 1.0, random_grad(rng), 3)
    with pytest.raises(ValueError, match=r"reward=2\.0 .*max_buckets=2; deterministic mode"):
        acc.add(state, 0, 2.0, random_grad(rng), 3)


def test_regularizer_terms_are_order_free(params, random_grad):
    policy = accumulators.grpo(len(REWARDS), 4, advantage="grpo", deterministic=True)
    acc = accumulators.combine(
        policy,
        kl=accumulators.regularizer(0.1),
        entropy=accumulators.regularizer(-0.01, loss_agg="token-mean"),
    )
    trajectories = _batch(random_grad, 11)
    rng = np.random.default_rng(11)
    kl = [random_grad(rng) for _ in trajectories]
    ent = [random_grad(rng) for _ in trajectories]
    outputs = []
    for _ in range(3):
        state = acc.init(params)
        for i in rng.permutation(len(trajectories)):
            k, r, g, n = trajectories[i]
            state = acc.add(state, k, r, g, n)
            state = acc.add_term(state, "kl", kl[i], n)
            state = acc.add_term(state, "entropy", ent[i], n)
        for k in range(len(REWARDS)):
            state = acc.close(state, k)
        outputs.append(acc.finalize(state))
    _assert_bitwise(outputs)
    items = [(g, t[3]) for g, t in zip(kl, trajectories, strict=True)]
    ent_items = [(g, t[3]) for g, t in zip(ent, trajectories, strict=True)]
    want = jax.tree.map(
        lambda a, b, c: a + b + c,
        reference.grpo_gradient(trajectories, "grpo"),
        reference.direct_gradient(items, 0.1, "seq-mean-token-mean"),
        reference.direct_gradient(ent_items, -0.01, "token-mean"),
    )
    assert reference.relative_error(outputs[0], want) <= 1e-6


def test_jitted_donated_adds_compile_once_and_equal_eager_bits(params, random_grad):
    acc = accumulators.grpo(len(REWARDS), 4, advantage=numpy_ranks, deterministic=True)
    traces = {"add": 0, "close": 0}

    def add(state, group, reward, grad, num_tokens):
        traces["add"] += 1  # runs only while tracing
        return acc.add(state, group, reward, grad, num_tokens)

    def close(state, group):
        traces["close"] += 1
        return acc.close(state, group)

    jit_add = jax.jit(add, donate_argnums=0)
    jit_close = jax.jit(close, donate_argnums=0)
    trajectories = _batch(random_grad, 13)
    order = np.random.default_rng(13).permutation(len(trajectories))
    state = replay(acc, params, trajectories, order, add=jit_add, close=jit_close)
    assert traces == {"add": 1, "close": 1}, traces
    acc.check(state)
    jitted = jax.jit(acc.finalize)(state)
    eager = acc.finalize(replay(acc, params, trajectories, order[::-1]))
    _assert_bitwise([jitted, eager])


def test_exact_overflow_is_recorded_not_wrapped(params, random_grad):
    from thundersync_jax.accumulators import _exact

    acc = accumulators.grpo(2, 2, advantage="grpo", deterministic=True)
    rng = np.random.default_rng(2)
    state = acc.init(params)
    # A total that already took MAX_ADDS adds has no headroom left for the next fold.
    full = state.total._replace(adds=np.int32(_exact.MAX_ADDS))
    state = state._replace(total=full)
    state = acc.add(state, 0, 1.0, random_grad(rng), 3)
    with pytest.raises(ValueError, match="exact tally overflowed while adding group 0"):
        acc.add(state, 0, 0.0, random_grad(rng), 3)
    # Under jit the same add is recorded: check raises and finalize is NaN.
    state = jax.jit(acc.add)(state, 0, 0.0, random_grad(rng), 3)
    state = acc.close(state, 1)
    with pytest.raises(ValueError, match="exact tally overflowed"):
        acc.check(state)
    assert all(np.isnan(leaf).all() for leaf in jax.tree.leaves(jax.jit(acc.finalize)(state)))
