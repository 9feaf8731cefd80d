"""Memory bounds: at most 1 + 2M tallies (1 + buckets·M), slot reuse, clear errors past them."""

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import replay


def _param_sized_tallies(state, params) -> float:
    size = sum(np.size(p) for p in jax.tree.leaves(params))
    tallies = (state.total, state.shifted, state.plain, state.buckets)
    return sum(np.size(t) for t in jax.tree.leaves(tallies)) / size


@pytest.mark.parametrize("cap", [1, 2, None])
def test_affine_state_holds_one_plus_two_m_tallies(params, cap):
    acc = accumulators.grpo(5, 4, max_open_groups=cap)
    m = cap or 5
    assert _param_sized_tallies(acc.init(params), params) == 1 + 2 * m


def test_batch_estimator_holds_three_tallies(params):
    acc = accumulators.grpo(5, 4, advantage="batch")
    assert _param_sized_tallies(acc.init(params), params) == 3


def test_callable_state_holds_one_plus_buckets_times_m(params):
    acc = accumulators.grpo(
        5, 4, advantage=lambda r: r - r.mean(), max_open_groups=2, max_buckets=3
    )
    assert _param_sized_tallies(acc.init(params), params) == 1 + 3 * 2


def test_one_slot_serves_groups_one_after_another(params, random_grad):
    rng = np.random.default_rng(0)
    trajectories = [
        (k, float(r), random_grad(rng), int(rng.integers(1, 9)))
        for k, rewards in enumerate([[0, 1, 1], [3, 3, 1], [2], [5, 4, 0]])
        for r in rewards
    ]
    acc = accumulators.grpo(4, 3, advantage="rloo", max_open_groups=1)
    state = replay(acc, params, trajectories, range(len(trajectories)))
    assert int(state.open_peak) == 1
    want = reference.grpo_gradient(trajectories, "rloo")
    assert reference.relative_error(acc.finalize(state), want) < 1e-5


def test_too_many_open_groups_raises_naming_them(params, random_grad):
    rng = np.random.default_rng(1)
    acc = accumulators.grpo(4, 2, max_open_groups=2)
    state = acc.init(params)
    state = acc.add(state, 0, 1.0, random_grad(rng), 3)
    state = acc.add(state, 3, 1.0, random_grad(rng), 3)
    with pytest.raises(ValueError, match=r"max_open_groups=2.*open groups: \[0, 3\]"):
        acc.add(state, 1, 1.0, random_grad(rng), 3)
    state = acc.close(state, 3)  # frees a slot
    acc.add(state, 1, 1.0, random_grad(rng), 3)


def test_callable_past_bucket_limit_raises(params, random_grad):
    rng = np.random.default_rng(2)
    acc = accumulators.grpo(1, 4, advantage=lambda r: r - r.mean(), max_buckets=2)
    state = acc.init(params)
    state = acc.add(state, 0, 0.0, random_grad(rng), 3)
    state = acc.add(state, 0, 1.0, random_grad(rng), 3)
    state = acc.add(state, 0, 1.0, random_grad(rng), 3)  # an existing bucket
    with pytest.raises(ValueError, match=r"reward=2.0 would be distinct reward number 3"):
        acc.add(state, 0, 2.0, random_grad(rng), 3)


def test_affine_estimators_have_no_bucket_limit(params, random_grad):
    rng = np.random.default_rng(3)
    acc = accumulators.grpo(1, 12, advantage="grpo", max_buckets=2)
    trajectories = [(0, float(r), random_grad(rng), 5) for r in range(12)]
    state = replay(acc, params, trajectories, range(12))
    want = reference.grpo_gradient(trajectories, "grpo")
    assert reference.relative_error(acc.finalize(state), want) < 1e-5


@pytest.mark.parametrize("advantage", ["grpo", "batch", "callable"])
def test_jitted_add_and_close_update_tallies_in_place(advantage):
    # With the state donated, XLA must not copy the [M, ...] tally stacks: temporaries
    # stay below one parameter-sized tally (a lax.cond fold used to copy all 2M of them).
    params = {"w": np.zeros((257, 263), np.float32)}
    estimator = (lambda r: r - r.mean()) if advantage == "callable" else advantage
    acc = accumulators.grpo(6, 3, advantage=estimator, max_open_groups=3)
    state = acc.init(params)
    tally_bytes = params["w"].nbytes
    for fn, args in [(acc.add, (state, 1, 0.5, params, 3)), (acc.close, (state, 1))]:
        compiled = jax.jit(fn, donate_argnums=0).lower(*args).compile()
        assert compiled.memory_analysis().temp_size_in_bytes < tally_bytes
