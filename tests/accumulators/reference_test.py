"""The float64 reference itself, on numbers a reader can check."""

import numpy as np

from thundersync_jax.accumulators import reference


def test_group_advantages_by_hand():
    np.testing.assert_allclose(
        reference.group_advantages([1, 3], "grpo", eps=0.0), [-1 / np.sqrt(2), 1 / np.sqrt(2)]
    )
    np.testing.assert_allclose(reference.group_advantages([1, 2, 6], "rloo"), [-3, -1.5, 4.5])
    np.testing.assert_allclose(reference.group_advantages([1, 2, 6], "drgrpo"), [-2, -1, 3])
    np.testing.assert_allclose(reference.group_advantages([4], "grpo"), [4 / (1 + 1e-6)])
    np.testing.assert_array_equal(reference.group_advantages([0.1] * 3, "grpo"), [0, 0, 0])


def test_grpo_gradient_by_hand():
    # One group {1, 0}, drgrpo: A = ±0.5; token-mean: Z = 2 + 2; grads e0, e1.
    trajs = [(0, 1.0, {"v": np.array([1.0, 0.0])}, 2), (0, 0.0, {"v": np.array([0.0, 1.0])}, 2)]
    got = reference.grpo_gradient(trajs, "drgrpo", "token-mean")
    np.testing.assert_allclose(got["v"], [-0.125, 0.125])
