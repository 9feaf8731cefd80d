"""Token log-probabilities and per-token KL / entropy terms (float32 math).

from thundersync_jax import losses
lp = losses.token_logprobs(logits, targets)    # [B, T, V], [B, T] -> [B, T] float32
kl = losses.kl_k3(lp, ref_lp)                  # per token
ent = losses.entropy(logits)                   # per token
"""

from thundersync_jax.losses._tiled import tiled_token_terms
from thundersync_jax.losses._token_terms import entropy, kl_k1, kl_k3, token_logprobs

__all__ = ["entropy", "kl_k1", "kl_k3", "tiled_token_terms", "token_logprobs"]
