"""The batch totals a normaliser Z reads, and a state that carries other (global) totals.

Data-parallel learner processes (DESIGN §7) each fold only their own groups, so each
accumulator state counts only its own trajectories B_p and tokens N_p. The gradient of the
whole batch is Σ_p −(1/Z(B, N)) total_p with the GLOBAL B = Σ B_p and N = Σ N_p:

    b, n = accumulators.batch_totals(state)                     # this process's counts
    grads_p = acc.finalize(accumulators.with_batch_totals(state, B, N))
    grads = Σ_p grads_p                                          # one cross-process sum

Every finalize (grpo, its exact mode, opd, combine) computes Z from the state's
`num_trajectories` / `num_tokens` (a combined state: its policy state's), so replacing
those two counts is the whole change; per-group advantages need nothing else. The `batch`
advantage normalises over every reward of the batch, which one process does not hold: its
states are refused here (`batch_scope`), and the loop refuses it with several processes.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from thundersync_jax.accumulators._combine import CombinedState


def _counted(state: Any) -> Any:
    """The state holding the counts: a combined state's policy state, else the state."""
    inner = state.policy if isinstance(state, CombinedState) else state
    if not hasattr(inner, "num_trajectories") or not hasattr(inner, "num_tokens"):
        raise TypeError(
            f"{type(inner).__name__} has no num_trajectories/num_tokens: pass an accumulator "
            "state (GroupState, DirectState or CombinedState)"
        )
    return inner


def batch_totals(state: Any) -> tuple[int, int]:
    """(trajectories, loss tokens) this state has folded in, as Python ints."""
    inner = _counted(state)
    return int(inner.num_trajectories), int(inner.num_tokens)


def with_batch_totals(state: Any, num_trajectories: int, num_tokens: int) -> Any:
    """`state` whose normaliser sees `num_trajectories` and `num_tokens` (e.g. the global ones).

    Raises ValueError for counts below this state's own, which cannot be batch totals.
    """
    inner = _counted(state)
    own_b, own_n = batch_totals(state)
    if int(num_trajectories) < own_b or int(num_tokens) < own_n:
        raise ValueError(
            f"batch totals num_trajectories={num_trajectories}, num_tokens={num_tokens} are "
            f"below this state's own ({own_b}, {own_n}): pass the sums over every process"
        )
    if _is_batch_scope(inner):
        raise ValueError(
            "the `batch` advantage normalises over every reward of the batch: its state "
            "cannot be finalized with another process's totals; use a per-group estimator"
        )
    counts = dict(
        num_trajectories=jnp.asarray(num_trajectories, jnp.int32),
        num_tokens=jnp.asarray(num_tokens, jnp.int32),
    )
    if isinstance(state, CombinedState):
        return state._replace(policy=inner._replace(**counts))
    return state._replace(**counts)


def _is_batch_scope(inner: Any) -> bool:
    # A batch-scope GroupState keeps one shift for the whole batch (shape [1]).
    shifts = getattr(inner, "shifts", None)
    rewards = getattr(inner, "rewards", None)
    return shifts is not None and rewards is not None and shifts.shape[0] != rewards.shape[0]
