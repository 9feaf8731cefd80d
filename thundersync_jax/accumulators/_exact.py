"""Exactly associative tallies: fixed-point sums in int32 limbs (no jax_enable_x64).

A float32 tally's bits depend on the order of its adds; an integer sum's do
not. An `ExactSum` holds, per leaf, NUM_LIMBS int32 limbs of LIMB_BITS-bit
digits at *absolute* binary positions: limb a weighs 2^(LIMB_BITS·a). Each
element has its own window, the NUM_LIMBS limbs ending at `top`; `top` is the
running maximum over every add of that element's exponent, so it depends on
the set of values added, not on their order. (A per-element window keeps every
operation elementwise, so XLA fuses an add into a few kernels per leaf; a
per-leaf window needed a reduction and ran ~8x slower on CPU.)

Every input x is truncated toward zero at the window's lowest position, digit
by digit: digit a of x is sign(x)·(⌊|x|/2^(L·a)⌋ mod 2^L), the same integer
whatever the window was when x arrived. When `top` rises, the lowest limbs
drop wholesale; what they held is exactly the digits an input arriving after
the rise would have truncated. So every kept limb is Σ_i digit_a(x_i), an
integer independent of arrival order, and the float32 read-out is a pure
function of those integers: any permutation of adds gives the same bits.

Accuracy: the window keeps L·(NUM_LIMBS − 1) = 42 bits below the element's
largest value, so each add loses at most 2^-42 of that value (float32 itself
rounds at 2^-24). Range: limbs are never carry-normalised while adding (that
would move dropped digits into kept limbs), so each limb has 31 − L bits of
headroom; more than MAX_ADDS adds into one tally is an overflow, which the
callers record as an error instead of wrapping silently.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.accumulators import _tallies

LIMB_BITS = 14
NUM_LIMBS = 4
# |digit| < 2^L, so n adds keep |limb| < n·2^L; carry normalisation at read-out adds < 2^L.
MAX_ADDS = 2 ** (31 - LIMB_BITS) - 2
_MASK = (1 << LIMB_BITS) - 1
# Window top of an empty tally: the one a zero (biased exponent 0) would choose.
EMPTY_TOP = (0 - 127) // LIMB_BITS


class ExactSum(NamedTuple):
    """A stack of exactly associative tallies shaped like params.

    Shapes: `lead` = the stack's leading axes (() for one tally, (S, nb) for
    reward buckets), L = NUM_LIMBS.

    Attributes:
      limbs: int32 pytree like params, each leaf [*lead, L + 1, *leaf.shape].
        Rows 0..L−1 are the limbs (row i weighs 2^(LIMB_BITS·(top − L + 1 + i)));
        row L is `top` − EMPTY_TOP, each element's window (top: the absolute index
        of its highest limb, −10..9 for float32), so an empty tally is all zeros.
        One array per leaf: an add is one in-place read-modify-write of its slot
        (a separate `top` array made XLA copy the whole stack on every add).
      adds: int32 [*lead], adds into each tally (the headroom guard).
    """

    limbs: Any
    adds: jax.Array


def zeros(params, *lead: int) -> ExactSum:
    """Empty exact tallies for params' structure, with leading stack axes `lead`."""
    lead = tuple(lead)
    # Laid out like the params (the stack axes unsharded), as the adds' outputs are.
    return ExactSum(
        limbs=_tallies.stacked_zeros(params, *lead, NUM_LIMBS + 1, dtype=jnp.int32),
        adds=_tallies.on_mesh_of(params, jnp.asarray(np.zeros(lead, np.int32))),
    )


def shapes_of(tally: ExactSum):
    """ShapeDtypeStructs of the params a single (lead ()) tally was made for."""
    return jax.tree.map(
        lambda cells: jax.ShapeDtypeStruct(cells.shape[1:], jnp.float32), tally.limbs
    )


def _element_top(x):
    """Absolute limb index that holds |x|, per element."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    biased = (bits >> 23) & 0xFF
    # |x| < 2^(biased − 127 + 1) <= 2^(L·(top + 1)) with top = (biased − 127) // L.
    return jnp.floor_divide(biased - 127, LIMB_BITS)


def _digits(x, top):
    """The NUM_LIMBS signed digits of x (truncated toward zero) under a window ending at top."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    biased = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    mantissa = jnp.where(biased > 0, frac | 0x800000, frac)  # |x| = mantissa · 2^exponent
    exponent = jnp.maximum(biased, 1) - 150
    negative = bits < 0
    digits = []
    for i in range(NUM_LIMBS):
        shift = exponent - LIMB_BITS * (top - NUM_LIMBS + 1 + i)
        # Left shifts wrap past bit 31 but keep the low L bits, which are all we take.
        left = mantissa << jnp.clip(shift, 0, 31)
        right = mantissa >> jnp.clip(-shift, 0, 31)
        part = jnp.where(shift >= 0, left, right)
        if i < NUM_LIMBS - 1:
            part = part & _MASK  # the top digit is < 2^L by the choice of top
        digits.append(jnp.where(negative, -part, part))
    return jnp.stack(digits)


def _raise_window(limbs, top, new_top):
    """Moves a leaf's window up to new_top; limbs below the new window drop wholesale."""
    delta = new_top - top  # >= 0, per element
    # Selects among static slices, not a gather: XLA fuses these with the digit arithmetic
    # (a jnp.take over the limb axis made the add ~10x slower on CPU).
    moved = []
    for i in range(NUM_LIMBS):
        limb = jnp.zeros_like(limbs[0])
        for d in range(NUM_LIMBS - i):
            limb = jnp.where(delta == d, limbs[i + d], limb)
        moved.append(limb)
    return jnp.stack(moved)


def add_leaf(cell, x, ok):
    """One leaf's cell [L + 1, ...] (limbs, then top) plus x (float32) when ok; exact."""
    x = jnp.where(ok, x.astype(jnp.float32), 0.0)
    limbs, top = cell[:NUM_LIMBS], cell[NUM_LIMBS] + EMPTY_TOP
    new_top = jnp.maximum(top, _element_top(x))  # x = 0 (not ok) never raises the window
    new_limbs = _raise_window(limbs, top, new_top) + _digits(x, new_top)
    return jnp.concatenate([new_limbs, (new_top - EMPTY_TOP)[None]])


def _get(array, index):
    """array[index] for scalar (traced) indices, as a dynamic slice (XLA's scatter/gather
    for `.at[i, j]` with traced i, j was several times slower on CPU)."""
    if not index:
        return array
    rest = array.shape[len(index) :]
    start = index + (jnp.int32(0),) * len(rest)
    return jax.lax.dynamic_slice(array, start, (1,) * len(index) + rest).reshape(rest)


def _set(array, index, value):
    """array.at[index].set(value) as an in-place dynamic update slice."""
    if not index:
        return value.astype(array.dtype)
    rest = array.shape[len(index) :]
    start = index + (jnp.int32(0),) * len(rest)
    update = value.astype(array.dtype).reshape((1,) * len(index) + rest)
    return jax.lax.dynamic_update_slice(array, update, start)


def add(tally: ExactSum, values, ok, index=(), fresh=False) -> tuple[ExactSum, jax.Array]:
    """Adds `values` (float32 pytree like params) into tally[index] when ok.

    `fresh`: tally[index] is emptied first (a bucket taken by a new group); this
    rides on the read-modify-write of the add, so it costs no extra pass.
    Returns (tally, overflow): an add that would pass MAX_ADDS is skipped and
    reported instead (the caller records it as an error).
    """
    index = tuple(jnp.asarray(i, jnp.int32) for i in index)
    fresh = jnp.asarray(fresh) & ok
    adds_before = jnp.where(fresh, 0, _read_counter(tally.adds, index))
    overflow = ok & (adds_before >= MAX_ADDS)
    ok = ok & ~overflow

    def one(cells, x):
        old = jnp.where(fresh, 0, _get(cells, index))  # all zeros: an empty tally
        return _set(cells, index, add_leaf(old, x, ok))

    limbs = jax.tree.map(one, tally.limbs, values)
    adds = _set(tally.adds, index, adds_before + jnp.where(ok, 1, 0))
    return ExactSum(limbs, adds), overflow


def _read_counter(adds, index):
    """adds[index] as a one-hot sum: a reduction, which XLA computes once.

    The skip-on-overflow guard makes every element of the add depend on this count.
    Read as a slice, XLA fused the slice and the comparison into each leaf's elementwise
    loop, recomputing them per element: the bucket add ran ~4x slower on CPU (6 ms vs
    1.1-1.9 ms for 98K params; BENCHMARKS.md, "Determinism").
    """
    hit = jnp.ones(adds.shape, bool)
    for axis, i in enumerate(index):
        hit &= jax.lax.broadcasted_iota(jnp.int32, adds.shape, axis) == i
    return jnp.sum(jnp.where(hit, adds, 0))


def _carry(limbs: list) -> list:
    """Carries so limbs 0..L−2 lie in [0, 2^L); the integer value is unchanged."""
    limbs = list(limbs)
    for i in range(NUM_LIMBS - 1):
        carry = limbs[i] >> LIMB_BITS  # arithmetic shift: floor division
        limbs[i] = limbs[i] & _MASK
        limbs[i + 1] = limbs[i + 1] + carry
    return limbs


def leaf_to_float(cell):
    """float32 value of one leaf's cell [L + 1, ...] (limbs, then top)."""
    limbs, top = cell[:NUM_LIMBS], cell[NUM_LIMBS] + EMPTY_TOP
    normal = _carry([limbs[i] for i in range(NUM_LIMBS)])
    negative = normal[-1] < 0  # lower limbs are >= 0 now, so the top limb has the sign
    magnitude = _carry([jnp.where(negative, -d, d) for d in normal])
    # Same-sign terms, largest first: no cancellation in the float32 sum.
    value = jnp.zeros(limbs.shape[1:], jnp.float32)
    for i in reversed(range(NUM_LIMBS)):
        weight = jnp.float32(2.0 ** (LIMB_BITS * (i - NUM_LIMBS + 1)))
        value = value + magnitude[i].astype(jnp.float32) * weight
    value = jnp.ldexp(value, LIMB_BITS * top)
    return jnp.where(negative, -value, value)


@jax.jit
def to_float(tally: ExactSum):
    """float32 pytree like params: the value of a single (lead ()) tally."""
    return jax.tree.map(leaf_to_float, tally.limbs)


def stack_to_float(cells):
    """Values of a stacked leaf's cells [n, L + 1, ...] -> float32 [n, ...]."""
    return jax.vmap(leaf_to_float)(cells)


def _aligned(cells, new_top):
    """cells [L + 1, ...] with the window raised to new_top (absolute, per element)."""
    top = cells[NUM_LIMBS] + EMPTY_TOP
    limbs = _raise_window(cells[:NUM_LIMBS], top, new_top)
    return jnp.concatenate([limbs, (new_top - EMPTY_TOP)[None]])


def merge(a: ExactSum, b: ExactSum) -> tuple[ExactSum, jax.Array]:
    """a + b exactly, as if one tally had taken both's adds; returns (sum, overflow).

    Windows are raised to the larger top (dropping exactly the digits a later
    add would have truncated), then the integer limbs add: the cells are
    bitwise those of a single tally fed every input, in any order.
    """

    def one(x, y):
        new_top = jnp.maximum(x[NUM_LIMBS], y[NUM_LIMBS]) + EMPTY_TOP
        both = _aligned(x, new_top) + _aligned(y, new_top)
        return both.at[NUM_LIMBS].set(new_top - EMPTY_TOP)

    adds = a.adds + b.adds
    return ExactSum(jax.tree.map(one, a.limbs, b.limbs), adds), jnp.any(adds > MAX_ADDS)


def sum_stacked(stacked: ExactSum) -> ExactSum:
    """Exact sum over the leading axis of a stack of tallies (limbs [P, L + 1, ...], adds [P]).

    The cross-process all-reduce of the data-parallel batch end (`learner.replicas`): with
    the stack's axis sharded over processes, XLA lowers the max of the windows and the
    integer sum to collectives. The result is bitwise `merge` of the P tallies in any order
    (the caller checks `adds` against MAX_ADDS: the limbs may wrap past it).
    """

    def one(cells):
        new_top = jnp.max(cells[:, NUM_LIMBS], axis=0) + EMPTY_TOP
        aligned = jax.vmap(_aligned, in_axes=(0, None))(cells, new_top)
        limbs = jnp.sum(aligned[:, :NUM_LIMBS], axis=0)
        return jnp.concatenate([limbs, (new_top - EMPTY_TOP)[None]])

    return ExactSum(jax.tree.map(one, stacked.limbs), jnp.sum(stacked.adds, axis=0))


def psum(tally: ExactSum, axis_name) -> tuple[ExactSum, jax.Array]:
    """Exact sum of every replica's tally along `axis_name` (inside shard_map or pmap).

    The data-parallel all-reduce of DESIGN §7 in deterministic mode: one pmax of
    the windows, then one psum of the integer limbs; a P-replica run ends at the
    bits of a one-replica run that took every replica's adds. Returns
    (sum, overflow: the replicas' adds together pass MAX_ADDS).
    """

    def one(cells):
        new_top = jax.lax.pmax(cells[NUM_LIMBS], axis_name) + EMPTY_TOP
        aligned = _aligned(cells, new_top)
        limbs = jax.lax.psum(aligned[:NUM_LIMBS], axis_name)
        return jnp.concatenate([limbs, (new_top - EMPTY_TOP)[None]])

    adds = jax.lax.psum(tally.adds, axis_name)
    return ExactSum(jax.tree.map(one, tally.limbs), adds), jnp.any(adds > MAX_ADDS)
