"""Engine vs learner log-probs: the per-step gap metric and the truncated importance weight.

An engine that samples from other numbers than the learner's (vLLM's kernels, bf16) draws
token o_t with π_engine(o_t) while the learner's gradient is taken at π_learner. Both
functions take the per-token log-probs of the same sampled tokens, each side's own:

    gap = engine_logprob_gap(engine_lp, learner_lp, mask)
        # {"engine_logprob_gap_abs": mean |Δ|, "engine_logprob_gap_kl": KL(engine ‖ learner),
        #  "engine_logprob_gap_max": max |Δ|}, Δ = log π_engine − log π_learner, masked tokens

    w = truncated_importance_weight(learner_lp, engine_lp, cap=2.0)
        # min(π_learner / π_engine, cap) per token, gradient stopped (DESIGN §2)

The KL is estimated from the engine's own samples with the k3 estimator
exp(−Δ) − 1 + Δ ≥ 0 (unbiased for KL(π_engine ‖ π_learner), low variance).

The weight is a detached per-token factor exactly like the 1/n_i of DESIGN §2: the learner
multiplies each token's score-gradient term by it (inside the chunk, before the row sum), so
h_i = Σ_t w_t ∇ log π(o_t) streams exactly. Both are pure jnp functions (jit-able).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


def engine_logprob_gap(
    engine_logprobs: Float[Array, "B T"],
    learner_logprobs: Float[Array, "B T"],
    mask: Bool[Array, "B T"] | None = None,
) -> dict[str, jax.Array]:
    """Mean |Δ|, KL(engine ‖ learner) (k3) and max |Δ| over the masked tokens (float32 scalars).

    Args:
      engine_logprobs: log π_engine of each sampled token, as the engine reported it.
      learner_logprobs: log π_learner of the same tokens from the learner's forward.
      mask: the tokens that count (the sampled, loss-masked ones); None = all.
    """
    e = jnp.asarray(engine_logprobs, jnp.float32)
    lrn = jnp.asarray(learner_logprobs, jnp.float32)
    if e.shape != lrn.shape:
        raise ValueError(f"engine log-probs {e.shape} and learner log-probs {lrn.shape} differ")
    m = jnp.ones(e.shape, bool) if mask is None else jnp.asarray(mask, bool)
    if m.shape != e.shape:
        raise ValueError(f"mask {m.shape} does not match the log-probs {e.shape}")
    delta = jnp.where(m, e - lrn, 0.0)
    n = jnp.maximum(jnp.sum(m), 1)
    k3 = jnp.expm1(-delta) + delta  # exp(−Δ) − 1 + Δ; 0 where masked out (Δ = 0)
    return {
        "engine_logprob_gap_abs": jnp.sum(jnp.abs(delta)) / n,
        "engine_logprob_gap_kl": jnp.sum(k3) / n,
        "engine_logprob_gap_max": jnp.max(jnp.abs(delta)),
    }


def truncated_importance_weight(
    learner_logprobs: Float[Array, "B T"],
    engine_logprobs: Float[Array, "B T"],
    cap: float = 2.0,
) -> Float[Array, "B T"]:
    """min(π_learner / π_engine, cap) per token, with the gradient stopped (a constant weight).

    Args:
      learner_logprobs: log π_learner of the sampled tokens (may carry a gradient: stopped).
      engine_logprobs: log π_engine of the same tokens.
      cap: the truncation C > 0 (truncated importance sampling); larger keeps more of the
        correction and more variance.
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    lrn = jax.lax.stop_gradient(jnp.asarray(learner_logprobs, jnp.float32))
    e = jnp.asarray(engine_logprobs, jnp.float32)
    # exp of the clipped log-ratio: never overflows, and equals min(exp(Δ), cap).
    return jnp.exp(jnp.minimum(lrn - e, jnp.log(jnp.float32(cap))))
