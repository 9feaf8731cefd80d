"""Padding of score-gradient chunks to a fixed set of shapes, so compilations stay bounded.

A jitted function compiles once per input shape. Trajectories have every length, so a chunk
of shape [B, T] is padded on the right to [next power of two >= B, smallest bucket >= T]:
with S sequence buckets and batches of at most 2^k rows, at most S·(k+1) programs exist.
Padding is inert: padded positions and rows carry loss_mask = 0 and token_weights = 0, and
attention is causal, so right-padding never changes the log-probs of real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class PaddedChunk(NamedTuple):
    """One chunk padded to a bucketed shape (numpy, host side).

    Attributes:
      tokens: int32 [B_pad, T_pad] token ids; padding is `pad_id`.
      loss_mask: float32 [B_pad, T_pad]; 1 where a token's log-prob enters the gradient.
      token_weights: float32 [B_pad, T_pad]; per-token weight (1 for GRPO, Â_t for OPD).
      num_rows: rows before padding.
      num_positions: sequence length before padding.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    token_weights: np.ndarray
    num_rows: int
    num_positions: int


def validate_buckets(seq_buckets: Sequence[int]) -> tuple[int, ...]:
    """Returns the buckets sorted, after checking they are distinct positive ints."""
    buckets = tuple(sorted(int(b) for b in seq_buckets))
    if not buckets or buckets[0] < 2 or len(set(buckets)) != len(buckets):
        raise ValueError(
            f"seq_buckets={tuple(seq_buckets)} must be a non-empty set of distinct ints >= 2"
        )
    return buckets


def bucket_length(length: int, seq_buckets: Sequence[int]) -> int:
    """Smallest bucket >= length; raises ValueError naming the buckets if none is long enough."""
    for bucket in sorted(seq_buckets):
        if bucket >= length:
            return int(bucket)
    raise ValueError(
        f"sequence length {length} exceeds the largest bucket; seq_buckets={tuple(seq_buckets)}"
        " (raise learner.seq_buckets or cap rollout.max_traj_tokens)"
    )


def bucket_rows(rows: int) -> int:
    """Next power of two >= rows (rows >= 1)."""
    if rows < 1:
        raise ValueError(f"a chunk needs at least one row, got {rows}")
    return 1 << (rows - 1).bit_length()


def pad_chunk(
    tokens: np.ndarray,
    loss_mask: np.ndarray,
    token_weights: np.ndarray | None,
    seq_buckets: Sequence[int],
    pad_id: int = 0,
) -> PaddedChunk:
    """Pads a [B, T] chunk to [bucket_rows(B), bucket_length(T)].

    Args:
      tokens: [B, T] token ids; row b is one sequence (prompt + completion).
      loss_mask: [B, T]; loss_mask[b, t] = 1 scores tokens[b, t] given tokens[b, <t]. Position 0
        has no context and must be 0.
      token_weights: [B, T] or None (all ones).
      seq_buckets: allowed padded lengths.
      pad_id: token id written into padding.
    """
    tokens = np.asarray(tokens)
    loss_mask = np.asarray(loss_mask, dtype=np.float32)
    if tokens.ndim != 2 or loss_mask.shape != tokens.shape:
        raise ValueError(
            f"tokens {tokens.shape} and loss_mask {loss_mask.shape} must be equal [B, T] shapes"
        )
    if token_weights is None:
        token_weights = np.ones(tokens.shape, np.float32)
    token_weights = np.asarray(token_weights, dtype=np.float32)
    if token_weights.shape != tokens.shape:
        raise ValueError(f"token_weights {token_weights.shape} must match tokens {tokens.shape}")
    if np.any(loss_mask[:, 0] != 0):
        raise ValueError(
            "loss_mask[:, 0] must be 0: the first token of a sequence has no context to score it"
        )
    rows, length = tokens.shape
    rows_pad, length_pad = bucket_rows(rows), bucket_length(length, seq_buckets)
    pad = ((0, rows_pad - rows), (0, length_pad - length))
    return PaddedChunk(
        tokens=np.pad(tokens.astype(np.int32), pad, constant_values=pad_id),
        loss_mask=np.pad(loss_mask, pad),
        token_weights=np.pad(token_weights, pad),
        num_rows=rows,
        num_positions=length,
    )


def pack_sequences(
    sequences: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    token_weights: Sequence[Sequence[float]] | None = None,
    pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stacks variable-length sequences as rows of one [B, max_len] chunk (right-padded).

    Used to pack several trajectories of the same (group, reward) slot into one call.
    """
    if len(sequences) != len(loss_masks) or (
        token_weights is not None and len(token_weights) != len(sequences)
    ):
        raise ValueError("sequences, loss_masks and token_weights need one entry per row")
    length = max(len(s) for s in sequences)
    tokens = np.full((len(sequences), length), pad_id, np.int32)
    mask = np.zeros((len(sequences), length), np.float32)
    weights = np.zeros((len(sequences), length), np.float32)
    for row, seq in enumerate(sequences):
        if len(loss_masks[row]) != len(seq):
            raise ValueError(f"row {row}: loss mask length {len(loss_masks[row])} != {len(seq)}")
        tokens[row, : len(seq)] = seq
        mask[row, : len(seq)] = loss_masks[row]
        weights[row, : len(seq)] = 1.0 if token_weights is None else token_weights[row]
    return tokens, mask, weights
