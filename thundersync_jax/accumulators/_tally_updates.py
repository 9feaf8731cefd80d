"""The parameter-sized updates of a GRPO-family state, on the device or on the host.

`_group_ops` decides what an add or close does (the bookkeeping); the four functions here
apply it to the tallies. `DEVICE` runs them where the tallies are (device memory);
`HOST` computes the increment w·h on the device, copies it to host memory and runs the same
update there (`_host`), for tallies in host memory (`placement="host"`).

Tally updates are written so XLA keeps the donated [M, ...] stacks in place: within one
step a stack is only written (scatter-add / scatter-multiply into one slot) and then
read, never read and then written. A lax.cond fold, or zeroing a slot right after
reading it, made XLA copy every stack (2M tallies of temporaries per add, measured
with memory_analysis on CPU). So folding only *reads* a slot into `total`, and a
freed slot is zeroed when the next group takes it ("fresh").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax.accumulators import _host


def _map_leaves(fn, num_outputs: int, *trees):
    """Applies fn leaf-wise to trees shaped like the first; returns num_outputs trees."""
    treedef = jax.tree.structure(trees[0])
    leaves = [treedef.flatten_up_to(tree) for tree in trees]
    outs = [fn(*xs) for xs in zip(*leaves, strict=True)]
    return tuple(treedef.unflatten([out[i] for out in outs]) for i in range(num_outputs))


def increment(grad, ok, weight):
    # jnp.where, not multiplication by ok: a rejected grad may hold NaN, and NaN·0 = NaN.
    return jax.tree.map(lambda g: jnp.where(ok, g.astype(jnp.float32) * weight, 0.0), grad)


def _keep(fresh):
    return jnp.where(fresh, 0.0, 1.0)


def _if_fold(fold, coefficients):
    """The fold's coefficients, exact zeros when not folding (masked on the device)."""
    return jax.tree.map(lambda c: jnp.where(fold, c, 0.0), coefficients)


# The updates below get their coefficients already masked, so the same function runs on
# either memory space (a host computation cannot mix in device-memory constants).


def _slot_update(total, shifted, plain, inc, offset, slot, keep, scale, shift):
    """R'[slot] = keep·R'[slot] + (r − c)·x, H[slot] = keep·H[slot] + x, then the fold.

    total += scale·R'[slot] + shift·H[slot] (scale = shift = 0 unless the group folds now).
    """

    def one(t, r, h, x):
        r = r.at[slot].multiply(keep).at[slot].add(offset * x)
        h = h.at[slot].multiply(keep).at[slot].add(x)
        return t + (scale * r[slot] + shift * h[slot]), r, h

    return _map_leaves(one, 3, total, shifted, plain, inc)


def _bucket_sum(advantages, b, slot):
    # Unrolled over buckets: a tensordot over b[slot] made XLA copy the bucket stack.
    return sum(advantages[j] * b[slot, j] for j in range(b.shape[1]))


def _bucket_update(total, buckets, inc, slot, bucket, keep, advantages):
    """B[slot] = keep·B[slot], B[slot, bucket] += x; total += Σ_j A_j·B[slot, j]."""

    def one(t, b, x):
        b = b.at[slot].multiply(keep).at[slot, bucket].add(x)
        return t + _bucket_sum(advantages, b, slot), b

    return _map_leaves(one, 2, total, buckets, inc)


def _slot_fold(total, shifted, plain, slot, scale, shift):
    """total += scale·R'[slot] + shift·H[slot] (the slot is zeroed on reuse)."""
    return jax.tree.map(
        lambda t, r, h: t + (scale * r[slot] + shift * h[slot]), total, shifted, plain
    )


def _bucket_fold(total, buckets, slot, advantages):
    """total += Σ_j A_j·B[slot, j] (the slot is zeroed on reuse)."""
    return jax.tree.map(lambda t, b: t + _bucket_sum(advantages, b, slot), total, buckets)


def _batch_fold(total, shifted, plain, scale, offset):
    """The batch scope's one pair folded into total at finalize."""
    return jax.tree.map(lambda t, r, h: t + (scale * r[0] + offset * h[0]), total, shifted, plain)


class TallyUpdates(NamedTuple):
    """The tally updates of one placement (argument order as the functions above).

    Attributes:
      add_to_slot: (total, shifted, plain, grad, ok, weight, offset, slot, fresh, fold,
        scale, shift) -> (total, shifted, plain).
      add_to_bucket: (total, buckets, grad, ok, weight, slot, bucket, fresh, fold,
        advantages) -> (total, buckets).
      fold_slot: (total, shifted, plain, slot, fold, scale, shift) -> total.
      fold_buckets: (total, buckets, slot, fold, advantages) -> total.
      batch_total: (total, shifted, plain, scale, offset) -> total on the device (eager or
        inlined: the device path has always computed it so).
    """

    add_to_slot: Callable
    add_to_bucket: Callable
    fold_slot: Callable
    fold_buckets: Callable
    batch_total: Callable


def _updates(run: Callable) -> TallyUpdates:
    """The five updates, each masking on the device and running its tally math via `run`."""

    def add_to_slot(
        total, shifted, plain, grad, ok, weight, offset, slot, fresh, fold, scale, shift
    ):
        scale, shift = _if_fold(fold, (scale, shift))
        inc = increment(grad, ok, weight)
        return run(_slot_update)(
            total, shifted, plain, inc, offset, slot, _keep(fresh), scale, shift
        )

    def add_to_bucket(total, buckets, grad, ok, weight, slot, bucket, fresh, fold, advantages):
        inc = increment(grad, ok, weight)
        advantages = _if_fold(fold, advantages)
        return run(_bucket_update)(total, buckets, inc, slot, bucket, _keep(fresh), advantages)

    def fold_slot(total, shifted, plain, slot, fold, scale, shift):
        scale, shift = _if_fold(fold, (scale, shift))
        return run(_slot_fold)(total, shifted, plain, slot, scale, shift)

    def fold_buckets(total, buckets, slot, fold, advantages):
        return run(_bucket_fold)(total, buckets, slot, _if_fold(fold, advantages))

    return TallyUpdates(
        add_to_slot=jax.jit(add_to_slot),
        add_to_bucket=jax.jit(add_to_bucket),
        fold_slot=jax.jit(fold_slot),
        fold_buckets=jax.jit(fold_buckets),
        batch_total=_batch_fold,
    )


DEVICE = _updates(lambda update: update)
# On the host the increment w·h is made on the device (the one params-sized copy per add);
# `on_host` moves it and the masked scalars to host memory and runs the update there.
_HOST = _updates(_host.on_host)
# The batch scope has one slot: its pair comes back with the global tally, same math.
HOST = _HOST._replace(batch_total=lambda *args: _batch_fold(*_host.to_device(args)))


def for_placement(placement: str) -> TallyUpdates:
    return HOST if placement == "host" else DEVICE
