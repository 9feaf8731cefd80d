"""One attention function for every place the models attend (learner, segments, engine).

    out = dot_product_attention(q, k, v, q_slots=slots, kv_valid=valid)

Masks are slots, validity and segment ids, never [T, S] booleans: query t of row b sees key
slot s iff s <= q_slots[b, t] (causal in slot order), kv_valid[b, s], and the segment ids (if
given) are equal. A query that sees no key gets zeros (no NaN, no NaN gradients).

Implementations (`impl`):
  "naive": scores [B, K, G, T, S] materialized; the reference the others are tested against.
  "blockwise": online softmax over query and key blocks in plain JAX (`_blockwise.py`), with
    a recomputing backward; memory O(T + S), any platform. block_q / block_k are the largest
    tiles: a length is cut into as many tiles as they need, of equal size (`balanced_tile`).
  "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16, Hq = Hv,
    plain causal: needs the static promise `q_offset=0`, see below).
  "auto": cudnn where it applies on a GPU, blockwise otherwise (naive when it is smaller than
    one block pair: T * S <= block_q * block_k).

Axis letters: B batch, T queries, S key slots, N query heads, K kv heads (N = K*G; query head
n uses kv head n // G), Hq query/key head dim, Hv value head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from thundersync_jax.models import _blockwise

IMPLEMENTATIONS = ("auto", "naive", "blockwise", "cudnn")


def visibility(q_slots, kv_valid, q_segment_ids, kv_segment_ids, s: int) -> Bool[Array, "B T S"]:
    """The [B, T, S] mask the naive path builds (the other paths never do)."""
    slots = jnp.arange(s, dtype=jnp.int32)
    vis = slots[None, None, :] <= q_slots[:, :, None]
    if kv_valid is not None:
        vis &= kv_valid[:, None, :]
    if q_segment_ids is not None:
        vis &= q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    return vis


def _naive(q, k, v, q_slots, kv_valid, q_seg, kv_seg, scale):
    b, t, n, _ = q.shape
    nkv = k.shape[2]
    qg = q.reshape(b, t, nkv, n // nkv, q.shape[-1])
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
    vis = visibility(q_slots, kv_valid, q_seg, kv_seg, k.shape[1])[:, None, None]
    # A finite floor (not -inf) keeps an all-hidden row finite; its probabilities are then
    # zeroed, so such a query returns 0 and its gradient is 0.
    scores = jnp.where(vis, scores, jnp.finfo(jnp.float32).min)
    probs = jnp.where(vis, jax.nn.softmax(scores, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v)
    return out.reshape(b, t, n, v.shape[-1]).astype(q.dtype)


def _pad_axis(x, multiple, value):
    pad = -x.shape[1] % multiple
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def balanced_tile(length: int, block: int, multiple: int = 8) -> int:
    """The tile for `length` tokens: as many tiles as `block`-sized ones would take, each as
    small as covers `length` (rounded up to `multiple`), so padding is under one `multiple`
    per tile instead of up to a whole tile (1,119 tokens: 3 x 376, not 3 x 512; the tiny CPU
    model's attention gradient 0.41 -> 0.12 s, BENCHMARKS.md "Long sequences")."""
    if length <= block:
        return length
    tiles = -(-length // block)
    per_tile = -(-length // tiles)
    return min(block, -(-per_tile // multiple) * multiple)


def _blockwise_attention(q, k, v, q_slots, kv_valid, q_seg, kv_seg, scale, block_q, block_k):
    b, t, n, _ = q.shape
    s, nkv = k.shape[1], k.shape[2]
    bq, bk = balanced_tile(t, block_q), balanced_tile(s, block_k)
    if kv_valid is None:
        kv_valid = jnp.ones((b, s), bool)
    if q_seg is None:
        q_seg, kv_seg = jnp.zeros((b, t), jnp.int32), jnp.zeros((b, s), jnp.int32)
    qg = _pad_axis(q.reshape(b, t, nkv, n // nkv, q.shape[-1]), bq, 0)
    out = _blockwise.blockwise(
        qg,
        _pad_axis(k, bk, 0),
        _pad_axis(v, bk, 0),
        _pad_axis(q_slots.astype(jnp.int32), bq, -1),  # padded queries see nothing
        _pad_axis(kv_valid.astype(bool), bk, False),
        _pad_axis(q_seg.astype(jnp.int32), bq, 0),
        _pad_axis(kv_seg.astype(jnp.int32), bk, 0),
        float(scale),
        bq,
        bk,
    )
    return out[:, :t].reshape(b, t, n, v.shape[-1])


def _cudnn(q, k, v, kv_valid, scale):
    lengths = None
    if kv_valid is not None:  # the promise (q_offset) includes: valid slots are a prefix
        lengths = jnp.sum(kv_valid, axis=1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        scale=scale,
        is_causal=True,
        key_value_seq_lengths=lengths,
        implementation="cudnn",
    )


def _cudnn_applies(q, k, v, q_seg, q_offset) -> bool:
    return (
        q_offset == 0
        and q.shape[1] == k.shape[1]
        and q_seg is None
        and q.shape[-1] == v.shape[-1]
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and jax.default_backend() == "gpu"
    )


def dot_product_attention(
    q: Float[Array, "B T N Hq"],
    k: Float[Array, "B S K Hq"],
    v: Float[Array, "B S K Hv"],
    *,
    q_slots: Int[Array, "B T"],
    kv_valid: Bool[Array, "B S"] | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
    block_q: int = 512,
    block_k: int = 512,
    q_offset: int | None = None,
) -> Float[Array, "B T N Hv"]:
    """softmax(q·kᵀ·scale + mask)·v per query head, softmax statistics in float32.

    Args:
      q, k, v: queries, keys, values (GQA: N = K*G; Hv may differ from Hq).
      q_slots: each query's own slot on the key axis; key s is visible iff s <= q_slots.
      kv_valid: False = empty or padded key slot, never attended; None = all valid.
      q_segment_ids, kv_segment_ids: attend only where equal (both or neither).
      scale: score scale, default Hq**-0.5.
      impl: "auto" | "naive" | "blockwise" | "cudnn" (module docstring).
      block_q, block_k: the blockwise path's tile sizes.
      q_offset: a static promise that q_slots[b, t] == q_offset + t in every row and that
        kv_valid (if given) is True on a prefix of each row; only "cudnn" needs it (it takes
        lengths, not slots). None = no promise (auto never picks cudnn).

    Returns:
      [B, T, N, Hv] in q.dtype.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl={impl!r}; expected one of {IMPLEMENTATIONS}")
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids go together")
    if q.shape[2] % k.shape[2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit (GQA)")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if impl == "cudnn":
        if q_offset != 0 or q_segment_ids is not None:
            raise ValueError("impl='cudnn' needs q_offset=0 (plain causal) and no segment ids")
        return _cudnn(q, k, v, kv_valid, scale).astype(q.dtype)
    if impl == "auto" and _cudnn_applies(q, k, v, q_segment_ids, q_offset):
        try:
            return _cudnn(q, k, v, kv_valid, scale).astype(q.dtype)
        except (NotImplementedError, ValueError, RuntimeError):
            pass  # a shape, dtype or cuDNN version jax's check refuses: blockwise below
    masks = (q_slots, kv_valid, q_segment_ids, kv_segment_ids)
    small = q.shape[1] * k.shape[1] <= block_q * block_k
    if impl == "naive" or (impl == "auto" and small):
        return _naive(q, k, v, *masks, scale)
    return _blockwise_attention(q, k, v, *masks, scale, block_q, block_k).astype(q.dtype)
