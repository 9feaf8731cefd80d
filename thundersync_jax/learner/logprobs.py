"""The learner's own token log-probs, and what the score-gradient objective makes of them.

DESIGN §2: log-probs come from the learner's forward at the batch's parameters, never from the
sampler. `TokenLogprobFn` shares a score-gradient function's model structure, LoRA mode,
padding token, temperature and sequence buckets, and pads exactly as it does, so the log-probs
are those of the forward the gradient is taken through (OPD's advantages are built from them).

`policy_objective` is the objective inside every score-gradient chunk: Σ w·m·log π, and, given
the engine's log-probs of the same tokens, the engine/learner gap sums of that same forward
(aux outputs, `rollout.logprob_gap.gap_sums`) and optionally the truncated importance weight
min(π_learner / π_engine, cap) on each token (detached, so it streams exactly like w).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.learner import buckets
from thundersync_jax.models import lora
from thundersync_jax.rollout import logprob_gap

if TYPE_CHECKING:  # chunks imports this module (for policy_objective)
    from thundersync_jax.learner.chunks import ScoreGradFn


def policy_objective(
    logp: jax.Array,
    loss_mask: jax.Array,
    token_weights: jax.Array,
    engine_logprobs: jax.Array | None = None,
    tis_cap: float = 0.0,
) -> tuple[jax.Array, dict]:
    """(Σ w·m·ρ·log π, gap sums) over [B, T'] aligned arrays (position t scores token t).

    Args:
      logp: the learner's log π of each scored token (carries the gradient).
      loss_mask / token_weights: the chunk's mask and per-token weights.
      engine_logprobs: the engine's log-probs of the same tokens (NaN where it gave none), or
        None: then the objective is exactly Σ w·m·log π and the gap sums are {}.
      tis_cap: > 0 multiplies each token by ρ = min(π_learner / π_engine, tis_cap), detached
        (truncated importance sampling, DESIGN §2); 0 = ρ ≡ 1.
    """
    weights = loss_mask * token_weights
    if engine_logprobs is None:
        if tis_cap:
            raise ValueError("tis_cap > 0 needs the engine's log-probs of the chunk's tokens")
        return jnp.sum(logp * weights), {}
    gap = logprob_gap.gap_sums(engine_logprobs, logp, loss_mask > 0)
    if tis_cap:
        weights = weights * logprob_gap.truncated_importance_weight(logp, engine_logprobs, tis_cap)
    return jnp.sum(logp * weights), gap


class TokenLogprobFn:
    """Jitted forward: [B, T] log π(tokens[:, t] | tokens[:, <t]) (0 at t = 0).

    Attributes:
      compiles: compilations so far (one per padded shape).
    """

    def __init__(self, score_fn: ScoreGradFn):
        self.score_fn = score_fn
        self.compiles = 0
        self._jitted = jax.jit(self._forward)

    def _forward(self, params, base_params, tokens):
        self.compiles += 1  # runs once per trace
        full = lora.merge(base_params, params) if self.score_fn.lora else params
        model = nnx.merge(self.score_fn.graphdef, full)
        hidden, _ = model.hidden_states(tokens[:, :-1])
        logp, _ = model.token_terms(hidden, tokens[:, 1:], self.score_fn.temperature)  # [B, T-1]
        return jnp.pad(logp, ((0, 0), (1, 0)))

    def __call__(self, params: Any, tokens: np.ndarray, base_params: Any = None) -> np.ndarray:
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
        logp = self._jitted(params, base_params, chunk.tokens)
        return np.asarray(logp)[: tokens.shape[0], : tokens.shape[1]]
