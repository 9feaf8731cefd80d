"""Advantage estimators, selectable by name, and how the accumulator uses each.

Two kinds (DESIGN §2):

* Affine estimators, A_i = a_k r_i + b_k. The accumulator keeps two tallies per
  open group and needs only the scalars (a_k, b_k) when the group closes. Their
  registered function returns those scalars in *shifted* coordinates: it sees
  d_i = r_i − c (c = `shift`, the group's first reward) and returns
  (scale, offset) with A_i = scale · d_i + offset. Shifting keeps the numbers
  small when rewards share a large offset, and makes d_i exactly 0 for a
  reward equal to the first one, so an all-equal group is exactly zero.
* Group-wise callables f(rewards) -> advantages, affine or not. Exact through
  one tally per (group, distinct reward), since equal rewards in a group get
  equal advantages. Written with jax.numpy they are traced; written with numpy
  (np.argsort ranks, a leave-one-out std) they run on the host (`_callables`).

`scope="batch"` makes an affine estimator see the whole batch as one group
(the `batch` estimator: GRPO normalisation with batch-wide mean and std).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Scalar

from thundersync_jax.accumulators import _callables

AffineFn = Callable[..., tuple[jax.Array, jax.Array]]
GroupFn = Callable[[Float[Array, " n"]], Float[Array, " n"]]


class Advantage(NamedTuple):
    """A registered estimator.

    Attributes:
      fn: affine: `fn(offsets, mask, shift, *, eps, std_ddof) -> (scale, offset)`;
        otherwise `fn(rewards) -> advantages` for one group's 1-D rewards.
      affine: which of the two contracts `fn` follows.
      scope: "group" (per prompt) or "batch" (all trajectories as one group;
        affine only).
      host: a non-affine `fn` that cannot be traced by JAX (written with numpy):
        it runs on the host through `jax.pure_callback` (see `_callables`).
    """

    fn: Callable
    affine: bool
    scope: str = "group"
    host: bool = False


def _group_stats(offsets, mask, std_ddof):
    """Count, mean and std of the members' shifted rewards, two-pass for stability."""
    n = jnp.sum(mask.astype(jnp.float32))
    mean = jnp.sum(jnp.where(mask, offsets, 0.0)) / jnp.maximum(n, 1.0)
    sq = jnp.sum(jnp.where(mask, jnp.square(offsets - mean), 0.0))
    std = jnp.sqrt(sq / jnp.maximum(n - std_ddof, 1.0))
    # d_i = r_i − (first reward) is exactly 0 for every member iff all rewards are equal.
    all_equal = jnp.all(jnp.where(mask, offsets == 0.0, True))
    return n, mean, std, all_equal


def _finish(n, all_equal, singleton_scale, singleton_offset, scale, offset):
    """Applies the singleton rule, and exact zeros for empty and all-equal groups."""
    singleton = n == 1.0
    zero = (n == 0.0) | ((n >= 2.0) & all_equal)
    scale = jnp.where(singleton, singleton_scale, jnp.where(zero, 0.0, scale))
    offset = jnp.where(singleton, singleton_offset, jnp.where(zero, 0.0, offset))
    return scale.astype(jnp.float32), offset.astype(jnp.float32)


def grpo_coefficients(
    offsets: Float[Array, " G"],
    mask: Bool[Array, " G"],
    shift: Float[Scalar, ""],
    *,
    eps: float,
    std_ddof: int,
) -> tuple[jax.Array, jax.Array]:
    """A = (r − μ)/(σ + ε); a group of one has μ = 0, σ = 1 (verl), so A = r/(1 + ε)."""
    n, mean, std, all_equal = _group_stats(offsets, mask, std_ddof)
    inv = 1.0 / (std + eps)
    one = jnp.float32(1.0 / (1.0 + eps))
    return _finish(n, all_equal, one, shift * one, inv, -mean * inv)


def drgrpo_coefficients(offsets, mask, shift, *, eps, std_ddof):
    """A = r − μ (Dr. GRPO: no std division); a group of one has μ = 0, so A = r."""
    del eps
    n, mean, _, all_equal = _group_stats(offsets, mask, std_ddof)
    return _finish(n, all_equal, jnp.float32(1.0), shift, jnp.float32(1.0), -mean)


def rloo_coefficients(offsets, mask, shift, *, eps, std_ddof):
    """A_i = r_i − mean of the other members = (n d_i − Σ d)/(n − 1); alone: A = r."""
    del eps
    n, _, _, all_equal = _group_stats(offsets, mask, std_ddof)
    total = jnp.sum(jnp.where(mask, offsets, 0.0))
    m = jnp.maximum(n - 1.0, 1.0)
    return _finish(n, all_equal, jnp.float32(1.0), shift, n / m, -total / m)


_REGISTRY: dict[str, Advantage] = {
    "grpo": Advantage(grpo_coefficients, affine=True),
    "drgrpo": Advantage(drgrpo_coefficients, affine=True),
    "rloo": Advantage(rloo_coefficients, affine=True),
    "batch": Advantage(grpo_coefficients, affine=True, scope="batch"),
}


def register_advantage(
    name: str, fn: Callable, *, affine: bool = False, scope: str = "group"
) -> None:
    """Makes an advantage estimator selectable by name in `grpo(advantage=name)`.

    Args:
      name: the new estimator's name (must not exist yet).
      fn: if `affine`, `fn(offsets, mask, shift, *, eps, std_ddof) -> (scale, offset)`
        with A_i = scale · offsets_i + offset, where offsets_i = r_i − shift for the
        members (mask True) of a [G] row and 0 elsewhere; jnp-traceable. Otherwise
        `fn(rewards) -> advantages` on one group's 1-D reward array
        (permutation-equivariant), made exact through reward buckets; jnp-traceable,
        or numpy code run on the host when it cannot be traced.
      affine: which contract `fn` follows.
      scope: "group", or "batch" to treat the whole batch as one group (affine only).
    """
    if name in _REGISTRY:
        raise ValueError(f"advantage {name!r} is already registered")
    if scope not in ("group", "batch"):
        raise ValueError(f"scope must be 'group' or 'batch', got {scope!r}")
    if scope == "batch" and not affine:
        raise ValueError("scope='batch' needs an affine estimator (one pair of global tallies)")
    host = False
    if not affine:
        host = not _callables.is_traceable(fn, 2)
    _REGISTRY[name] = Advantage(fn, affine, scope, host)


def advantage_names() -> tuple[str, ...]:
    """Names of every registered estimator."""
    return tuple(_REGISTRY)


def resolve_advantage(advantage: str | GroupFn, group_size: int = 2) -> Advantage:
    """A name from the registry, or a bare callable (non-affine, group scope).

    A callable that JAX cannot trace on `group_size` rewards runs on the host.
    """
    if callable(advantage):
        host = not _callables.is_traceable(advantage, group_size)
        return Advantage(advantage, affine=False, host=host)
    if advantage not in _REGISTRY:
        raise ValueError(
            f"unknown advantage {advantage!r}; registered estimators: {sorted(_REGISTRY)}, "
            "or pass a callable rewards -> advantages"
        )
    return _REGISTRY[advantage]


@functools.lru_cache(maxsize=256)
def affine_coefficients(fn: AffineFn, eps: float, std_ddof: int) -> Callable:
    """`fn` with its settings bound, jitted once per (fn, eps, std_ddof).

    Inlined under an outer jit; eagerly it saves dispatching each small op.
    """
    return jax.jit(functools.partial(fn, eps=eps, std_ddof=std_ddof))
