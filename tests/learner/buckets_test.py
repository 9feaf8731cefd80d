"""Bucket padding: shapes, inert padding, packing and errors (pure numpy)."""

import numpy as np
import pytest

from thundersync_jax.learner import buckets


def test_lengths_and_rows_round_up_to_buckets():
    assert [buckets.bucket_length(n, (32, 8, 16)) for n in (1, 8, 9, 16, 17, 32)] == [
        8,
        8,
        16,
        16,
        32,
        32,
    ]
    assert [buckets.bucket_rows(r) for r in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    with pytest.raises(ValueError, match=r"exceeds the largest bucket; seq_buckets=\(8, 16\)"):
        buckets.bucket_length(17, (8, 16))
    with pytest.raises(ValueError, match="distinct ints >= 2"):
        buckets.validate_buckets((8, 8))


def test_pad_chunk_pads_right_with_zero_mask_and_weight():
    tokens = np.array([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    mask = np.array([[0, 1, 1], [0, 0, 1], [0, 1, 0]])
    chunk = buckets.pad_chunk(tokens, mask, None, (4, 8), pad_id=3)
    assert chunk.tokens.shape == chunk.loss_mask.shape == chunk.token_weights.shape == (4, 4)
    assert (chunk.num_rows, chunk.num_positions) == (3, 3)
    np.testing.assert_array_equal(chunk.tokens[:3, :3], tokens)
    assert (chunk.tokens[3] == 3).all() and (chunk.tokens[:, 3] == 3).all()
    assert chunk.loss_mask.sum() == 4 and chunk.loss_mask[3].sum() == 0
    np.testing.assert_array_equal(chunk.token_weights[:3, :3], np.ones((3, 3)))
    assert chunk.token_weights[3].sum() == 0 and chunk.token_weights[:, 3].sum() == 0


def test_pack_sequences_and_errors():
    tokens, mask, weights = buckets.pack_sequences(
        [[1, 2, 3], [4, 5]], [[0, 1, 1], [0, 1]], [[0.5] * 3, [2.0] * 2]
    )
    np.testing.assert_array_equal(tokens, [[1, 2, 3], [4, 5, 0]])
    np.testing.assert_array_equal(mask, [[0, 1, 1], [0, 1, 0]])
    np.testing.assert_array_equal(weights, [[0.5, 0.5, 0.5], [2, 2, 0]])
    with pytest.raises(ValueError, match="row 1"):
        buckets.pack_sequences([[1, 2], [3]], [[0, 1], [0, 1]])
    with pytest.raises(ValueError, match=r"loss_mask\[:, 0\] must be 0"):
        buckets.pad_chunk(np.ones((1, 3)), np.ones((1, 3)), None, (4,))
