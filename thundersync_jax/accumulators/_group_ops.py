"""Pure state transitions of a GRPO-family accumulator: add, fold a group, finalize.

Every function here is jnp-only and traceable with group, reward, num_tokens
and count as tracers: decisions are masks and `jnp.where` (no Python `if` on a
traced value, and no `lax.cond` over the tallies, see below). The public
wrappers in `_grpo.py` add eager validation on top.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _callables, _errors, _host, _tally_updates
from thundersync_jax.accumulators._advantages import affine_coefficients
from thundersync_jax.accumulators._group_state import CLOSED, NEW, OPEN, GroupConfig, GroupState


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
    fresh: jax.Array  # bool: the group just took a slot, whose stale contents must be zeroed
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
    plan = _Plan(ok, k, slot.astype(jnp.int32), bucket.astype(jnp.int32), offset, take_slot, full)
    return small, plan, code


@functools.partial(jax.jit, static_argnames="batch_scope")
def _release(small: GroupState, k, slot, close, *, batch_scope) -> GroupState:
    """Marks group k closed (if `close`) and frees its slot for the next group."""
    status = small.status.at[k].set(jnp.where(close, CLOSED, small.status[k]))
    if batch_scope:
        return small._replace(status=status)
    free = close & (small.slot_of_group[k] >= 0)
    small = small._replace(
        status=status,
        group_of_slot=small.group_of_slot.at[slot].set(
            jnp.where(free, -1, small.group_of_slot[slot])
        ),
        slot_of_group=small.slot_of_group.at[k].set(jnp.where(free, -1, small.slot_of_group[k])),
    )
    if small.bucket_used.shape[0]:
        used = small.bucket_used.at[slot].set(jnp.where(free, 0, small.bucket_used[slot]))
        small = small._replace(bucket_used=used)
    return small


def _affine_coefficients(cfg: GroupConfig, small: GroupState, k):
    """(scale, offset) of group k's members so far, in shifted coordinates."""
    members = jnp.arange(cfg.group_size) < small.members[k]
    offsets = jnp.where(members, small.rewards[k] - small.shifts[k], 0.0)
    coefficients = affine_coefficients(cfg.advantage.fn, cfg.eps, cfg.std_ddof)
    return coefficients(offsets, members, small.shifts[k])


def _bucket_advantages(cfg: GroupConfig, small: GroupState, k, slot, fold):
    """Advantage of each of group k's reward buckets (0 for unused) and the callable's code."""
    in_use = jnp.arange(cfg.max_buckets) < small.bucket_used[slot]
    adv, code = _callables.bucket_advantages(
        cfg.advantage.fn,
        cfg.advantage.host,
        small.rewards[k],
        small.members[k],
        small.bucket_values[slot],
        fold,
    )
    return jnp.where(in_use, adv, 0.0), code


def _small(state: GroupState) -> GroupState:
    """The state without its parameter-sized tallies (what the bookkeeping jit sees)."""
    return state._replace(total=None, shifted=None, plain=None, buckets=None)


def _tallies_into(
    small: GroupState,
    total,
    shifted=None,
    plain=None,
    buckets=None,
    *,
    like: GroupState,
    host: bool = False,
):
    tallies = dict(
        total=total,
        shifted=like.shifted if shifted is None else shifted,
        plain=like.plain if plain is None else plain,
        buckets=like.buckets if buckets is None else buckets,
    )
    if host:  # under jit, a tally passed through unchanged would come out in device memory
        tallies = _host.keep_on_host(tallies)
    return small._replace(**tallies)


def _apply(cfg: GroupConfig, state: GroupState, small: GroupState, grad, weight, plan: _Plan):
    """Adds w·grad to the planned tallies; a group that just filled up folds into total."""
    if cfg.advantage.affine:
        if cfg.batch_scope:  # one global pair, folded only at finalize
            fold, scale, shift = jnp.asarray(False), jnp.float32(0.0), jnp.float32(0.0)
        else:
            fold, (scale, shift) = plan.full, _affine_coefficients(cfg, small, plan.k)
        adv_code = jnp.int32(0)
        total, shifted, plain = _tally_updates.for_placement(cfg.placement).add_to_slot(
            state.total,
            state.shifted,
            state.plain,
            grad,
            plan.ok,
            weight,
            plan.offset,
            plan.slot,
            plan.fresh,
            fold,
            scale,
            shift,
        )
        tallies = dict(shifted=shifted, plain=plain)
    else:
        advantages, adv_code = _bucket_advantages(cfg, small, plan.k, plan.slot, plan.full)
        # A bad callable output folds nothing; the recorded error makes finalize NaN.
        small = record_error(cfg.on_invalid, small, adv_code, plan.k, 0.0, 1)
        total, buckets = _tally_updates.for_placement(cfg.placement).add_to_bucket(
            state.total,
            state.buckets,
            grad,
            plan.ok,
            weight,
            plan.slot,
            plan.bucket,
            plan.fresh,
            plan.full & (adv_code == 0),
            advantages,
        )
        tallies = dict(buckets=buckets)
    small = _release(small, plan.k, plan.slot, plan.full, batch_scope=cfg.batch_scope)
    return _tallies_into(small, total, **tallies, like=state, host=cfg.host), adv_code


def add(cfg: GroupConfig, state: GroupState, group, reward, grad, num_tokens, count, weighted):
    """Adds `count` trajectories of one (group, reward); returns (state, error code).

    `grad` is h_i (weighted=False, w_i applied here) or Σ_j w_j h_j (weighted=True).
    An invalid input leaves the tallies untouched and sets bits in the code. A
    group that reaches group_size folds into `total` in the same call.
    """
    group = jnp.asarray(group, jnp.int32)
    reward = jnp.asarray(reward, jnp.float32)
    num_tokens = jnp.asarray(num_tokens, jnp.int32)
    count = jnp.asarray(count, jnp.int32)
    small = _small(state)
    small, plan, code = _bookkeeping(
        small,
        group,
        reward,
        num_tokens,
        count,
        _errors.tree_all_finite(grad),
        batch_scope=cfg.batch_scope,
        affine=not cfg.uses_buckets,
        on_invalid=cfg.on_invalid,
    )
    weight = jnp.float32(1.0) if weighted else cfg.loss_agg.weight(num_tokens)
    new_state, adv_code = _apply(cfg, state, small, grad, weight, plan)
    return new_state, code | adv_code


def close(cfg: GroupConfig, state: GroupState, group) -> tuple[GroupState, jax.Array]:
    """Closes `group` early (idempotent on closed groups); returns (state, error code)."""
    group = jnp.asarray(group, jnp.int32)
    in_range = (group >= 0) & (group < cfg.num_groups)
    k = jnp.clip(group, 0, cfg.num_groups - 1)
    code = jnp.where(in_range, 0, _errors.GROUP_OUT_OF_RANGE).astype(jnp.int32)
    small = _small(state)
    small = record_error(cfg.on_invalid, small, code, group, jnp.float32(0.0), 1)
    fold = in_range & (small.status[k] != CLOSED)
    slot = jnp.maximum(small.slot_of_group[k], 0)
    if cfg.batch_scope:
        small = _release(small, k, slot, fold, batch_scope=True)
        return _tallies_into(small, state.total, like=state, host=cfg.host), code
    # A group that never got a member has no slot: close it without touching tallies.
    fold_tallies = fold & (small.slot_of_group[k] >= 0)
    if cfg.advantage.affine:
        scale, shift = _affine_coefficients(cfg, small, k)
        total = _tally_updates.for_placement(cfg.placement).fold_slot(
            state.total, state.shifted, state.plain, slot, fold_tallies, scale, shift
        )
    else:
        advantages, adv_code = _bucket_advantages(cfg, small, k, slot, fold_tallies)
        small = record_error(cfg.on_invalid, small, adv_code, k, jnp.float32(0.0), 1)
        code = code | adv_code
        fold_tallies = fold_tallies & (adv_code == 0)
        total = _tally_updates.for_placement(cfg.placement).fold_buckets(
            state.total, state.buckets, slot, fold_tallies, advantages
        )
    small = _release(small, k, slot, fold, batch_scope=False)
    return _tallies_into(small, total, like=state, host=cfg.host), code


def finalize(cfg: GroupConfig, state: GroupState):
    """∇L = −(1/Z) · total; NaN everywhere when an error was recorded or a group is open."""
    total, updates = state.total, _tally_updates.for_placement(cfg.placement)
    if cfg.batch_scope:
        members = jnp.arange(cfg.group_size)[None, :] < state.members[:, None]
        offsets = jnp.where(members, state.rewards - state.shifts[0], 0.0).reshape(-1)
        coefficients = affine_coefficients(cfg.advantage.fn, cfg.eps, cfg.std_ddof)
        scale, offset = coefficients(offsets, members.reshape(-1), state.shifts[0])
        total = updates.batch_total(total, state.shifted, state.plain, scale, offset)
    elif cfg.host:  # only the global tally comes back to the device, once per step
        total = _host.to_device(total)
    z = cfg.loss_agg.normalizer(state.num_trajectories, state.num_tokens, cfg.max_len)
    z = jnp.where(z > 0, z, 1.0)  # empty batch: the gradient is zero, not 0/0
    bad = (state.error != 0) | jnp.any(state.status == OPEN)
    return _negate_and_normalize(total, z, bad)


@jax.jit
def _negate_and_normalize(total, z, bad):
    """−total/Z, or NaN everywhere when `bad` (so a missed check cannot pass silently)."""
    return jax.tree.map(lambda t: jnp.where(bad, jnp.nan, -t / z), total)
