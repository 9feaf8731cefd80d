"""Pure state transitions of a GRPO-family accumulator: add, fold a group, finalize.

Every function here is jnp-only and traceable with group, reward, num_tokens
and count as tracers: decisions are masks, `jnp.where` and `lax.cond`. The
public wrappers in `_grpo.py` add eager validation on top.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _errors
from thundersync_jax.accumulators._advantages import bucket_advantages
from thundersync_jax.accumulators._group_state import CLOSED, NEW, OPEN, GroupConfig, GroupState


def cond(pred, true_fn, false_fn, operand):
    """`lax.cond` under a trace; a plain Python branch when `pred` is concrete.

    Eagerly, `lax.cond` would trace and compile both branches on every call
    (the closures are new each time), which made an eager add cost seconds.
    """
    if isinstance(pred, jax.core.Tracer):
        return jax.lax.cond(pred, true_fn, false_fn, operand)
    return true_fn(operand) if bool(pred) else false_fn(operand)


def record_error(cfg: GroupConfig, state: GroupState, code, group, reward, count) -> GroupState:
    """Counts a droppable problem as dropped (if asked) or records it in the state."""
    code = jnp.asarray(code, jnp.int32)
    if cfg.on_invalid == "drop":
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


def add(cfg: GroupConfig, state: GroupState, group, reward, grad, num_tokens, count, weighted):
    """Adds `count` trajectories of one (group, reward); returns (state, error code).

    `grad` is h_i (weighted=False, w_i applied here) or Σ_j w_j h_j (weighted=True).
    An invalid input leaves the tallies untouched and sets bits in the code.
    """
    k_groups, size = cfg.num_groups, cfg.group_size
    group = jnp.asarray(group, jnp.int32)
    reward = jnp.asarray(reward, jnp.float32)
    num_tokens = jnp.asarray(num_tokens, jnp.int32)
    count = jnp.asarray(count, jnp.int32)

    in_range = (group >= 0) & (group < k_groups)
    k = jnp.clip(group, 0, k_groups - 1)
    status, members = state.status[k], state.members[k]
    code = jnp.where(jnp.isfinite(reward), 0, _errors.NONFINITE_REWARD)
    code |= jnp.where(_errors.tree_all_finite(grad), 0, _errors.NONFINITE_GRAD)
    code |= jnp.where(in_range, 0, _errors.GROUP_OUT_OF_RANGE)
    closed = in_range & (status == CLOSED)
    code |= jnp.where(closed, _errors.GROUP_CLOSED, 0)
    overfull = (count < 1) | (members + count > size)
    code |= jnp.where(~closed & overfull, _errors.BAD_COUNT, 0)
    code |= jnp.where(num_tokens < 0, _errors.NEGATIVE_NUM_TOKENS, 0)

    if cfg.batch_scope:
        slot, need_slot = jnp.int32(0), jnp.asarray(False)
        shift_index, first = 0, state.num_trajectories == 0
    else:
        need_slot = status == NEW
        free = state.group_of_slot < 0
        slot = jnp.where(need_slot, jnp.argmax(free), jnp.maximum(state.slot_of_group[k], 0))
        code |= jnp.where(in_range & need_slot & ~jnp.any(free), _errors.TOO_MANY_OPEN_GROUPS, 0)
        shift_index, first = k, members == 0

    if not cfg.advantage.affine:
        nb = cfg.max_buckets
        used = state.bucket_used[slot]
        hit = (state.bucket_values[slot] == reward) & (jnp.arange(nb) < used)
        found = jnp.any(hit)
        bucket = jnp.where(found, jnp.argmax(hit), jnp.minimum(used, nb - 1))
        code |= jnp.where(~found & (used >= nb), _errors.TOO_MANY_DISTINCT_REWARDS, 0)

    ok = code == 0
    state = record_error(cfg, state, code, group, reward, count)

    weight = jnp.float32(1.0) if weighted else cfg.loss_agg.weight(num_tokens)
    # jnp.where, not multiplication by ok: a rejected grad may hold NaN, and NaN·0 = NaN.
    inc = jax.tree.map(lambda g: jnp.where(ok, g.astype(jnp.float32) * weight, 0.0), grad)
    shift = jnp.where(first, reward, state.shifts[shift_index])
    if cfg.advantage.affine:
        offset = jnp.where(ok, reward - shift, 0.0)
        state = state._replace(
            shifted=jax.tree.map(lambda t, x: t.at[slot].add(offset * x), state.shifted, inc),
            plain=jax.tree.map(lambda t, x: t.at[slot].add(x), state.plain, inc),
        )
    else:
        new_bucket = ok & ~found
        state = state._replace(
            buckets=jax.tree.map(lambda t, x: t.at[slot, bucket].add(x), state.buckets, inc),
            bucket_values=state.bucket_values.at[slot, bucket].set(
                jnp.where(new_bucket, reward, state.bucket_values[slot, bucket])
            ),
            bucket_used=state.bucket_used.at[slot].add(jnp.where(new_bucket, 1, 0)),
        )

    pos = jnp.arange(size)
    write = ok & (pos >= members) & (pos < members + count)
    take_slot = ok & need_slot
    added = jnp.where(ok, count, 0)
    status_now = state.status.at[k].set(jnp.where(ok, OPEN, status))
    state = state._replace(
        rewards=state.rewards.at[k].set(jnp.where(write, reward, state.rewards[k])),
        shifts=state.shifts.at[shift_index].set(jnp.where(ok, shift, state.shifts[shift_index])),
        members=state.members.at[k].add(added),
        status=status_now,
        slot_of_group=state.slot_of_group.at[k].set(
            jnp.where(take_slot, slot, state.slot_of_group[k])
        ),
        group_of_slot=state.group_of_slot.at[slot].set(
            jnp.where(take_slot, k, state.group_of_slot[slot])
        ),
        num_trajectories=state.num_trajectories + added,
        num_tokens=state.num_tokens + jnp.where(ok, num_tokens, 0),
        open_peak=jnp.maximum(state.open_peak, jnp.sum(status_now == OPEN).astype(jnp.int32)),
    )
    full = ok & (state.members[k] == size)
    state = cond(full, lambda s: close_group(cfg, s, k), lambda s: s, state)
    return state, code


def _fold_slot(cfg: GroupConfig, state: GroupState, k) -> GroupState:
    """Folds open group k's slot into `total` with its advantages and frees the slot."""
    slot = state.slot_of_group[k]
    row, n = state.rewards[k], state.members[k]
    members = jnp.arange(cfg.group_size) < n
    if cfg.advantage.affine:
        offsets = jnp.where(members, row - state.shifts[k], 0.0)
        scale, offset = cfg.advantage.fn(
            offsets, members, state.shifts[k], eps=cfg.eps, std_ddof=cfg.std_ddof
        )
        total = jax.tree.map(
            lambda t, r, h: t + (scale * r[slot] + offset * h[slot]),
            state.total,
            state.shifted,
            state.plain,
        )
        state = state._replace(
            total=total,
            shifted=jax.tree.map(lambda t: t.at[slot].set(0.0), state.shifted),
            plain=jax.tree.map(lambda t: t.at[slot].set(0.0), state.plain),
        )
    else:
        values = state.bucket_values[slot]
        in_use = jnp.arange(cfg.max_buckets) < state.bucket_used[slot]
        adv = jnp.where(in_use, bucket_advantages(cfg.advantage.fn, row, n, values), 0.0)
        total = jax.tree.map(
            lambda t, b: t + jnp.tensordot(adv, b[slot], axes=1), state.total, state.buckets
        )
        state = state._replace(
            total=total,
            buckets=jax.tree.map(lambda t: t.at[slot].set(0.0), state.buckets),
            bucket_used=state.bucket_used.at[slot].set(0),
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
    state = record_error(cfg, state, code, group, jnp.float32(0.0), 1)
    todo = in_range & (state.status[k] != CLOSED)
    return cond(todo, lambda s: close_group(cfg, s, k), lambda s: s, state), code


def finalize(cfg: GroupConfig, state: GroupState):
    """∇L = −(1/Z) · total; NaN everywhere when an error was recorded or a group is open."""
    total = state.total
    if cfg.batch_scope:
        members = jnp.arange(cfg.group_size)[None, :] < state.members[:, None]
        offsets = jnp.where(members, state.rewards - state.shifts[0], 0.0).reshape(-1)
        scale, offset = cfg.advantage.fn(
            offsets, members.reshape(-1), state.shifts[0], eps=cfg.eps, std_ddof=cfg.std_ddof
        )
        total = jax.tree.map(
            lambda t, r, h: t + (scale * r[0] + offset * h[0]), total, state.shifted, state.plain
        )
    z = cfg.loss_agg.normalizer(state.num_trajectories, state.num_tokens, cfg.max_len)
    z = jnp.where(z > 0, z, 1.0)  # empty batch: the gradient is zero, not 0/0
    bad = (state.error != 0) | jnp.any(state.status == OPEN)
    return jax.tree.map(lambda t: jnp.where(bad, jnp.nan, -t / z), total)
