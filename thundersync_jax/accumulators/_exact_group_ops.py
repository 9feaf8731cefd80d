"""Deterministic-mode transitions of a GRPO-family accumulator (DESIGN §8).

The same bookkeeping as `_group_ops`, but every float that reaches the
result is a function of the batch's *multiset* of trajectories, never of
their arrival order or of which group closed first:

* every estimator keeps one exact tally (`_exact.ExactSum`) per (group,
  distinct reward) bucket: Σ w_i h_i adds exactly, so the bucket's integer
  limbs are the same for any order of its members;
* the shifted tally R' of the fast path is not used: its shift, the group's
  first reward, depends on arrival order;
* advantages are computed from the group's rewards *sorted*, so the float
  arithmetic of the estimator runs on the same array whatever the order (an
  affine estimator is evaluated per bucket from its scale/offset, with the
  group's smallest reward as shift);
* a folding group contributes Σ_j A_j · value(B_j) summed in increasing
  reward order, and that float32 contribution adds exactly into `total`,
  so the order in which groups close does not matter either;
* `batch` scope keeps batch-wide buckets and folds them at `finalize`.

Functions are jnp-only and traceable; `add`, `close` and `finalize` are
jitted once per static config (eagerly, one dispatch per call).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _callables, _errors, _exact
from thundersync_jax.accumulators._advantages import affine_coefficients
from thundersync_jax.accumulators._group_ops import (
    _bookkeeping,
    _release,
    _small,
    _tallies_into,
    record_error,
)
from thundersync_jax.accumulators._group_state import CLOSED, OPEN, GroupConfig, GroupState


def _sorted_rewards(rewards, mask):
    """Members' rewards in increasing order (padding +inf at the end), and their count."""
    count = jnp.sum(mask.astype(jnp.int32))
    ordered = jnp.sort(jnp.where(mask, rewards, jnp.inf))
    return ordered, count


def _bucket_advantages(cfg: GroupConfig, rewards, mask, bucket_values, used, fold):
    """Order-free advantages of the buckets [nb] (0 when unused) and the callable's code."""
    ordered, count = _sorted_rewards(rewards, mask)
    members = jnp.arange(ordered.shape[0]) < count
    if cfg.advantage.affine:
        shift = jnp.where(count > 0, ordered[0], 0.0)  # the smallest reward: order-free
        offsets = jnp.where(members, ordered - shift, 0.0)
        coefficients = affine_coefficients(cfg.advantage.fn, cfg.eps, cfg.std_ddof)
        scale, offset = coefficients(offsets, members, shift)
        adv, code = scale * (bucket_values - shift) + offset, jnp.int32(0)
    else:
        member_rewards = jnp.where(members, ordered, 0.0)
        adv, code = _callables.bucket_advantages(
            cfg.advantage.fn, cfg.advantage.host, member_rewards, count, bucket_values, fold
        )
    in_use = jnp.arange(bucket_values.shape[0]) < used
    return jnp.where(in_use, adv, 0.0), code


def _fold(total: _exact.ExactSum, buckets: _exact.ExactSum, slot, values, used, adv, fold):
    """total += Σ_j A_j · value(B[slot, j]), the sum in increasing reward order; exact add."""
    nb = values.shape[0]
    in_use = jnp.arange(nb) < used
    order = jnp.argsort(jnp.where(in_use, values, jnp.inf))
    adv_sorted, used_sorted = adv[order], in_use[order]

    def contribution(cells):
        sums = _exact.stack_to_float(cells[slot])[order]
        # jnp.where, not a product with 0: an unused bucket must not bring NaN·0.
        return sum(jnp.where(used_sorted[j], adv_sorted[j] * sums[j], 0.0) for j in range(nb))

    def fold_now(total):
        parts = jax.tree.map(contribution, buckets.limbs)
        finite = _errors.tree_all_finite(parts)
        total, overflow = _exact.add(total, parts, finite)
        return total, jnp.where(~finite | overflow, _errors.EXACT_OVERFLOW, 0).astype(jnp.int32)

    # lax.cond: most adds do not close their group, and the read-out of the slot's
    # buckets plus the exact add into total cost several adds' worth of work.
    return jax.lax.cond(fold, fold_now, lambda total: (total, jnp.int32(0)), total)


def _fold_group(cfg: GroupConfig, small: GroupState, total, buckets, k, slot, fold):
    """Folds group k's buckets (slot) into total when `fold`; returns (small, total, code)."""
    mask = jnp.arange(cfg.group_size) < small.members[k]
    values, used = small.bucket_values[slot], small.bucket_used[slot]
    adv, code = _bucket_advantages(cfg, small.rewards[k], mask, values, used, fold)
    total, fold_code = _fold(total, buckets, slot, values, used, adv, fold & (code == 0))
    code = code | fold_code
    small = record_error(cfg.on_invalid, small, code, k, jnp.float32(0.0), 1)
    return small, total, code


def _spec(cfg: GroupConfig) -> GroupConfig:
    """The static part the jitted bodies depend on: one compilation for every loss_agg mode."""
    return cfg._replace(loss_agg=None, max_len=None)


def add(cfg: GroupConfig, state: GroupState, group, reward, grad, num_tokens, count, weighted):
    """Adds `count` trajectories of one (group, reward) exactly; returns (state, error code)."""
    num_tokens = jnp.asarray(num_tokens, jnp.int32)
    weight = jnp.float32(1.0) if weighted else cfg.loss_agg.weight(num_tokens)
    return _add(_spec(cfg), state, group, reward, grad, num_tokens, count, weight)


@functools.partial(jax.jit, static_argnames="cfg")
def _add(cfg: GroupConfig, state: GroupState, group, reward, grad, num_tokens, count, weight):
    group = jnp.asarray(group, jnp.int32)
    reward = jnp.asarray(reward, jnp.float32)
    count = jnp.asarray(count, jnp.int32)
    weight = jnp.asarray(weight, jnp.float32)
    small, plan, code = _bookkeeping(
        _small(state),
        group,
        reward,
        num_tokens,
        count,
        _errors.tree_all_finite(grad),
        batch_scope=cfg.batch_scope,
        affine=False,
        on_invalid=cfg.on_invalid,
    )
    inc = jax.tree.map(lambda g: jnp.where(plan.ok, g.astype(jnp.float32) * weight, 0.0), grad)
    # A bucket's first member empties it (stale limbs of the slot's previous group).
    new_bucket = plan.bucket >= jnp.where(plan.fresh, 0, state.bucket_used[plan.slot])
    index = (plan.slot, plan.bucket)
    buckets, overflow = _exact.add(state.buckets, inc, plan.ok, index, fresh=new_bucket)
    overflow_code = jnp.where(overflow, _errors.EXACT_OVERFLOW, 0).astype(jnp.int32)
    small = record_error(cfg.on_invalid, small, overflow_code, group, reward, count)
    total = state.total
    if not cfg.batch_scope:  # batch-wide buckets fold only at finalize
        small, total, fold_code = _fold_group(
            cfg, small, total, buckets, plan.k, plan.slot, plan.full
        )
        overflow_code |= fold_code
    small = _release(small, plan.k, plan.slot, plan.full, batch_scope=cfg.batch_scope)
    return _tallies_into(small, total, buckets=buckets, like=state), code | overflow_code


def close(cfg: GroupConfig, state: GroupState, group) -> tuple[GroupState, jax.Array]:
    """Closes `group` early (idempotent); returns (state, error code)."""
    return _close(_spec(cfg), state, group)


@functools.partial(jax.jit, static_argnames="cfg")
def _close(cfg: GroupConfig, state: GroupState, group) -> tuple[GroupState, jax.Array]:
    group = jnp.asarray(group, jnp.int32)
    in_range = (group >= 0) & (group < cfg.num_groups)
    k = jnp.clip(group, 0, cfg.num_groups - 1)
    code = jnp.where(in_range, 0, _errors.GROUP_OUT_OF_RANGE).astype(jnp.int32)
    small = record_error(cfg.on_invalid, _small(state), code, group, jnp.float32(0.0), 1)
    fold = in_range & (small.status[k] != CLOSED)
    slot = jnp.maximum(small.slot_of_group[k], 0)
    total = state.total
    if not cfg.batch_scope:
        # A group that never got a member has no slot: close it without touching tallies.
        has_slot = fold & (small.slot_of_group[k] >= 0)
        small, total, fold_code = _fold_group(cfg, small, total, state.buckets, k, slot, has_slot)
        code = code | fold_code
    small = _release(small, k, slot, fold, batch_scope=cfg.batch_scope)
    return _tallies_into(small, total, like=state), code


def finalize(cfg: GroupConfig, state: GroupState):
    """∇L = −(1/Z) · value(total); NaN everywhere on a recorded error, open group or overflow."""
    z = cfg.loss_agg.normalizer(state.num_trajectories, state.num_tokens, cfg.max_len)
    return _finalize(_spec(cfg), state, jnp.asarray(z, jnp.float32))


@functools.partial(jax.jit, static_argnames="cfg")
def _finalize(cfg: GroupConfig, state: GroupState, z):
    total, code = state.total, jnp.int32(0)
    if cfg.batch_scope:
        mask = (jnp.arange(cfg.group_size)[None, :] < state.members[:, None]).reshape(-1)
        values, used = state.bucket_values[0], state.bucket_used[0]
        adv, _ = _bucket_advantages(cfg, state.rewards.reshape(-1), mask, values, used, True)
        total, code = _fold(total, state.buckets, 0, values, used, adv, jnp.asarray(True))
    value = _exact.to_float(total)
    z = jnp.where(z > 0, z, 1.0)  # empty batch: the gradient is zero, not 0/0
    bad = (state.error != 0) | jnp.any(state.status == OPEN) | (code != 0)
    bad |= ~_errors.tree_all_finite(value)
    return jax.tree.map(lambda t: jnp.where(bad, jnp.nan, -t / z), value)
