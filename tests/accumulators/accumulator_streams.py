"""Shared helpers for the accumulator tests: tiny pytrees and streamed batches."""

from __future__ import annotations

import jax
import numpy as np

# Prime, distinct dims so a transposed or mixed-up axis cannot go unnoticed.
SHAPES = {"w": (5, 3), "b": (7,), "blocks": [(2, 3)]}


def params_like(dtype=np.float32):
    """Zero params with the test structure."""
    return jax.tree.map(
        lambda s: np.zeros(s, dtype), SHAPES, is_leaf=lambda x: isinstance(x, tuple)
    )


def random_grad(rng: np.random.Generator, dtype=np.float32):
    """A random score gradient shaped like the params."""
    return jax.tree.map(
        lambda s: rng.normal(size=s).astype(dtype), SHAPES, is_leaf=lambda x: isinstance(x, tuple)
    )


def last_arrivals(trajectories, order) -> dict[int, int]:
    """Position in `order` of each group's last member."""
    last = {}
    for pos, i in enumerate(order):
        last[trajectories[i][0]] = pos
    return last


def peak_open_groups(trajectories, order) -> int:
    """Most groups open at once when each group closes at its last arrival."""
    last = last_arrivals(trajectories, order)
    open_now, peak = set(), 0
    for pos, i in enumerate(order):
        group = trajectories[i][0]
        open_now.add(group)
        peak = max(peak, len(open_now))
        if last[group] == pos:
            open_now.discard(group)
    return peak


def stream(acc, params, trajectories, order, add=None, close=None):
    """Adds trajectories in `order`; closes each short group right after its last member."""
    add = add or acc.add
    close = close or acc.close
    group_size = acc.config.group_size
    sizes: dict[int, int] = {}
    for group, *_ in trajectories:
        sizes[group] = sizes.get(group, 0) + 1
    last = last_arrivals(trajectories, order)
    state = acc.init(params)
    for pos, i in enumerate(order):
        group, reward, grad, num_tokens = trajectories[i]
        state = add(state, group, reward, grad, num_tokens)
        if last[group] == pos and sizes[group] < group_size:
            state = close(state, group)
    return state
