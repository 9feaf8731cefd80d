"""Researchers add estimators and aggregation modes by name, without touching the core."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import replay


def _half_centered(offsets, mask, shift, *, eps, std_ddof):
    """A = (r − μ)/2 as (scale, offset) on shifted rewards: scale 1/2, offset −mean(d)/2."""
    del shift, eps, std_ddof
    mean = jnp.sum(jnp.where(mask, offsets, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
    return jnp.float32(0.5), -0.5 * mean


def _register_once():
    if "half-centered" not in accumulators.advantage_names():
        accumulators.register_advantage("half-centered", _half_centered, affine=True)
        accumulators.register_advantage("median-centered", lambda r: r - jnp.median(r))
    if "sum-over-ten" not in accumulators.loss_agg_names():
        accumulators.register_loss_agg(
            "sum-over-ten", lambda n: jnp.float32(1.0), lambda b, n, max_len: jnp.float32(10.0)
        )


def _trajectories(random_grad):
    rng = np.random.default_rng(0)
    return [
        (k, float(r), random_grad(rng), int(rng.integers(1, 9)))
        for k, rewards in enumerate([[0, 1, 3], [2, 2, 7], [4]])
        for r in rewards
    ]


def test_registered_affine_estimator(params, random_grad):
    _register_once()
    trajectories = _trajectories(random_grad)
    acc = accumulators.grpo(3, 3, advantage="half-centered")
    state = replay(acc, params, trajectories, [4, 0, 6, 1, 5, 2, 3])
    want = reference.grpo_gradient(trajectories, lambda r: 0.5 * (r - r.mean()))
    assert reference.relative_error(acc.finalize(state), want) < 1e-5


def test_registered_bucketed_estimator_and_loss_agg(params, random_grad):
    _register_once()
    trajectories = _trajectories(random_grad)
    acc = accumulators.grpo(3, 3, advantage="median-centered", loss_agg="sum-over-ten")
    state = replay(acc, params, trajectories, [6, 0, 3, 1, 4, 2, 5])
    coefficients = reference.grpo_gradient(
        trajectories, lambda r: r - np.median(r), "seq-mean-token-sum"
    )
    want = jax.tree.map(lambda v: v * len(trajectories) / 10, coefficients)  # Z = 10, not B
    assert reference.relative_error(acc.finalize(state), want) < 1e-5


def test_registering_a_taken_name_raises():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        accumulators.register_advantage("grpo", _half_centered, affine=True)
    with pytest.raises(ValueError, match="'token-mean' is already registered"):
        accumulators.register_loss_agg("token-mean", lambda n: n, lambda b, n, m: b)
