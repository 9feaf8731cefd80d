"""Error codes an accumulator records in its state, and their host-side messages.

Under `jax.jit` an accumulator cannot raise: `add` records what went wrong as a
bit in `state.error` (plus the group and reward of the first problem) and skips
the update; `check(state)` (host side) and an eager `finalize` turn the record
into a `ValueError`. Eagerly, `add` raises at once with the same messages.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NONFINITE_REWARD = 1
NONFINITE_GRAD = 2
GROUP_OUT_OF_RANGE = 4
GROUP_CLOSED = 8
TOO_MANY_OPEN_GROUPS = 16
TOO_MANY_DISTINCT_REWARDS = 32
NEGATIVE_NUM_TOKENS = 64
BAD_COUNT = 128
# Problems of an advantage callable's output, found when its group folds (never dropped).
ADVANTAGE_SHAPE = 256
ADVANTAGE_NONFINITE = 512
ADVANTAGE_NOT_GROUPWISE = 1024
# An exact (deterministic-mode) tally ran out of headroom or of float32 range.
EXACT_OVERFLOW = 2048

# Problems with one trajectory's own inputs: `on_invalid="drop"` may drop it.
# Resource limits (open-group cap, bucket limit) are never dropped: dropping a
# valid trajectory because the accumulator is full would change the update.
DROPPABLE = (
    NONFINITE_REWARD
    | NONFINITE_GRAD
    | GROUP_OUT_OF_RANGE
    | GROUP_CLOSED
    | NEGATIVE_NUM_TOKENS
    | BAD_COUNT
)

ON_INVALID = ("raise", "drop")


def describe(
    code: int,
    group: int,
    reward: float,
    *,
    num_groups: int,
    group_size: int,
    max_open_groups: int,
    max_buckets: int,
    deterministic: bool = False,
) -> str:
    """Human-readable explanation of every bit set in `code`."""
    parts = []
    if code & NONFINITE_REWARD:
        parts.append(f"reward={reward!r} for group {group} is not finite (NaN or inf)")
    if code & NONFINITE_GRAD:
        parts.append(f"the gradient for group {group} contains NaN or inf")
    if code & GROUP_OUT_OF_RANGE:
        parts.append(f"group={group} is out of range; valid groups are 0..{num_groups - 1}")
    if code & GROUP_CLOSED:
        parts.append(
            f"group {group} is already closed (it reached group_size={group_size} or was "
            "closed with close()); a closed group cannot take more members"
        )
    if code & BAD_COUNT:
        parts.append(
            f"the chunk's trajectory count for group {group} is < 1 or would take the group "
            f"past group_size={group_size}"
        )
    if code & NEGATIVE_NUM_TOKENS:
        parts.append(f"num_tokens for group {group} is negative")
    if code & TOO_MANY_OPEN_GROUPS:
        parts.append(
            f"group {group} would open a new group but max_open_groups={max_open_groups} groups "
            "are already open; raise max_open_groups or close groups first"
        )
    if code & TOO_MANY_DISTINCT_REWARDS:
        parts.append(
            f"reward={reward!r} would be distinct reward number {max_buckets + 1} in group "
            f"{group}, past max_buckets={max_buckets}; "
            + (
                "deterministic mode keeps one exact tally per distinct reward of a group "
                "(raise max_buckets)"
                if deterministic
                else "a non-affine advantage needs one bucket per distinct reward (raise "
                "max_buckets, or use an affine estimator)"
            )
        )
    if code & ADVANTAGE_SHAPE:
        parts.append(
            f"the advantage callable returned an array of the wrong shape for group {group} "
            "(it must return one advantage per reward: shape (n,) for n rewards)"
        )
    if code & ADVANTAGE_NONFINITE:
        parts.append(f"the advantage callable returned NaN or inf for group {group}")
    if code & ADVANTAGE_NOT_GROUPWISE:
        parts.append(
            f"the advantage callable gave different advantages to equal rewards in group "
            f"{group}; a group-wise estimator must give equal rewards equal advantages"
        )
    if code & EXACT_OVERFLOW:
        parts.append(
            f"an exact tally overflowed while adding group {group}: more than "
            "_exact.MAX_ADDS adds into one tally, or a sum past the float32 range"
        )
    unknown = code & ~(2 * EXACT_OVERFLOW - 1)
    if unknown:
        parts.append(f"unknown error bits {unknown:#x}")
    return "; ".join(parts)


@jax.jit
def tree_all_finite(tree) -> jax.Array:
    """A scalar bool: every element of every leaf is finite."""
    leaves = jax.tree.leaves(tree)
    flags = [jnp.all(jnp.isfinite(leaf)) for leaf in leaves]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def first_nonfinite_leaf(tree) -> str | None:
    """Path of the first leaf holding NaN or inf (host side, for eager messages)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        bad = int(np.size(leaf) - np.count_nonzero(np.isfinite(np.asarray(leaf))))
        if bad:
            return f"{jax.tree_util.keystr(path)} ({bad} non-finite values)"
    return None


def is_traced(*values) -> bool:
    """True when any leaf is a tracer, i.e. we are inside jit/vmap/grad."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(values))


def check_structure(where: str, expected_like, got) -> None:
    """Raises a ValueError when `got` does not have the params' tree structure and shapes."""
    want, have = jax.tree.structure(expected_like), jax.tree.structure(got)
    if want != have:
        raise ValueError(
            f"{where}: grad has tree structure {have}, but the accumulator was initialised "
            f"with params of structure {want}"
        )
    for path, a, b in zip(
        jax.tree_util.tree_leaves_with_path(expected_like),
        jax.tree.leaves(expected_like),
        jax.tree.leaves(got),
        strict=True,
    ):
        want_shape = tuple(getattr(a, "shape", np.shape(a)))
        if want_shape != np.shape(b):
            raise ValueError(
                f"{where}: grad leaf {jax.tree_util.keystr(path[0])} has shape {np.shape(b)}, "
                f"expected {want_shape} (the params' shape)"
            )
