"""The learner's own token log-probs.

DESIGN §2: log-probs come from the learner's forward at the batch's parameters, never from the
sampler. `TokenLogprobFn` shares a score-gradient function's model structure, LoRA mode,
padding token, temperature and sequence buckets, and pads exactly as it does, so the log-probs
are those of the forward the gradient is taken through (OPD's advantages are built from them).

The objective inside every score-gradient chunk, Σ w·m·ρ·log π with its engine/learner gap
sums, is `losses.logprob_gap.policy_objective`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.learner import buckets
from thundersync_jax.learner.chunks import ScoreGradFn
from thundersync_jax.models import lora


class TokenLogprobFn:
    """Jitted forward: [B, T] log π(tokens[:, t] | tokens[:, <t]) (0 at t = 0).

    Attributes:
      compiles: compilations so far (one per padded shape).
    """

    def __init__(self, score_fn: ScoreGradFn):
        self.score_fn = score_fn
        self.compiles = 0
        self._jitted = jax.jit(self._forward)

    def _forward(self, params, base_params, tokens, routes=None):
        self.compiles += 1  # runs once per trace
        full = lora.merge(base_params, params) if self.score_fn.lora else params
        model = nnx.merge(self.score_fn.graphdef, full)
        if routes is not None and self.score_fn.routing == "replay":
            hidden, _ = model.hidden_states(tokens[:, :-1], routes=routes[:, :-1])
        else:
            hidden, _ = model.hidden_states(tokens[:, :-1])
        logp, _ = model.token_terms(hidden, tokens[:, 1:], self.score_fn.temperature)  # [B, T-1]
        return jnp.pad(logp, ((0, 0), (1, 0)))

    def __call__(
        self, params: Any, tokens: np.ndarray, base_params: Any = None, routes: Any = None
    ) -> np.ndarray:
        """[B, T] log-probs; `routes` [B, T, M, K] (MoE, -1 = none) are replayed under the
        score function's `routing="replay"` (as its gradient forward does)."""
        if self.score_fn.lora and base_params is None:
            raise ValueError("a LoRA log-prob function needs base_params (the frozen model)")
        tokens = np.asarray(tokens, np.int32)
        chunk = buckets.pad_chunk(
            tokens,
            np.zeros(tokens.shape, np.float32),
            None,
            self.score_fn.seq_buckets,
            self.score_fn.pad_id,
        )
        if routes is not None:
            routes = np.asarray(routes, np.int32)
            pad = [(0, p - n) for p, n in zip(chunk.tokens.shape, routes.shape[:2], strict=True)]
            routes = np.pad(routes, pad + [(0, 0), (0, 0)], constant_values=-1)
        logp = self._jitted(params, base_params, chunk.tokens, routes)
        return np.asarray(logp)[: tokens.shape[0], : tokens.shape[1]]
