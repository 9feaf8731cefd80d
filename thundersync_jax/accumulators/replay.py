"""Replaying a finished batch into an accumulator in a chosen arrival order.

The streaming side of the equivalence checks (tests, notebooks): each
trajectory is added when it "arrives", and a group with fewer than
`group_size` members is closed right after its last member, as a scheduler
does when the rest of the group failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Trajectory = tuple[int, float, Any, int]  # (group, reward, grad pytree h_i, num_tokens n_i)


def last_arrivals(trajectories: Sequence[Trajectory], order: Sequence[int]) -> dict[int, int]:
    """Position in `order` of each group's last member."""
    return {trajectories[i][0]: pos for pos, i in enumerate(order)}


def peak_open_groups(trajectories: Sequence[Trajectory], order: Sequence[int]) -> int:
    """Most groups open at once when every group closes at its last arrival."""
    last = last_arrivals(trajectories, order)
    open_now: set[int] = set()
    peak = 0
    for pos, i in enumerate(order):
        group = trajectories[i][0]
        open_now.add(group)
        peak = max(peak, len(open_now))
        if last[group] == pos:
            open_now.discard(group)
    return peak


def replay(
    acc,
    params,
    trajectories: Sequence[Trajectory],
    order: Sequence[int],
    add: Callable | None = None,
    close: Callable | None = None,
):
    """Streams `trajectories` into a fresh `acc` state in `order`; returns the state.

    Args:
      acc: a `grpo` accumulator.
      params: the params pytree the state is initialised for.
      trajectories: (group, reward, grad, num_tokens) tuples.
      order: a permutation of range(len(trajectories)), the arrival order.
      add, close: replacements for acc.add / acc.close (e.g. jitted versions).
    """
    add = add or acc.add
    close = close or acc.close
    sizes: dict[int, int] = {}
    for group, *_ in trajectories:
        sizes[group] = sizes.get(group, 0) + 1
    last = last_arrivals(trajectories, order)
    state = acc.init(params)
    for pos, i in enumerate(order):
        group, reward, grad, num_tokens = trajectories[i]
        state = add(state, group, reward, grad, num_tokens)
        if last[group] == pos and sizes[group] < acc.config.group_size:
            state = close(state, group)
    return state
