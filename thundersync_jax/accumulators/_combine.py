"""Composing a policy accumulator with regularizer terms (KL to reference, entropy).

A regularizer's loss, coef · (1/Z) Σ_i w_i Σ_t term_t, does not depend on the
group, so its gradient g_i goes straight into a global tally as soon as it is
computed. When the term aggregates like the policy (same loss_agg and
max_len, the usual case) it shares the policy's own tally and costs no memory;
a term with its own mode gets one extra tally, normalised at finalize with its
own Z from the policy's batch totals.

Deterministic mode: when the policy accumulator is deterministic, the terms
add exactly too (into the policy's exact `total`, or their own exact tally),
so the combined gradient's bits do not depend on arrival order either.

Loss convention: the combined gradient is ∇(L_policy + Σ coef · L_term), so a
KL penalty has coef = β > 0 and an entropy bonus coef = −α < 0 (the term's
gradient is that of the per-token entropy, summed over loss tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _errors, _exact, _tallies
from thundersync_jax.accumulators._loss_agg import resolve_loss_agg
from thundersync_jax.accumulators._opd import add_to_total, tally_like, total_value


class Regularizer(NamedTuple):
    """A term added to the policy loss.

    Attributes:
      coef: its coefficient in the loss.
      loss_agg: its aggregation mode; None means "as the policy".
      max_len: for seq-mean-token-sum-norm; None means "as the policy".
    """

    coef: float
    loss_agg: str | None = None
    max_len: int | None = None


def regularizer(coef: float, loss_agg: str | None = None, max_len: int | None = None):
    """A regularizer term (see `Regularizer`)."""
    return Regularizer(float(coef), loss_agg, max_len)


class CombinedState(NamedTuple):
    """State of a combined accumulator.

    Attributes:
      policy: the policy accumulator's state (its `total` also holds the
        regularizer terms that share the policy's aggregation).
      terms: name -> float32 tally like params, for terms with their own mode
        (an `_exact.ExactSum` when the policy is deterministic).
    """

    policy: Any
    terms: Mapping[str, Any]


class CombinedAccumulator(NamedTuple):
    """Pure functions of a combined accumulator.

    Attributes:
      init: params -> CombinedState.
      add, add_weighted, close: the policy's, applied to `state.policy` (same args).
      add_term: (state, name, grad, num_tokens) -> state; grad is the term's
        unweighted gradient for one trajectory (Σ_t ∇ term_t over its loss tokens).
      finalize: state -> ∇(L_policy + Σ coef · L_term).
      check: (state, allow_open=False) -> None.
      policy: the policy accumulator.
      terms: name -> Regularizer.
    """

    init: Callable
    add: Callable
    add_weighted: Callable
    close: Callable
    add_term: Callable
    finalize: Callable
    check: Callable
    policy: Any
    terms: Mapping[str, Regularizer]


def _term_error(name: str, grad, num_tokens):
    """The error code of one term's add (0 = fine); raised at once when called eagerly."""
    code = jnp.where(_errors.tree_all_finite(grad), 0, _errors.NONFINITE_GRAD)
    code |= jnp.where(num_tokens < 0, _errors.NEGATIVE_NUM_TOKENS, 0)
    if not _errors.is_traced(grad, num_tokens) and int(code):
        leaf = _errors.first_nonfinite_leaf(grad)
        raise ValueError(
            f"add_term({name!r}): gradient has non-finite values at {leaf} or "
            f"num_tokens={int(num_tokens)} is negative"
        )
    return code


def combine(policy, **terms: Regularizer) -> CombinedAccumulator:
    """Adds named regularizer terms to a policy accumulator (`grpo` or `opd`).

    Every trajectory added to the policy should get each term's `add_term` too
    (the terms are normalised with the policy's trajectory and token counts).
    """
    cfg = policy.config
    modes, shared = {}, {}
    for name, term in terms.items():
        if not isinstance(term, Regularizer):
            raise TypeError(f"term {name!r} must be accumulators.regularizer(...), got {term!r}")
        max_len = cfg.max_len if term.max_len is None else term.max_len
        mode = cfg.loss_agg if term.loss_agg is None else resolve_loss_agg(term.loss_agg, max_len)
        modes[name] = (mode, max_len)
        shared[name] = mode == cfg.loss_agg and max_len == cfg.max_len

    exact = bool(getattr(cfg, "deterministic", False))
    zeros = _exact.zeros if exact else _tallies.zeros_like_params

    def init(params) -> CombinedState:
        own = {n: zeros(params) for n in terms if not shared[n]}
        return CombinedState(policy.init(params), own)

    def add(state, *args, **kwargs):
        return state._replace(policy=policy.add(state.policy, *args, **kwargs))

    def add_weighted(state, *args, **kwargs):
        return state._replace(policy=policy.add_weighted(state.policy, *args, **kwargs))

    def close(state, *args, **kwargs):
        if not hasattr(policy, "close"):
            raise TypeError("the policy accumulator has no groups to close")
        return state._replace(policy=policy.close(state.policy, *args, **kwargs))

    def add_term(state: CombinedState, name: str, grad, num_tokens) -> CombinedState:
        """Adds one trajectory's gradient of term `name` straight into its global tally."""
        if name not in terms:
            raise ValueError(f"unknown term {name!r}; this accumulator has {sorted(terms)}")
        _errors.check_structure(f"add_term({name!r})", tally_like(state.policy.total), grad)
        num_tokens = jnp.asarray(num_tokens, jnp.int32)
        code = _term_error(name, grad, num_tokens)
        ok = code == 0
        mode, _ = modes[name]
        coef = terms[name].coef
        weight = mode.weight(num_tokens)
        # policy.finalize returns −total/Z, so a shared term enters as −coef · w · g.
        scale = -coef * weight if shared[name] else weight
        own = dict(state.terms)
        tally = state.policy.total if shared[name] else own[name]
        tally, overflow = add_to_total(tally, grad, scale, ok)
        code |= jnp.where(overflow, _errors.EXACT_OVERFLOW, 0)
        pol = state.policy._replace(error=state.policy.error | code)
        if shared[name]:
            return CombinedState(pol._replace(total=tally), state.terms)
        own[name] = tally
        return CombinedState(pol, own)

    def finalize(state: CombinedState):
        grads = policy.finalize(state.policy)
        b, n = state.policy.num_trajectories, state.policy.num_tokens
        for name, tally in state.terms.items():
            mode, max_len = modes[name]
            z = mode.normalizer(b, n, max_len)
            z = jnp.where(z > 0, z, 1.0)
            coef = terms[name].coef
            value = total_value(tally)
            grads = jax.tree.map(lambda g, t, z=z, coef=coef: g + coef * t / z, grads, value)
        return grads

    def check(state: CombinedState, allow_open: bool = False) -> None:
        policy.check(state.policy, allow_open)

    return CombinedAccumulator(
        init, add, add_weighted, close, add_term, finalize, check, policy, dict(terms)
    )
