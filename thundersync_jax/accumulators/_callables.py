"""Group-wise advantage callables: traced with JAX, or run on the host when written in numpy.

A researcher's estimator `f(rewards) -> advantages` for one group may be
jax.numpy code (traced into the accumulator's jitted add, as any jnp op) or
plain numpy (np.argsort ranks, a leave-one-out std), which JAX cannot trace.
The latter runs on the host through `jax.pure_callback` in float64, only when
its group folds, so it works eagerly and under jit alike.

Either way the output is checked when the group folds: the wrong shape, a NaN
or inf, or different advantages for equal rewards (not group-wise, so reward
buckets could not be exact) set an error bit naming the group instead of
silently changing the update.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from thundersync_jax.accumulators import _errors


class AdvantageShapeError(ValueError):
    """A traced advantage callable returned the wrong shape (found while tracing)."""


def is_traceable(fn: Callable, size: int) -> bool:
    """Whether JAX can trace and lower `fn` on a [size] float32 reward vector.

    Lowering too, not just tracing: numpy functions that dispatch to array
    methods (np.argsort(x) calls x.argsort) can trace with arguments the JAX
    method then fails to lower.
    """
    try:
        jax.jit(fn).lower(jax.ShapeDtypeStruct((max(size, 1),), jnp.float32))
    except Exception:  # numpy on a tracer raises TracerArrayConversionError, and others
        return False
    return True


@functools.lru_cache(maxsize=256)
def _group_of_size(fn: Callable, n: int, size: int) -> Callable:
    """[size] rewards -> [size] advantages of the first n members (zeros after), jitted."""

    def branch(row):
        adv = jnp.asarray(fn(row[:n]), jnp.float32)
        if adv.shape != (n,):
            raise AdvantageShapeError(
                f"advantage callable returned shape {adv.shape} for {n} rewards; expected ({n},)"
            )
        return jnp.zeros((size,), jnp.float32).at[:n].set(adv)

    return jax.jit(branch)


def _traced_members(fn: Callable, rewards, count):
    """Traced path: one branch of static shape per possible member count."""
    size = rewards.shape[0]
    branches = [_group_of_size(fn, n, size) for n in range(1, size + 1)]
    index = jnp.clip(count - 1, 0, size - 1)
    if isinstance(index, jax.core.Tracer):
        return jax.lax.switch(index, branches, rewards), jnp.int32(0)
    # Eager: run only this size's branch instead of compiling all of them.
    return branches[int(index)](rewards), jnp.int32(0)


def _host_members(fn: Callable, rewards, count, fold):
    """Host path: fn runs in numpy float64 on the members' rewards, only when `fold`."""
    size = rewards.shape[0]

    def host(row, n, run):
        out = np.zeros(size, np.float32)
        n = int(n)
        if not bool(run) or n < 1:
            return out, np.int32(0)
        adv = np.asarray(fn(np.asarray(row[:n], np.float64)), np.float64)
        if adv.shape != (n,):
            return out, np.int32(_errors.ADVANTAGE_SHAPE)
        out[:n] = adv
        return out, np.int32(0)

    result = (
        jax.ShapeDtypeStruct((size,), jnp.float32),
        jax.ShapeDtypeStruct((), jnp.int32),
    )
    return jax.pure_callback(host, result, rewards, count, fold)


def member_advantages(
    fn: Callable, host: bool, rewards: Float[Array, " G"], count, fold
) -> tuple[Float[Array, " G"], jax.Array]:
    """Advantages of the first `count` rewards (zeros after) and an error code.

    The code checks the members' output: shape (host path; a traced function's
    shape is checked while tracing), finiteness and group-wise equality.
    """
    count = jnp.asarray(count, jnp.int32)
    if host:
        adv, code = _host_members(fn, rewards, count, jnp.asarray(fold))
    else:
        adv, code = _traced_members(fn, rewards, count)
    members = jnp.arange(rewards.shape[0]) < count
    code |= jnp.where(jnp.any(members & ~jnp.isfinite(adv)), _errors.ADVANTAGE_NONFINITE, 0)
    tied = (rewards[:, None] == rewards[None, :]) & members[:, None] & members[None, :]
    unequal = jnp.any(tied & (adv[:, None] != adv[None, :]))
    code |= jnp.where(unequal, _errors.ADVANTAGE_NOT_GROUPWISE, 0)
    return jnp.where(members, adv, 0.0), jnp.where(fold, code, 0).astype(jnp.int32)


def to_buckets(
    rewards: Float[Array, " G"], count, adv: Float[Array, " G"], bucket_values: Float[Array, " nb"]
) -> Float[Array, " nb"]:
    """Each bucket's advantage: that of the first member holding the bucket's reward."""
    members = jnp.arange(rewards.shape[0]) < count
    match = (rewards[None, :] == bucket_values[:, None]) & members[None, :]
    first = jnp.argmax(match, axis=1)
    return jnp.where(jnp.any(match, axis=1), adv[first], 0.0)


def bucket_advantages(
    fn: Callable,
    host: bool,
    rewards: Float[Array, " G"],
    count,
    bucket_values: Float[Array, " nb"],
    fold=True,
) -> tuple[Float[Array, " nb"], jax.Array]:
    """Advantage of each bucket's reward under `fn`, for a group of `count` members.

    `rewards[:count]` are the members (any order: `fn` is group-wise). Returns
    (advantages [nb], error code; nonzero only when `fold`).
    """
    adv, code = member_advantages(fn, host, rewards, count, fold)
    return to_buckets(rewards, count, adv, bucket_values), code
