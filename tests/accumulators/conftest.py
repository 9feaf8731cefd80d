"""Tiny parameter pytrees shared by the accumulator tests."""

import jax
import numpy as np
import pytest

# Prime, distinct dims so a transposed or mixed-up axis cannot go unnoticed.
SHAPES = {"w": (5, 3), "b": (7,), "blocks": [(2, 3)]}


def _is_shape(x):
    return isinstance(x, tuple)


@pytest.fixture
def params():
    """Zero float32 params with the test structure."""
    return jax.tree.map(lambda s: np.zeros(s, np.float32), SHAPES, is_leaf=_is_shape)


@pytest.fixture
def random_grad():
    """rng -> a random float32 score gradient shaped like `params`."""

    def make(rng: np.random.Generator):
        return jax.tree.map(
            lambda s: rng.normal(size=s).astype(np.float32), SHAPES, is_leaf=_is_shape
        )

    return make
