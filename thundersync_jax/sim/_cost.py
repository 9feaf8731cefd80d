"""Learner cost model: what a chunk, the optimizer step and publication cost in seconds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from thundersync_jax.learner.buckets import bucket_rows


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Affine chunk cost on padded tokens, plus fixed per-step costs.

    chunk_s(tokens) = fixed_s + per_token_s · padded(tokens). Padding rounds a
    chunk's token count up to the smallest bucket that holds it; above the largest
    bucket it rounds up to a multiple of the largest (the learner then runs several
    full-bucket calls). With no buckets nothing is padded.

    With `row_padding=True` a chunk is costed the way `learner.chunks` runs it:
    one row per trajectory, rows padded to the next power of two and every row to
    the bucket of the longest, so `chunk_cost(lengths)` charges
    per_token_s · rows_pad · padded(max(lengths)).

    `shape_s` holds measured seconds per padded (rows, length) shape; a chunk of a
    measured shape costs its measurement instead of the affine formula. On XLA CPU
    a score-gradient chunk is superlinear in its length (attention), so one line
    through 64-, 128- and 256-token chunks misprices each of them by tens of
    percent; the learner only ever runs the bucket shapes, and a calibration can
    time every one of them.

    Attributes:
      fixed_s: per-chunk overhead (dispatch, host-device transfer, accumulate).
      per_token_s: seconds per padded token (forward + backward).
      opt_s: the optimizer step at the end of the batch.
      pub_s: publishing the new weights to the rollout side.
      buckets: ascending padded token counts; () for no padding.
      row_padding: cost packed chunks as padded [rows, length] blocks (see above).
      shape_s: ((rows, length, seconds), ...) measured per padded shape (row_padding only).
    """

    fixed_s: float
    per_token_s: float
    opt_s: float = 0.0
    pub_s: float = 0.0
    buckets: tuple[int, ...] = ()
    row_padding: bool = False
    shape_s: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self):
        for name in ("fixed_s", "per_token_s", "opt_s", "pub_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"CostModel.{name}={v} must be finite and >= 0")
        b = tuple(int(x) for x in self.buckets)
        if any(x < 1 for x in b) or list(b) != sorted(set(b)):
            raise ValueError(
                f"CostModel.buckets={self.buckets} must be strictly ascending and >= 1"
            )
        object.__setattr__(self, "buckets", b)
        shapes = tuple((int(r), int(n), float(t)) for r, n, t in self.shape_s)
        for r, n, t in shapes:
            if r < 1 or n < 1 or not (math.isfinite(t) and t >= 0):
                raise ValueError(
                    f"CostModel.shape_s entry {(r, n, t)}: need rows, length >= 1 "
                    "and finite seconds >= 0"
                )
        if shapes and not self.row_padding:
            raise ValueError(
                "CostModel.shape_s prices padded [rows, length] chunks: it needs row_padding=True"
            )
        object.__setattr__(self, "shape_s", shapes)
        object.__setattr__(self, "_by_shape", {(r, n): t for r, n, t in shapes})

    def padded(self, tokens: int) -> int:
        """The token count the learner actually runs for a chunk of `tokens` tokens."""
        if tokens < 0:
            raise ValueError(f"tokens={tokens} must be >= 0")
        if not self.buckets:
            return int(tokens)
        for b in self.buckets:
            if tokens <= b:
                return b
        top = self.buckets[-1]
        return -(-tokens // top) * top

    def chunk_s(self, tokens: int) -> float:
        """Seconds of learner work for one chunk of `tokens` (unpadded) tokens as one row."""
        return self.fixed_s + self.per_token_s * self.padded(tokens)

    def padded_shape(self, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, length) of the block a row-padded chunk of these trajectories runs as."""
        if not lengths:
            raise ValueError("a chunk needs at least one trajectory")
        return bucket_rows(len(lengths)), self.padded(int(max(lengths)))

    def padded_area(self, lengths: Sequence[int]) -> int:
        """Tokens the learner runs for a chunk whose trajectories have these lengths."""
        if not lengths:
            raise ValueError("a chunk needs at least one trajectory")
        if not self.row_padding:
            return self.padded(int(sum(lengths)))
        rows, length = self.padded_shape(lengths)
        return rows * length

    def chunk_cost(self, lengths: Sequence[int]) -> float:
        """Seconds of learner work for one chunk of trajectories with these token counts."""
        if self.shape_s:
            measured = self._by_shape.get(self.padded_shape(lengths))
            if measured is not None:
                return measured
        return self.fixed_s + self.per_token_s * self.padded_area(lengths)

    def affine(self) -> CostModel:
        """The same model without the per-shape measurements (the plain fixed + per-token line)."""
        return dataclasses.replace(self, shape_s=())

    @classmethod
    def fit(
        cls,
        samples: Iterable[Sequence[float]],
        *,
        opt_s: float = 0.0,
        pub_s: float = 0.0,
        buckets: Sequence[int] = (),
        row_padding: bool = False,
    ) -> CostModel:
        """Least-squares fit of fixed_s and per_token_s to (tokens, seconds) calibration pairs.

        Token counts are padded with `buckets` before fitting (padding a bucket
        value is a no-op, so passing already-padded counts is fine). With
        `row_padding`, pass each sample's `padded_area` instead: it is used as is.
        Negative estimates, possible with noisy timings, are clipped to 0.
        """
        pairs = np.asarray([tuple(s) for s in samples], dtype=np.float64)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise ValueError(f"samples must be (tokens, seconds) pairs; got shape {pairs.shape}")
        probe = cls(0.0, 0.0, buckets=tuple(buckets))
        if row_padding:
            x = pairs[:, 0].copy()
        else:
            x = np.asarray([probe.padded(int(t)) for t in pairs[:, 0]], dtype=np.float64)
        if len(np.unique(x)) < 2:
            raise ValueError(
                f"fit needs samples at >= 2 distinct padded token counts; got {sorted(set(x))}"
            )
        design = np.stack([np.ones_like(x), x], axis=1)
        (fixed, per_token), *_ = np.linalg.lstsq(design, pairs[:, 1], rcond=None)
        return cls(
            fixed_s=max(float(fixed), 0.0),
            per_token_s=max(float(per_token), 0.0),
            opt_s=opt_s,
            pub_s=pub_s,
            buckets=tuple(buckets),
            row_padding=row_padding,
        )
