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

Deterministic mode (DESIGN §8): a float sum of the processes' partial gradients would
depend on how groups were split between processes. Instead the processes sum their exact
tallies (`exact_tallies`, stacked over processes and summed by `sum_exact_tallies`) and
every process finalizes the SAME global tally (`with_exact_tallies`): the bits of the
one-process run that folded every group, whatever P.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from thundersync_jax.accumulators import _exact
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


def exact_tallies(state: Any) -> dict[str, _exact.ExactSum] | None:
    """The exact tallies finalize reads ({"total": ..., "term/NAME": ...}); None if not exact.

    `total` holds every folded group's contribution (and the regularizer terms that share
    the policy's aggregation); a combined state's own-mode terms come as "term/NAME".
    """
    inner = _counted(state)
    if not isinstance(getattr(inner, "total", None), _exact.ExactSum):
        return None
    tallies = {"total": inner.total}
    if isinstance(state, CombinedState):
        tallies.update({f"term/{name}": t for name, t in state.terms.items()})
    return tallies


def sum_exact_tallies(stacked: dict[str, _exact.ExactSum]) -> dict[str, _exact.ExactSum]:
    """Exact sums of `exact_tallies` stacked on a leading [P] axis (traceable: the
    cross-process reduce of `learner.replicas.make_cross_process_sum`)."""
    return {key: _exact.sum_stacked(tally) for key, tally in stacked.items()}


def with_exact_tallies(state: Any, tallies: dict[str, _exact.ExactSum]) -> Any:
    """`state` finalizing `tallies` (e.g. the sums over every process) instead of its own.

    Raises ValueError for a key `exact_tallies(state)` does not have, and when a summed
    tally took more than `_exact.MAX_ADDS` adds (its integer limbs may have wrapped).
    """
    own = exact_tallies(state)
    if own is None or set(tallies) != set(own):
        raise ValueError(
            f"exact tallies {sorted(tallies)} do not match this state's "
            f"{None if own is None else sorted(own)}: pass `exact_tallies(state)` summed"
        )
    for key, tally in tallies.items():
        adds = int(jnp.max(tally.adds))
        if adds > _exact.MAX_ADDS:
            raise ValueError(
                f"exact tally {key!r} holds {adds} adds summed over processes, past "
                f"_exact.MAX_ADDS={_exact.MAX_ADDS}: its limbs may have wrapped; use "
                "smaller batches per step"
            )
    inner = _counted(state)._replace(total=tallies["total"])
    if isinstance(state, CombinedState):
        terms = {name: tallies[f"term/{name}"] for name in state.terms}
        return state._replace(policy=inner, terms=terms)
    return inner
