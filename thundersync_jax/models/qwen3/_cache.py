"""Key/value cache with one write offset per row, for prefill + decode and continuous batching."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from thundersync_jax.models.qwen3._config import Qwen3Config


class KVCache(NamedTuple):
    """Per-layer keys and values of the tokens seen so far, one independent row per sequence.

    Semantics (what the model does with it, see `Qwen3.__call__`):

    * Row b holds `lengths[b]` tokens in slots `0 .. lengths[b]-1`; slots past that are free and
      never attended to, whatever they contain.
    * A forward pass with `cache=` appends, to each row, only the tokens whose `attention_mask`
      is True, packed in order into the row's next free slots; `lengths` grows by the number of
      such tokens. Rows whose mask is all False are untouched, so one call can prefill a new
      request into row r (T real tokens) while other rows decode (1 real token, T-1 padding) or
      sit idle (all padding). Left, right or interleaved padding all work.
    * Query token t of row b attends to the row's cached slots and to the new tokens of that row
      up to itself (causal in write order). Keys are stored after RoPE, at the absolute positions
      the caller passed, so positions need not equal slot indices.
    * Writes past `max_len` are dropped (under jit nothing can raise): callers must keep
      `lengths + new tokens <= max_len`.
    * `reset_rows` frees rows (lengths -> 0) without touching the others; a freed row is then
      prefilled like a new one.

    Attributes:
      k: keys, [L, B, S, K, H] (layers, rows, slots, kv heads, head_dim), after RoPE and k_norm.
      v: values, [L, B, S, K, H].
      lengths: int32 [B], tokens cached per row (= the row's next write slot).
    """

    k: Float[Array, "L B S K H"]
    v: Float[Array, "L B S K H"]
    lengths: Int[Array, " B"]

    @property
    def max_len(self) -> int:
        """Slots per row (S)."""
        return self.k.shape[2]


def init_cache(
    cfg: Qwen3Config, batch_size: int, max_len: int, dtype: jnp.dtype = jnp.float32
) -> KVCache:
    """An empty cache of `batch_size` rows with room for `max_len` tokens each."""
    if batch_size < 1 or max_len < 1:
        raise ValueError(f"batch_size={batch_size} and max_len={max_len} must both be >= 1")
    shape = (cfg.num_hidden_layers, batch_size, max_len, cfg.num_key_value_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def reset_rows(cache: KVCache, rows_mask: Bool[Array, " B"]) -> KVCache:
    """Empties the rows where `rows_mask` is True; other rows keep their tokens. Jit-safe."""
    rows_mask = jnp.asarray(rows_mask, bool)
    if rows_mask.shape != cache.lengths.shape:
        raise ValueError(
            f"rows_mask has shape {rows_mask.shape}, the cache has {cache.lengths.shape[0]} rows"
        )
    return cache._replace(lengths=jnp.where(rows_mask, 0, cache.lengths).astype(jnp.int32))


def write_slots(
    lengths: Int[Array, " B"], mask: Bool[Array, "B T"], max_len: int
) -> tuple[Int[Array, "B T"], Int[Array, "B T"], Int[Array, " B"]]:
    """Where each new token goes in its row.

    Returns:
      own_slot: [B,T] the slot token t occupies after the write (for padding: the slot of the
        last real token before it, or lengths-1), used as the causal limit of its query.
      write_index: [B,T] own_slot for real tokens, `max_len` (out of range, dropped) for padding.
      new_lengths: [B] lengths plus the real tokens of each row.
    """
    mask = mask.astype(bool)
    own_slot = lengths[:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
    write_index = jnp.where(mask, own_slot, max_len)
    new_lengths = (lengths + mask.sum(axis=1, dtype=jnp.int32)).astype(jnp.int32)
    return own_slot, write_index, new_lengths


def write_layer(
    cache_all: Float[Array, "L B S K H"],
    layer: int,
    new: Float[Array, "B T K H"],
    write_index: Int[Array, "B T"],
) -> Float[Array, "L B S K H"]:
    """Scatters one layer's new keys (or values) into their rows; padding (index S) is dropped.

    Scatters into the full [L, ...] array (not a per-layer copy) so that under jit with a donated
    cache XLA updates the buffer in place.
    """
    rows = jnp.arange(new.shape[0])[:, None]
    return cache_all.at[layer, rows, write_index].set(new.astype(cache_all.dtype), mode="drop")


def cache_positions(lengths: Int[Array, " B"], mask: Bool[Array, "B T"]) -> Int[Array, "B T"]:
    """Default positions with a cache: continue each row from its cached length."""
    return jnp.maximum(lengths[:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)
