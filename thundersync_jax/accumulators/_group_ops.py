"""Pure state transitions of a GRPO-family accumulator: add, fold a group, finalize.

Every function here is jnp-only and traceable with group, reward, num_tokens
and count as tracers: decisions are masks, `jnp.where` and `lax.cond`. The
public wrappers in `_grpo.py` add eager validation on top.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _errors
from thundersync_jax.accumulators._advantages import affine_coefficients, bucket_advantages
from thundersync_jax.accumulators._group_state import CLOSED, NEW, OPEN, GroupConfig, GroupState


def cond(pred, true_fn, false_fn, operand):
    """`lax.cond` under a trace; a plain Python branch when `pred` is concrete.

    Eagerly, `lax.cond` would trace and compile both branches on every call
    (the closures are new each time), which made an eager add cost seconds.
    """
    if isinstance(pred, jax.core.Tracer):
        return jax.lax.cond(pred, true_fn, false_fn, operand)
    return true_fn(operand) if bool(pred) else false_fn(operand)


def record_error(on_invalid: str, state: GroupState, code, group, reward, count) -> GroupState:
    """Counts a droppable problem as dropped (if asked) or records it in the state."""
    code = jnp.asarray(code, jnp.int32)
    if on_invalid == "drop":
        drop = (code != 0) & ((code & ~_errors.DROPPABLE) == 0)
    else:
        drop = jnp.asarray(False)
    record = (code != 0) & ~drop
    first = record & (state.error == 0)
    return state._replace(
        dropped=state.dropped + jnp.where(drop, jnp.maximum(count, 1), 0),
        error=state.error | jnp.where(record, code, 0),
        error_group=jnp.where(first, group, state.error_group),
        error_reward=jnp.where(first, reward, state.error_reward),
    )


class _Plan(NamedTuple):
    """Where one add goes, decided by the bookkeeping."""

    ok: jax.Array  # bool: apply the add
    k: jax.Array  # int32: the group's row (clipped)
    slot: jax.Array  # int32: tally slot
    bucket: jax.Array  # int32: reward bucket (non-affine estimators)
    offset: jax.Array  # float32: r − c_k, 0 when rejected
    full: jax.Array  # bool: the group reached group_size and must fold


# The small, config-independent pieces below are jitted once per shape and flag set
# and shared by every accumulator: eagerly, op-by-op dispatch of ~130 small ops
# per add cost tens of milliseconds; under an outer jit they simply inline.


@functools.partial(jax.jit, static_argnames=("batch_scope", "affine", "on_invalid"))
def _bookkeeping(
    small: GroupState, group, reward, num_tokens, count, grad_ok, *, batch_scope, affine, on_invalid
) -> tuple[GroupState, _Plan, jax.Array]:
    """Validates one add and updates everything but the tallies; returns (small, plan, code)."""
    k_groups, size = small.rewards.shape
    in_range = (group >= 0) & (group < k_groups)
    k = jnp.clip(group, 0, k_groups - 1)
    status, members = small.status[k], small.members[k]
    code = jnp.where(jnp.isfinite(reward), 0, _errors.NONFINITE_REWARD)
    code |= jnp.where(grad_ok, 0, _errors.NONFINITE_GRAD)
    code |= jnp.where(in_range, 0, _errors.GROUP_OUT_OF_RANGE)
    closed = in_range & (status == CLOSED)
    code |= jnp.where(closed, _errors.GROUP_CLOSED, 0)
    overfull = (count < 1) | (members + count > size)
    code |= jnp.where(~closed & overfull, _errors.BAD_COUNT, 0)
    code |= jnp.where(num_tokens < 0, _errors.NEGATIVE_NUM_TOKENS, 0)

    if batch_scope:
        slot, need_slot = jnp.int32(0), jnp.asarray(False)
        shift_index, first = 0, small.num_trajectories == 0
    else:
        need_slot = status == NEW
        free = small.group_of_slot < 0
        slot = jnp.where(need_slot, jnp.argmax(free), jnp.maximum(small.slot_of_group[k], 0))
        code |= jnp.where(in_range & need_slot & ~jnp.any(free), _errors.TOO_MANY_OPEN_GROUPS, 0)
        shift_index, first = k, members == 0

    bucket = jnp.int32(0)
    if not affine:
        nb = small.bucket_values.shape[1]
        used = small.bucket_used[slot]
        hit = (small.bucket_values[slot] == reward) & (jnp.arange(nb) < used)
        found = jnp.any(hit)
        bucket = jnp.where(found, jnp.argmax(hit), jnp.minimum(used, nb - 1))
        code |= jnp.where(~found & (used >= nb), _errors.TOO_MANY_DISTINCT_REWARDS, 0)

    ok = code == 0
    small = record_error(on_invalid, small, code, group, reward, count)
    shift = jnp.where(first, reward, small.shifts[shift_index])
    if not affine:
        new_bucket = ok & ~found
        small = small._replace(
            bucket_values=small.bucket_values.at[slot, bucket].set(
                jnp.where(new_bucket, reward, small.bucket_values[slot, bucket])
            ),
            bucket_used=small.bucket_used.at[slot].add(jnp.where(new_bucket, 1, 0)),
        )

    pos = jnp.arange(size)
    write = ok & (pos >= members) & (pos < members + count)
    take_slot = ok & need_slot
    added = jnp.where(ok, count, 0)
    status_now = small.status.at[k].set(jnp.where(ok, OPEN, status))
    small = small._replace(
        rewards=small.rewards.at[k].set(jnp.where(write, reward, small.rewards[k])),
        shifts=small.shifts.at[shift_index].set(jnp.where(ok, shift, small.shifts[shift_index])),
        members=small.members.at[k].add(added),
        status=status_now,
        slot_of_group=small.slot_of_group.at[k].set(
            jnp.where(take_slot, slot, small.slot_of_group[k])
        ),
        group_of_slot=small.group_of_slot.at[slot].set(
            jnp.where(take_slot, k, small.group_of_slot[slot])
        ),
        num_trajectories=small.num_trajectories + added,
        num_tokens=small.num_tokens + jnp.where(ok, num_tokens, 0),
        open_peak=jnp.maximum(small.open_peak, jnp.sum(status_now == OPEN).astype(jnp.int32)),
    )
    full = ok & (small.members[k] == size)
    offset = jnp.where(ok, reward - shift, 0.0)
    return small, _Plan(ok, k, slot.astype(jnp.int32), bucket.astype(jnp.int32), offset, full), code


def _increment(grad, ok, weight):
    # jnp.where, not multiplication by ok: a rejected grad may hold NaN, and NaN·0 = NaN.
    return jax.tree.map(lambda g: jnp.where(ok, g.astype(jnp.float32) * weight, 0.0), grad)


@jax.jit
def _add_to_slot(shifted, plain, grad, ok, weight, offset, slot):
    """R'[slot] += (r − c)·w·h and H[slot] += w·h, leaf by leaf."""
    inc = _increment(grad, ok, weight)
    shifted = jax.tree.map(lambda t, x: t.at[slot].add(offset * x), shifted, inc)
    plain = jax.tree.map(lambda t, x: t.at[slot].add(x), plain, inc)
    return shifted, plain


@jax.jit
def _add_to_bucket(buckets, grad, ok, weight, slot, bucket):
    """B[slot, bucket] += w·h, leaf by leaf."""
    inc = _increment(grad, ok, weight)
    return jax.tree.map(lambda t, x: t.at[slot, bucket].add(x), buckets, inc)


@jax.jit
def _fold_affine(total, shifted, plain, scale, offset, slot):
    """total += scale·R'[slot] + offset·H[slot]; the slot's tallies are zeroed."""
    total = jax.tree.map(
        lambda t, r, h: t + (scale * r[slot] + offset * h[slot]), total, shifted, plain
    )
    shifted = jax.tree.map(lambda t: t.at[slot].set(0.0), shifted)
    plain = jax.tree.map(lambda t: t.at[slot].set(0.0), plain)
    return total, shifted, plain


@jax.jit
def _fold_buckets(total, buckets, advantages, slot):
    """total += Σ_j A_j·B[slot, j]; the slot's buckets are zeroed."""
    total = jax.tree.map(
        lambda t, b: t + jnp.tensordot(advantages, b[slot], axes=1), total, buckets
    )
    return total, jax.tree.map(lambda t: t.at[slot].set(0.0), buckets)


def add(cfg: GroupConfig, state: GroupState, group, reward, grad, num_tokens, count, weighted):
    """Adds `count` trajectories of one (group, reward); returns (state, error code).

    `grad` is h_i (weighted=False, w_i applied here) or Σ_j w_j h_j (weighted=True).
    An invalid input leaves the tallies untouched and sets bits in the code.
    """
    group = jnp.asarray(group, jnp.int32)
    reward = jnp.asarray(reward, jnp.float32)
    num_tokens = jnp.asarray(num_tokens, jnp.int32)
    count = jnp.asarray(count, jnp.int32)
    small = state._replace(total=None, shifted=None, plain=None, buckets=None)
    small, plan, code = _bookkeeping(
        small,
        group,
        reward,
        num_tokens,
        count,
        _errors.tree_all_finite(grad),
        batch_scope=cfg.batch_scope,
        affine=cfg.advantage.affine,
        on_invalid=cfg.on_invalid,
    )
    weight = jnp.float32(1.0) if weighted else cfg.loss_agg.weight(num_tokens)
    state = small._replace(
        total=state.total, shifted=state.shifted, plain=state.plain, buckets=state.buckets
    )
    if cfg.advantage.affine:
        shifted, plain = _add_to_slot(
            state.shifted, state.plain, grad, plan.ok, weight, plan.offset, plan.slot
        )
        state = state._replace(shifted=shifted, plain=plain)
    else:
        buckets = _add_to_bucket(state.buckets, grad, plan.ok, weight, plan.slot, plan.bucket)
        state = state._replace(buckets=buckets)
    state = cond(plan.full, lambda s: close_group(cfg, s, plan.k), lambda s: s, state)
    return state, code


def _fold_slot(cfg: GroupConfig, state: GroupState, k) -> GroupState:
    """Folds open group k's slot into `total` with its advantages and frees the slot."""
    slot = state.slot_of_group[k]
    row, n = state.rewards[k], state.members[k]
    members = jnp.arange(cfg.group_size) < n
    if cfg.advantage.affine:
        offsets = jnp.where(members, row - state.shifts[k], 0.0)
        coefficients = affine_coefficients(cfg.advantage.fn, cfg.eps, cfg.std_ddof)
        scale, offset = coefficients(offsets, members, state.shifts[k])
        total, shifted, plain = _fold_affine(
            state.total, state.shifted, state.plain, scale, offset, slot
        )
        state = state._replace(total=total, shifted=shifted, plain=plain)
    else:
        values = state.bucket_values[slot]
        in_use = jnp.arange(cfg.max_buckets) < state.bucket_used[slot]
        adv = jnp.where(in_use, bucket_advantages(cfg.advantage.fn, row, n, values), 0.0)
        total, buckets = _fold_buckets(state.total, state.buckets, adv, slot)
        state = state._replace(
            total=total, buckets=buckets, bucket_used=state.bucket_used.at[slot].set(0)
        )
    return state._replace(
        group_of_slot=state.group_of_slot.at[slot].set(-1),
        slot_of_group=state.slot_of_group.at[k].set(-1),
    )


def close_group(cfg: GroupConfig, state: GroupState, k) -> GroupState:
    """Marks group k closed; an open group's tallies fold into `total` (group scope)."""
    if not cfg.batch_scope:
        has_slot = state.slot_of_group[k] >= 0
        state = cond(has_slot, lambda s: _fold_slot(cfg, s, k), lambda s: s, state)
    return state._replace(status=state.status.at[k].set(CLOSED))


def close(cfg: GroupConfig, state: GroupState, group) -> tuple[GroupState, jax.Array]:
    """Closes `group` early (idempotent on closed groups); returns (state, error code)."""
    group = jnp.asarray(group, jnp.int32)
    in_range = (group >= 0) & (group < cfg.num_groups)
    k = jnp.clip(group, 0, cfg.num_groups - 1)
    code = jnp.where(in_range, 0, _errors.GROUP_OUT_OF_RANGE).astype(jnp.int32)
    state = record_error(cfg.on_invalid, state, code, group, jnp.float32(0.0), 1)
    todo = in_range & (state.status[k] != CLOSED)
    return cond(todo, lambda s: close_group(cfg, s, k), lambda s: s, state), code


def finalize(cfg: GroupConfig, state: GroupState):
    """∇L = −(1/Z) · total; NaN everywhere when an error was recorded or a group is open."""
    total = state.total
    if cfg.batch_scope:
        members = jnp.arange(cfg.group_size)[None, :] < state.members[:, None]
        offsets = jnp.where(members, state.rewards - state.shifts[0], 0.0).reshape(-1)
        coefficients = affine_coefficients(cfg.advantage.fn, cfg.eps, cfg.std_ddof)
        scale, offset = coefficients(offsets, members.reshape(-1), state.shifts[0])
        total = jax.tree.map(
            lambda t, r, h: t + (scale * r[0] + offset * h[0]), total, state.shifted, state.plain
        )
    z = cfg.loss_agg.normalizer(state.num_trajectories, state.num_tokens, cfg.max_len)
    z = jnp.where(z > 0, z, 1.0)  # empty batch: the gradient is zero, not 0/0
    bad = (state.error != 0) | jnp.any(state.status == OPEN)
    return _negate_and_normalize(total, z, bad)


@jax.jit
def _negate_and_normalize(total, z, bad):
    """−total/Z, or NaN everywhere when `bad` (so a missed check cannot pass silently)."""
    return jax.tree.map(lambda t: jnp.where(bad, jnp.nan, -t / z), total)
