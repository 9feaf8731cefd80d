"""Engine vs learner log-probs: the per-step gap metric and the truncated importance weight.

An engine that samples from other numbers than the learner's (vLLM's kernels, bf16) draws
token o_t with π_engine(o_t) while the learner's gradient is taken at π_learner. Both sides
give the per-token log-probs of the same sampled tokens, each its own:

    gap = engine_logprob_gap(engine_lp, learner_lp, mask)
        # {"engine_logprob_gap_abs": mean |Δ|, "engine_logprob_gap_kl": KL(engine ‖ learner),
        #  "engine_logprob_gap_max": max |Δ|}, Δ = log π_engine − log π_learner, masked tokens

    w = truncated_importance_weight(learner_lp, engine_lp, cap=2.0)
        # min(π_learner / π_engine, cap) per token, gradient stopped (DESIGN §2)

The training loop takes the learner side from the score-gradient forward itself (no second
forward): each chunk returns `gap_sums` as aux outputs, `GapTally` folds them over the step
and writes the metrics. An engine that cannot report a token's log-prob sends NaN for it
(`rollout.protocol.GenerateResult`); such tokens are left out of the gap (a step with none
left has no gap metrics at all, never a 0) and get weight 1 (nothing to correct with).

The KL is estimated from the engine's own samples with the k3 estimator
exp(−Δ) − 1 + Δ ≥ 0 (unbiased for KL(π_engine ‖ π_learner), low variance).

The weight is a detached per-token factor exactly like the 1/n_i of DESIGN §2: the learner
multiplies each token's score-gradient term by it (inside the chunk, before the row sum), so
h_i = Σ_t w_t ∇ log π(o_t) streams exactly. All jnp functions here are jit-able.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

GAP_KEYS = ("engine_logprob_gap_abs", "engine_logprob_gap_kl", "engine_logprob_gap_max")


def gap_sums(
    engine_logprobs: Float[Array, "B T"],
    learner_logprobs: Float[Array, "B T"],
    mask: Bool[Array, "B T"] | None = None,
) -> dict[str, jax.Array]:
    """Σ |Δ|, Σ k3, max |Δ| and the token count over the masked tokens with an engine log-prob.

    The sums of one chunk, to be folded over a step (`GapTally`). Tokens whose engine
    log-prob is not finite (NaN: the engine gave none) do not count. No gradient flows.
    """
    e = jnp.asarray(engine_logprobs, jnp.float32)
    lrn = jax.lax.stop_gradient(jnp.asarray(learner_logprobs, jnp.float32))
    if e.shape != lrn.shape:
        raise ValueError(f"engine log-probs {e.shape} and learner log-probs {lrn.shape} differ")
    m = jnp.ones(e.shape, bool) if mask is None else jnp.asarray(mask, bool)
    if m.shape != e.shape:
        raise ValueError(f"mask {m.shape} does not match the log-probs {e.shape}")
    m = m & jnp.isfinite(e)
    delta = jnp.where(m, e - lrn, 0.0)
    k3 = jnp.expm1(-delta) + delta  # exp(−Δ) − 1 + Δ; 0 where left out (Δ = 0)
    return {
        "abs_sum": jnp.sum(jnp.abs(delta)),
        "kl_sum": jnp.sum(k3),
        "max_abs": jnp.max(jnp.abs(delta), initial=0.0),
        "tokens": jnp.sum(m, dtype=jnp.int32),
    }


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
    s = gap_sums(engine_logprobs, learner_logprobs, mask)
    n = jnp.maximum(s["tokens"], 1)
    return {
        "engine_logprob_gap_abs": s["abs_sum"] / n,
        "engine_logprob_gap_kl": s["kl_sum"] / n,
        "engine_logprob_gap_max": s["max_abs"],
    }


class GapTally(NamedTuple):
    """The gap sums of a step's chunks so far (plain Python numbers; float64 sums).

    Attributes:
      abs_sum / kl_sum: Σ |Δ| and Σ k3 over the counted tokens.
      max_abs: the largest |Δ| seen.
      tokens: tokens with an engine log-prob.
      route_differ / route_sets: MoE policies: token x layer top-k sets where the learner's
        own router chose other experts than the engine reported, of those compared.
    """

    abs_sum: float = 0.0
    kl_sum: float = 0.0
    max_abs: float = 0.0
    tokens: int = 0
    route_differ: float = 0.0
    route_sets: float = 0.0

    def add(self, sums: dict) -> GapTally:
        """This tally plus one chunk's `gap_sums` (device scalars are read here)."""
        return GapTally(
            self.abs_sum + float(sums["abs_sum"]),
            self.kl_sum + float(sums["kl_sum"]),
            max(self.max_abs, float(sums["max_abs"])),
            self.tokens + int(sums["tokens"]),
            self.route_differ + float(sums.get("route_differ", 0.0)),
            self.route_sets + float(sums.get("route_sets", 0.0)),
        )

    def metrics(self) -> dict[str, float]:
        """The step's `engine_logprob_gap_*` metrics ({} when no token had an engine log-prob)
        and, for MoE policies, `routing_disagreement` (fraction of compared top-k sets)."""
        out = {}
        if self.tokens:
            values = (self.abs_sum / self.tokens, self.kl_sum / self.tokens, self.max_abs)
            out.update(zip(GAP_KEYS, values, strict=True))
        if self.route_sets:
            out["routing_disagreement"] = self.route_differ / self.route_sets
        return out


def check_tis_cap(cap) -> float:
    """`rl.tis_cap` as a float: 0 (off) or a finite cap >= 1; anything else is a ValueError."""
    try:
        value = float(cap)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(cap, bool) or not (value == 0.0 or (math.isfinite(value) and value >= 1.0)):
        raise ValueError(
            f"rl.tis_cap={cap!r} is not valid: use 0 (no importance correction) or a finite "
            "cap >= 1 (the truncated weight min(π_learner / π_engine, cap); 2 is common)"
        )
    return value


def truncated_importance_weight(
    learner_logprobs: Float[Array, "B T"],
    engine_logprobs: Float[Array, "B T"],
    cap: float = 2.0,
) -> Float[Array, "B T"]:
    """min(π_learner / π_engine, cap) per token, with the gradient stopped (a constant weight).

    A token without an engine log-prob (NaN) gets weight 1.

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
    known = jnp.isfinite(e)
    # exp of the clipped log-ratio: never overflows, and equals min(exp(Δ), cap).
    w = jnp.exp(jnp.minimum(lrn - jnp.where(known, e, lrn), jnp.log(jnp.float32(cap))))
    return jnp.where(known, w, 1.0)


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
    gap = gap_sums(engine_logprobs, logp, loss_mask > 0)
    if tis_cap:
        weights = weights * truncated_importance_weight(logp, engine_logprobs, tis_cap)
    return jnp.sum(logp * weights), gap
