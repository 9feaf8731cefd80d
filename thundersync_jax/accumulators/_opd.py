"""The `opd` factory: a single-tally accumulator, −(1/Z) Σ w_i · grad_i.

On-policy distillation's turn gradient is already weighted by the teacher's
per-token advantage Â_t, so nothing waits for other trajectories: every turn
adds straight into one global tally, and only Z (N tokens by default) waits
for the end of the batch. Errors follow `_grpo`: eager calls raise, jitted
calls record into `state.error` for `check`, and `finalize` returns NaN when
something was recorded.

Deterministic mode (`deterministic=True`): `total` is an exact fixed-point
tally (`_exact`), so finalize gives the same bits for any order of turns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _errors, _exact, _tallies
from thundersync_jax.accumulators._loss_agg import LossAgg, resolve_loss_agg


class OpdAccumulatorState(NamedTuple):
    """State of an `opd` accumulator.

    Attributes:
      total: float32 pytree like params, Σ w_i grad_i (deterministic mode: an
        `_exact.ExactSum` of int32 limbs holding the same sum exactly).
      num_trajectories: int32, turns (or trajectories) added.
      num_tokens: int32, scored tokens added.
      dropped: int32, inputs dropped by on_invalid="drop".
      error: int32, bitwise OR of error codes recorded under jit.
    """

    total: Any
    num_trajectories: jax.Array
    num_tokens: jax.Array
    dropped: jax.Array
    error: jax.Array


class OpdConfig(NamedTuple):
    """Static settings of an `opd` accumulator."""

    loss_agg: LossAgg
    max_len: int | None
    on_invalid: str
    deterministic: bool = False


class OpdAccumulator(NamedTuple):
    """Pure functions of an `opd` accumulator.

    Attributes:
      init: params -> OpdAccumulatorState.
      add: (state, grad, num_tokens) -> state.
      add_weighted: (state, grad, num_tokens, count) -> state, grad = Σ_j w_j grad_j.
      finalize: state -> −(1/Z) Σ w_i grad_i, float32, shaped like params.
      loss_weight: num_tokens -> w_i.
      check: (state, allow_open=False) -> None; raises what jit recorded.
      config: the resolved static settings.
    """

    init: Callable
    add: Callable
    add_weighted: Callable
    finalize: Callable
    loss_weight: Callable
    check: Callable
    config: OpdConfig


def _message(code: int) -> str:
    parts = []
    if code & _errors.NONFINITE_GRAD:
        parts.append("the gradient contains NaN or inf")
    if code & _errors.NEGATIVE_NUM_TOKENS:
        parts.append("num_tokens is negative")
    if code & _errors.BAD_COUNT:
        parts.append("count is < 1")
    if code & _errors.EXACT_OVERFLOW:
        parts.append(f"the exact tally is full (more than {_exact.MAX_ADDS} adds in one batch)")
    return "; ".join(parts) or f"error bits {code:#x}"


def tally_like(total):
    """What a grad must look like for `total` (a float32 tally or an exact one)."""
    return _exact.shapes_of(total) if isinstance(total, _exact.ExactSum) else total


@jax.jit
def add_to_total(total, grad, weight, ok):
    """total + w·grad where ok (exactly for an ExactSum); returns (total, overflow)."""
    if isinstance(total, _exact.ExactSum):
        values = jax.tree.map(lambda g: g.astype(jnp.float32) * weight, grad)
        return _exact.add(total, values, ok)
    total = jax.tree.map(
        lambda t, g: t + jnp.where(ok, g.astype(jnp.float32) * weight, 0.0), total, grad
    )
    return total, jnp.asarray(False)


@jax.jit
def total_value(total):
    """float32 value of a tally (an ExactSum is read out; a float32 tree is itself)."""
    return _exact.to_float(total) if isinstance(total, _exact.ExactSum) else total


def _add(cfg: OpdConfig, where: str, state, grad, num_tokens, count, weighted: bool):
    """One add (of `count` turns when `weighted`): errors recorded, or raised when eager."""
    _errors.check_structure(where, tally_like(state.total), grad)
    num_tokens = jnp.asarray(num_tokens, jnp.int32)
    count = jnp.asarray(count, jnp.int32)
    code = jnp.where(_errors.tree_all_finite(grad), 0, _errors.NONFINITE_GRAD)
    code |= jnp.where(num_tokens < 0, _errors.NEGATIVE_NUM_TOKENS, 0)
    code |= jnp.where(count < 1, _errors.BAD_COUNT, 0)
    ok = code == 0
    drop = ~ok & (cfg.on_invalid == "drop")
    weight = jnp.float32(1.0) if weighted else cfg.loss_agg.weight(num_tokens)
    total, overflow = add_to_total(state.total, grad, weight, ok)
    code |= jnp.where(overflow, _errors.EXACT_OVERFLOW, 0)
    ok &= ~overflow
    drop &= ~overflow
    new_state = OpdAccumulatorState(
        total=total,
        num_trajectories=state.num_trajectories + jnp.where(ok, count, 0),
        num_tokens=state.num_tokens + jnp.where(ok, num_tokens, 0),
        dropped=state.dropped + jnp.where(drop, jnp.maximum(count, 1), 0),
        error=state.error | jnp.where(ok | drop, 0, code),
    )
    if not _errors.is_traced(grad, num_tokens, count):
        if int(code) and cfg.on_invalid == "raise":
            leaf = _errors.first_nonfinite_leaf(grad)
            where_bad = f" (first bad leaf: {leaf})" if leaf else ""
            raise ValueError(
                f"{where}: {_message(int(code))}{where_bad}; num_tokens={int(num_tokens)}"
            )
    return new_state


def opd(
    loss_agg: str = "token-mean",
    max_len: int | None = None,
    *,
    on_invalid: str = "raise",
    deterministic: bool = False,
) -> OpdAccumulator:
    """On-policy distillation accumulator: finalize = −(1/N) Σ_turns grad (token-mean).

    Args:
      loss_agg: aggregation mode; the default divides by the batch's scored tokens.
      max_len: only for seq-mean-token-sum-norm.
      on_invalid: "raise", or "drop" to drop (and count) non-finite gradients.
      deterministic: add into an exactly associative tally, so the bits of
        finalize do not depend on the order of turns (DESIGN §8); over
        `_exact.MAX_ADDS` adds is recorded as an error.
    """
    if on_invalid not in _errors.ON_INVALID:
        raise ValueError(f"on_invalid must be one of {_errors.ON_INVALID}, got {on_invalid!r}")
    cfg = OpdConfig(resolve_loss_agg(loss_agg, max_len), max_len, on_invalid, deterministic)

    def init(params) -> OpdAccumulatorState:
        # Separate buffers per field: a donated state must not alias itself.
        counters = _tallies.on_mesh_of(params, [jnp.zeros((), jnp.int32) for _ in range(4)])
        if cfg.deterministic:
            return OpdAccumulatorState(_exact.zeros(params), *counters)
        return OpdAccumulatorState(_tallies.zeros_like_params(params), *counters)

    def add(state: OpdAccumulatorState, grad, num_tokens) -> OpdAccumulatorState:
        """Adds one turn's (Â-weighted) gradient and its scored-token count."""
        return _add(cfg, "add", state, grad, num_tokens, 1, False)

    def add_weighted(state: OpdAccumulatorState, grad, num_tokens, count) -> OpdAccumulatorState:
        """Adds `count` turns whose grad is already Σ_j w_j grad_j."""
        return _add(cfg, "add_weighted", state, grad, num_tokens, count, True)

    def check(state: OpdAccumulatorState, allow_open: bool = False) -> None:
        """Raises a ValueError for an error recorded under jit."""
        del allow_open  # no groups here; accepted for a uniform interface
        if int(state.error):
            detail = _message(int(state.error))
            raise ValueError(f"the accumulator recorded an invalid add: {detail}")

    def finalize(state: OpdAccumulatorState):
        """−(1/Z) Σ w_i grad_i, float32, shaped like params."""
        if not _errors.is_traced(state):
            check(state)
        z = cfg.loss_agg.normalizer(state.num_trajectories, state.num_tokens, cfg.max_len)
        z = jnp.where(z > 0, z, 1.0)
        total = total_value(state.total)
        bad = state.error != 0
        if cfg.deterministic:
            finite = _errors.tree_all_finite(total)
            if not _errors.is_traced(state) and not bool(finite):
                raise ValueError("finalize: the exact tally's value overflowed float32")
            bad |= ~finite
        return jax.tree.map(lambda t: jnp.where(bad, jnp.nan, -t / z), total)

    return OpdAccumulator(
        init, add, add_weighted, finalize, lambda n: cfg.loss_agg.weight(n), check, cfg
    )
