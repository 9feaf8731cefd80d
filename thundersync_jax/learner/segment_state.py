"""The host-side state of the segment learner (`segments.py`): trajectories and results.

A `Trajectory` is threaded through `SegmentFns.score` / `close` (never kept inside them); its
device buffers live where `segment_layout.py` puts caches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np


class Segment(NamedTuple):
    """One forwarded segment (host side), kept for the reverse sweep.

    Attributes:
      start: cache slot (= position) of its first input token.
      inputs: int32 [T] the input tokens it forwarded (unpadded).
    """

    start: int
    inputs: np.ndarray


class Trajectory(NamedTuple):
    """The learner's state of one open trajectory.

    Attributes:
      k: [L, 1, S, K, H] keys of the forwarded tokens at θ (slots >= length are free).
      v: [L, 1, S, K, H] values.
      dk: float32 [L, 1, S, K, H] summed cotangents of the cached keys from later segments.
      dv: float32 [L, 1, S, K, H] the same for the values.
      length: tokens forwarded (cached) so far.
      pending: the latest token seen and not yet forwarded as an input (-1: none yet).
      segments: the forwarded segments, oldest first.
      shared: leading segments owned by a shared prefix (a group's prompt): `close` does not
        sweep them, and returns their cotangents instead.
    """

    k: jax.Array
    v: jax.Array
    dk: jax.Array
    dv: jax.Array
    length: int
    pending: int
    segments: tuple[Segment, ...]
    shared: int = 0

    @property
    def capacity(self) -> int:
        """Cache slots (S)."""
        return int(self.k.shape[2])

    @property
    def nbytes(self) -> int:
        """Device bytes of the kept cache and cotangent buffers (for `accum_bytes_peak`)."""
        return sum(int(x.size) * x.dtype.itemsize for x in (self.k, self.v, self.dk, self.dv))


class SegmentResult(NamedTuple):
    """What scoring one segment gives back.

    Attributes:
      grad: float32 pytree like the trainable params: the direct part Σ_t w_t ∇ log π(o_t),
        cached K/V held fixed.
      num_tokens: loss-masked tokens of the segment.
      student_logprobs: float32 [n] log π(o_t | o_<t) of the new tokens (0 where no context).
      weights: float32 [n] the per-token weights (OPD: Â_t on scored tokens, else 0), before
        the truncated importance weight.
      gap: the engine/learner gap sums of the scored tokens (`losses.logprob_gap.gap_sums`,
        device scalars), or None when nothing was scored.
    """

    grad: Any
    num_tokens: int
    student_logprobs: np.ndarray
    weights: np.ndarray
    gap: dict | None = None
