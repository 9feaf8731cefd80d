"""The batch totals a normaliser Z reads, and a state that carries other (global) totals.

Data-parallel learner processes (DESIGN §7) each fold only their own groups, so each
accumulator state counts only its own trajectories B_p and tokens N_p. The gradient of the
whole batch is Σ_p −(1/Z(B, N)) total_p with the GLOBAL B = Σ B_p and N = Σ N_p:

    b, n = accumulators.batch_totals(state)                     # this process's counts
    grads_p = acc.finalize(accumulators.with_batch_totals(state, B, N))
    grads = Σ_p grads_p                                          # one cross-process sum

Every finalize (grpo, its exact mode, opd, combine) computes Z from the state's
`num_trajectories` / `num_tokens` (a combined state: its policy state's), so replacing
those two counts is the whole change; per-group advantages need nothing else.

The `batch` advantage normalises over every reward of the batch, which one process does not
hold. Its state keeps the batch's rewards ([K, G], rows of this process's groups) and member
counts; the processes exchange those (K·G + K scalars: other processes' rows are zero, so the
sum over processes is the batch's) and each finalizes with them:

    rewards, members = accumulators.batch_rewards(state)        # None, None: per-group scope
    state = accumulators.with_batch_totals(state, B, N, Σ_p rewards_p, Σ_p members_p)

Finalize then computes the batch-wide mean and std from every reward, in coordinates shifted
by this process's own first reward c_p (its tallies hold Σ (r − c_p) w h and Σ w h), so
each process's A_i = a·(r_i − c_p) + b_p is the one-process advantage exactly in real
arithmetic (float32 rounding differs by the shift only).

Deterministic mode (DESIGN §8): a float sum of the processes' partial gradients would
depend on how groups were split between processes. Instead the processes sum their exact
tallies (`exact_tallies`, stacked over processes and summed by `sum_exact_tallies`) and
every process finalizes the SAME global tally (`with_exact_tallies`): the bits of the
one-process run that folded every group, whatever P.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from thundersync_jax.accumulators import _exact
from thundersync_jax.accumulators._combine import CombinedState


def _counted(state: Any) -> Any:
    """The state holding the counts: a combined state's policy state, else the state."""
    inner = state.policy if isinstance(state, CombinedState) else state
    if not hasattr(inner, "num_trajectories") or not hasattr(inner, "num_tokens"):
        raise TypeError(
            f"{type(inner).__name__} has no num_trajectories/num_tokens: pass an accumulator "
            "state (GroupState, OpdAccumulatorState or CombinedState)"
        )
    return inner


def batch_totals(state: Any) -> tuple[int, int]:
    """(trajectories, loss tokens) this state has folded in, as Python ints."""
    inner = _counted(state)
    return int(inner.num_trajectories), int(inner.num_tokens)


def batch_rewards(state: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A `batch`-scope state's rewards (float32 [K, G]) and members (int32 [K]); else (None, None).

    Rows of groups this state never saw are zero, so summing over processes gives the batch's.
    """
    inner = _counted(state)
    if not _is_batch_scope(inner):
        return None, None
    return np.asarray(inner.rewards, np.float32), np.asarray(inner.members, np.int32)


def with_batch_totals(
    state: Any,
    num_trajectories: int,
    num_tokens: int,
    rewards: np.ndarray | None = None,
    members: np.ndarray | None = None,
) -> Any:
    """`state` whose normaliser sees `num_trajectories` and `num_tokens` (e.g. the global ones).

    A `batch`-scope state also needs the batch's `rewards` [K, G] and `members` [K] (the sums
    over processes of `batch_rewards`); per-group states take none.

    Raises ValueError for counts below this state's own, which cannot be batch totals, for a
    batch-scope state without rewards or with rewards that disagree with its own groups, and
    for rewards given to a per-group state.
    """
    inner = _counted(state)
    own_b, own_n = batch_totals(state)
    if int(num_trajectories) < own_b or int(num_tokens) < own_n:
        raise ValueError(
            f"batch totals num_trajectories={num_trajectories}, num_tokens={num_tokens} are "
            f"below this state's own ({own_b}, {own_n}): pass the sums over every process"
        )
    counts = dict(
        num_trajectories=jnp.asarray(num_trajectories, jnp.int32),
        num_tokens=jnp.asarray(num_tokens, jnp.int32),
    )
    if _is_batch_scope(inner):
        counts.update(_global_rewards(inner, num_trajectories, rewards, members))
    elif rewards is not None or members is not None:
        raise ValueError(
            "rewards/members are for the `batch` advantage's state; this state's advantages "
            "are per group and need only the counts"
        )
    if isinstance(state, CombinedState):
        return state._replace(policy=inner._replace(**counts))
    return state._replace(**counts)


def _global_rewards(inner, num_trajectories, rewards, members) -> dict:
    if rewards is None or members is None:
        raise ValueError(
            "the `batch` advantage normalises over every reward of the batch: pass the "
            "batch's rewards and members (Σ over processes of accumulators.batch_rewards)"
        )
    rewards = np.asarray(rewards, np.float32)
    members = np.asarray(members, np.int32)
    own_rewards, own_members = batch_rewards(inner)
    if rewards.shape != own_rewards.shape or members.shape != own_members.shape:
        raise ValueError(
            f"batch rewards {rewards.shape} / members {members.shape} must have the state's "
            f"shapes {own_rewards.shape} / {own_members.shape}"
        )
    mine = own_members > 0
    if np.any(members[mine] != own_members[mine]) or np.any(rewards[mine] != own_rewards[mine]):
        raise ValueError(
            f"batch rewards disagree with this state's own groups {np.flatnonzero(mine).tolist()}:"
            " pass the sum over processes, whose groups are disjoint"
        )
    if int(members.sum()) != int(num_trajectories):
        raise ValueError(
            f"batch members sum to {int(members.sum())} but num_trajectories="
            f"{num_trajectories}: pass the same batch's totals"
        )
    return dict(rewards=jnp.asarray(rewards), members=jnp.asarray(members))


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
