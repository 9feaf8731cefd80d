"""Per-token log-probabilities and the KL / entropy terms built on them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def token_logprobs(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"]
) -> Float[Array, "B T"]:
    """log π(targets[b, t] | ·) from logits, with the log-softmax taken in float32.

    bf16 logits are upcast first: a bf16 log-sum-exp over a large vocabulary
    loses the ~3 significant digits that the PPO ratio and KL terms live on.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)
    return picked[..., 0] - log_z


def kl_k1(logp: Float[Array, "B T"], ref_logp: Float[Array, "B T"]) -> Float[Array, "B T"]:
    """k1 estimator of KL(π ‖ π_ref) per sampled token: log π − log π_ref."""
    return logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)


def kl_k3(logp: Float[Array, "B T"], ref_logp: Float[Array, "B T"]) -> Float[Array, "B T"]:
    """k3 estimator (Schulman): exp(ref − logp) − (ref − logp) − 1, ≥ 0 and unbiased."""
    delta = ref_logp.astype(jnp.float32) - logp.astype(jnp.float32)
    # expm1 keeps the result accurate (and exactly 0) when the policies agree.
    return jnp.expm1(delta) - delta


def entropy(logits: Float[Array, "B T V"]) -> Float[Array, "B T"]:
    """Entropy of the next-token distribution at each position, in float32 (nats)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
