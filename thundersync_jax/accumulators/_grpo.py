"""The `grpo` factory: streaming GRPO-family gradient accumulators (DESIGN §2, §5).

Errors: called eagerly, `add`, `add_weighted`, `close` and `finalize` raise a
`ValueError` naming the bad value. Under `jax.jit` they cannot raise; `add`
then skips the trajectory and records the problem in `state.error`, and
`finalize` returns NaN gradients when an error was recorded or a group is
still open. Call `acc.check(state)` on the host (after the jitted adds, before
the optimizer step) to raise the recorded error with the same message.

Deterministic mode (`deterministic=True`, DESIGN §8): the tallies add in an
exactly associative fixed-point representation (`_exact`) and every step is
order-free (`_exact_group_ops`), so `finalize` gives the same bits for any
order of adds and group closes: sync-like, group-like and stream-like
arrival all end at one result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from thundersync_jax.accumulators import (
    _callables,
    _errors,
    _exact,
    _exact_group_ops,
    _group_ops,
    _host,
)
from thundersync_jax.accumulators._advantages import GroupFn, resolve_advantage
from thundersync_jax.accumulators._group_state import (
    OPEN,
    GroupConfig,
    GroupState,
    init_state,
)
from thundersync_jax.accumulators._loss_agg import resolve_loss_agg


class GroupAccumulator(NamedTuple):
    """Pure functions of a GRPO-family accumulator (see `grpo`).

    Attributes:
      init: params -> GroupState (float32 tallies, sharded like params).
      add: (state, group, reward, grad, num_tokens) -> state, for one trajectory's
        unweighted score gradient h_i.
      add_weighted: (state, group, reward, grad, num_tokens, count) -> state, for a
        packed chunk of `count` trajectories of one (group, reward) whose `grad`
        is already Σ_j w_j h_j (w from `loss_weight`) and `num_tokens` = Σ_j n_j.
      close: (state, group) -> state; closes a short group (no-op if closed).
      finalize: state -> ∇L, float32, same structure as params.
      loss_weight: num_tokens -> w_i of the loss_agg mode.
      check: (state, allow_open=False) -> None; raises what jit recorded.
      config: the resolved static settings.
    """

    init: Callable
    add: Callable
    add_weighted: Callable
    close: Callable
    finalize: Callable
    loss_weight: Callable
    check: Callable
    config: GroupConfig


def _open_groups(state: GroupState) -> list[int]:
    return [int(k) for k in np.flatnonzero(np.asarray(state.status) == OPEN)]


def _message(cfg: GroupConfig, state: GroupState, code: int, group, reward, grad=None) -> str:
    text = _errors.describe(
        code,
        int(group),
        float(reward),
        num_groups=cfg.num_groups,
        group_size=cfg.group_size,
        max_open_groups=cfg.max_open_groups,
        max_buckets=cfg.max_buckets,
        deterministic=cfg.deterministic,
    )
    if code & _errors.NONFINITE_GRAD and grad is not None:
        text += f" (first bad leaf: {_errors.first_nonfinite_leaf(grad)})"
    if code & _errors.TOO_MANY_OPEN_GROUPS and grad is not None:  # eager: state is current
        text += f" (open groups: {_open_groups(state)})"
    return text


def _tally_like(state: GroupState):
    """Shapes of the params the state was made for (the exact tally's limbs add an axis)."""
    return (
        _exact.shapes_of(state.total) if isinstance(state.total, _exact.ExactSum) else state.total
    )


def _group_name(group) -> str:
    return "(traced)" if _errors.is_traced(group) else str(int(group))


def check(cfg: GroupConfig, state: GroupState, allow_open: bool = False) -> None:
    """Raises a ValueError for an error recorded under jit, or for open groups."""
    code = int(state.error)
    if code:
        detail = _message(cfg, state, code, state.error_group, state.error_reward)
        raise ValueError(f"the accumulator recorded an invalid add: {detail}")
    if not allow_open:
        still_open = _open_groups(state)
        if still_open:
            sizes = [int(state.members[k]) for k in still_open]
            raise ValueError(
                f"groups {still_open} are still open (members {sizes} of group_size="
                f"{cfg.group_size}); close short groups with acc.close(state, group) "
                "before finalize"
            )


def grpo(
    num_groups: int,
    group_size: int,
    advantage: str | GroupFn = "grpo",
    loss_agg: str = "seq-mean-token-mean",
    eps: float = 1e-6,
    std_ddof: int = 1,
    max_len: int | None = None,
    max_open_groups: int | None = None,
    *,
    max_buckets: int = 8,
    on_invalid: str = "raise",
    deterministic: bool = False,
    placement: str = "device",
) -> GroupAccumulator:
    """A streaming accumulator whose `finalize` equals the batch-synchronous GRPO gradient.

    Args:
      num_groups: K, prompts in the batch; groups are 0..K-1.
      group_size: G, members per group; a group closes by itself at G members.
      advantage: "grpo", "drgrpo", "rloo", "batch", another registered name, or a
        callable rewards -> advantages for one group (exact via reward buckets).
        A callable written with jax.numpy is traced into the add; one JAX cannot
        trace (numpy code: np.argsort ranks, a leave-one-out std) runs on the
        host in float64 through jax.pure_callback when its group folds, eagerly
        and under jit. Its output is checked at the fold: the wrong shape, NaN or
        inf, or different advantages for equal rewards is an error naming the group.
      loss_agg: "seq-mean-token-mean", "seq-mean-token-sum", "token-mean",
        "seq-mean-token-sum-norm" or another registered mode.
      eps: ε in (r − μ)/(σ + ε).
      std_ddof: 1 (Bessel, as verl) or 0.
      max_len: the Dr.GRPO normalizer's length (seq-mean-token-sum-norm only).
      max_open_groups: M, groups with live tallies at once (default K); memory is
        1 + 2M param-sized tallies (1 + max_buckets·M for non-affine estimators).
      max_buckets: distinct rewards per group a non-affine estimator can hold.
      on_invalid: "raise", or "drop" to drop (and count in state.dropped) a
        trajectory with a non-finite reward or gradient, a bad group, or negative
        num_tokens. The open-group and bucket limits always raise.
      deterministic: exactly associative tallies, so finalize's bits do not depend
        on the order of adds and closes (DESIGN §8). Every estimator then keeps
        one exact tally per (group, distinct reward) (`batch`: per distinct reward
        of the batch), so up to max_buckets distinct rewards per group (more is a
        clear error); memory is (1 + M·max_buckets)·5 int32 param-sized arrays
        (4 limbs and a window per element, see `_exact`). Accuracy ≤ ~1e-7 relative to
        float64; running out of headroom (over `_exact.MAX_ADDS` adds into one tally) or float32
        range is recorded as an error, never wrapped silently.
      placement: "device", or "host" to keep the parameter-sized tallies in the host
        memory of the params' devices (pinned where the platform has it, `_host`): each
        add computes w·h on the device and folds it into its slot on the host in one
        asynchronous program; finalize brings the global tally back. Not with
        deterministic=True.

    Errors: eager calls raise ValueError naming the bad value (non-finite reward
    or gradient leaf, group out of range, add to a closed group, more than
    max_open_groups open, more than max_buckets distinct rewards for a
    non-affine estimator, mismatched grad tree, finalize with open groups).
    Under jax.jit, add/close skip the bad trajectory and record the error in
    `state.error`; `acc.check(state)` raises it on the host, and `finalize`
    returns NaN gradients while an error is recorded or a group is open.

    Memory: with the state donated, a jitted add updates one slot of each
    tally stack in place (no param-sized temporaries; see _group_ops).
    """
    cfg = _group_config(
        num_groups,
        group_size,
        advantage,
        loss_agg,
        eps,
        std_ddof,
        max_len,
        max_open_groups,
        max_buckets,
        on_invalid,
        deterministic,
        placement,
    )
    return _accumulator(cfg)


def _group_config(
    num_groups,
    group_size,
    advantage,
    loss_agg,
    eps,
    std_ddof,
    max_len,
    max_open_groups,
    max_buckets,
    on_invalid,
    deterministic,
    placement,
) -> GroupConfig:
    """`grpo`'s arguments checked (ValueError naming the bad one) and resolved."""
    if num_groups < 1 or group_size < 1:
        raise ValueError(
            f"need num_groups >= 1 and group_size >= 1, got {num_groups} and {group_size}"
        )
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof must be 0 or 1, got {std_ddof!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if on_invalid not in _errors.ON_INVALID:
        raise ValueError(f"on_invalid must be one of {_errors.ON_INVALID}, got {on_invalid!r}")
    if max_open_groups is not None and max_open_groups < 1:
        raise ValueError(f"max_open_groups must be >= 1 or None, got {max_open_groups!r}")
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets!r}")
    _host.check_placement(placement)
    if placement == "host" and deterministic:
        raise ValueError(
            "placement='host' keeps float32 tallies; deterministic=True needs the exact "
            "int32-limb tallies on the device: use placement='device'"
        )
    if placement == "host":
        _host.host_memory_kind()  # fails now, naming the platform, if it has no host space
    resolved = resolve_advantage(advantage, group_size)
    batch_wide = deterministic and resolved.scope == "batch"
    cfg = GroupConfig(
        num_groups=num_groups,
        group_size=group_size,
        advantage=resolved,
        loss_agg=resolve_loss_agg(loss_agg, max_len),
        eps=float(eps),
        std_ddof=int(std_ddof),
        max_len=max_len,
        max_open_groups=min(max_open_groups or num_groups, num_groups),
        # A group cannot hold more distinct rewards than members (batch: than the batch).
        max_buckets=min(max_buckets, group_size * (num_groups if batch_wide else 1)),
        on_invalid=on_invalid,
        deterministic=bool(deterministic),
        placement=placement,
    )
    return cfg


def _accumulator(cfg: GroupConfig) -> GroupAccumulator:
    """The accumulator's functions over `cfg` (see `grpo`)."""
    ops = _exact_group_ops if cfg.deterministic else _group_ops

    def init(params) -> GroupState:
        return init_state(cfg, params)

    def _add(where, state, group, reward, grad, num_tokens, count, weighted):
        _errors.check_structure(where, _tally_like(state), grad)
        try:
            new_state, code = ops.add(
                cfg, state, group, reward, grad, num_tokens, count, weighted=weighted
            )
        except _callables.AdvantageShapeError as e:  # raised while tracing the callable
            raise ValueError(f"{where}: group {_group_name(group)}: {e}") from None
        if not _errors.is_traced(state, group, reward, grad, num_tokens, count):
            code = int(code)
            dropped = cfg.on_invalid == "drop" and not code & ~_errors.DROPPABLE
            if code and not dropped:
                raise ValueError(f"{where}: {_message(cfg, state, code, group, reward, grad)}")
        return new_state

    def add(state: GroupState, group, reward, grad, num_tokens) -> GroupState:
        """Adds one trajectory: its group, scalar reward, score gradient h_i, loss tokens n_i."""
        return _add("add", state, group, reward, grad, num_tokens, 1, False)

    def add_weighted(state: GroupState, group, reward, grad, num_tokens, count) -> GroupState:
        """Adds `count` trajectories of one (group, reward); grad = Σ_j w_j h_j."""
        return _add("add_weighted", state, group, reward, grad, num_tokens, count, True)

    def close(state: GroupState, group) -> GroupState:
        """Closes a group that will get no more members (idempotent)."""
        try:
            new_state, code = ops.close(cfg, state, group)
        except _callables.AdvantageShapeError as e:
            raise ValueError(f"close: group {_group_name(group)}: {e}") from None
        if not _errors.is_traced(state, group) and int(code):
            raise ValueError(f"close: {_message(cfg, state, int(code), group, 0.0)}")
        return new_state

    def finalize(state: GroupState):
        """∇L = −(1/Z) Σ_i A_i w_i h_i, float32, shaped like params."""
        if not _errors.is_traced(state):
            check(cfg, state)
        grads = ops.finalize(cfg, state)
        if cfg.deterministic and not _errors.is_traced(state):
            if not bool(_errors.tree_all_finite(grads)):
                raise ValueError(
                    "finalize: the exact tally's value overflowed float32 (a gradient sum "
                    "past ~3.4e38)"
                )
        return grads

    def loss_weight(num_tokens):
        """w_i of this accumulator's loss_agg mode."""
        return cfg.loss_agg.weight(num_tokens)

    def check_state(state: GroupState, allow_open: bool = False) -> None:
        """Raises what jitted adds recorded (and, unless allow_open, open groups)."""
        check(cfg, state, allow_open)

    return GroupAccumulator(init, add, add_weighted, close, finalize, loss_weight, check_state, cfg)
