"""KL-to-reference and entropy regularizers for every algorithm (DESIGN §2 "Regularizers").

The terms do not depend on the group (GRPO) or the turn (OPD), so each chunk's gradient goes
straight into the global tally of an `accumulators.combine(...)` accumulator; the policy part
is untouched.
Loss convention (as `accumulators.combine`): L = L_policy + Σ coef · (1/Z) Σ_i w_i Σ_t term_t,
with the policy's w_i and Z. A KL penalty enters with coef = +kl_coef, an entropy bonus with
coef = −entropy_coef (config values are both >= 0).

The gradient of a term is not a score gradient (for k3 it is Σ_t (1 − π_ref/π)·∇ log π, for
entropy it flows through the whole softmax), so it has its own jitted function:

    g_term = ∇θ Σ_b Σ_t w[b,t] · m[b,t] · term(θ)[b,t]

One forward and one VJP pass per chunk serve every enabled term; the reference policy's
log-probs come from a forward of the frozen reference parameters inside the same program.
Chunks are padded with `learner.buckets.pad_chunk`, exactly as the score-gradient chunks are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax import accumulators, losses
from thundersync_jax.learner import buckets, chunks
from thundersync_jax.models import lora

KL_ESTIMATORS = {"k1": losses.kl_k1, "k3": losses.kl_k3}
KL = "kl"
ENTROPY = "entropy"


def term_coefficients(rl_config) -> dict[str, float]:
    """{term name: loss coefficient} for the enabled terms of the `rl` config section."""
    terms = {}
    if float(rl_config.kl_coef) > 0:
        if rl_config.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"rl.kl_estimator={rl_config.kl_estimator!r} is not valid; "
                f"choose one of: {', '.join(KL_ESTIMATORS)}"
            )
        terms[KL] = float(rl_config.kl_coef)
    if float(rl_config.entropy_coef) > 0:
        terms[ENTROPY] = -float(rl_config.entropy_coef)  # a bonus: maximizing entropy
    return terms


def combined_accumulator(policy_acc, coefficients: dict[str, float]):
    """`accumulators.combine(policy_acc, ...)` with each term aggregated like the policy."""
    return accumulators.combine(
        policy_acc, **{name: accumulators.regularizer(c) for name, c in coefficients.items()}
    )


class RegularizerGradFn:
    """Per-chunk gradients of the enabled regularizer terms (see the module docstring).

    Args:
      graphdef: the model structure (`nnx.split(model, nnx.Param)[0]`).
      terms: names of the enabled terms, a subset of ("kl", "entropy").
      reference_params: the frozen reference policy's full params (needed with "kl").
      kl_estimator: "k1" or "k3".
      seq_buckets: padded sequence lengths (as the score-gradient function's).
      lora_adapters: trainable params are LoRA adapters over `base_params`.
      pad_id: padding token id.
      temperature: the rollout temperature: both policies are taken as softmax(logits / T),
        the distributions the tokens were (or would be) sampled from.

    Attributes:
      compiles: compilations so far (one per padded shape).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        terms: Sequence[str],
        reference_params: Any = None,
        *,
        kl_estimator: str = "k3",
        seq_buckets: Sequence[int] = (128, 256, 512, 1024, 2048),
        lora_adapters: bool = False,
        pad_id: int = 0,
        temperature: float = 1.0,
    ):
        unknown = set(terms) - {KL, ENTROPY}
        if unknown or not terms:
            raise ValueError(f"terms={tuple(terms)}: need a non-empty subset of ('kl', 'entropy')")
        if KL in terms and reference_params is None:
            raise ValueError("the KL term needs reference_params (the frozen reference policy)")
        if kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
        self.graphdef = graphdef
        self.terms = tuple(terms)
        self.reference_params = reference_params
        self.kl = KL_ESTIMATORS[kl_estimator]
        self.seq_buckets = buckets.validate_buckets(seq_buckets)
        self.lora = bool(lora_adapters)
        self.pad_id = int(pad_id)
        self.temperature = chunks.check_temperature(temperature)
        self.compiles = 0
        self._jitted = jax.jit(self._grads)

    def _terms(self, params, tokens, with_entropy):
        """(log π of the next tokens, entropies or None), tiled over tokens (no [T, V])."""
        model = nnx.merge(self.graphdef, params)
        hidden, _ = model.hidden_states(tokens[:, :-1])  # position t-1 predicts t
        return model.token_terms(hidden, tokens[:, 1:], self.temperature, with_entropy)

    def _grads(self, params, base_params, reference_params, tokens, loss_mask, token_weights):
        self.compiles += 1  # runs once per trace
        weights = loss_mask[:, 1:] * token_weights[:, 1:]  # position 0 is never scored
        ref_logp = None
        if KL in self.terms:
            ref_logp, _ = self._terms(jax.lax.stop_gradient(reference_params), tokens, False)

        def term_sums(trainable):
            full = (
                lora.merge(jax.lax.stop_gradient(base_params), trainable)
                if self.lora
                else trainable
            )
            logp, ent = self._terms(full, tokens, ENTROPY in self.terms)
            out = {}
            if KL in self.terms:
                out[KL] = jnp.sum(self.kl(logp, ref_logp) * weights)
            if ENTROPY in self.terms:
                out[ENTROPY] = jnp.sum(ent * weights)
            return out

        sums, pullback = jax.vjp(term_sums, params)
        grads = {}
        for name in self.terms:
            cotangent = {
                n: jnp.ones_like(s) if n == name else jnp.zeros_like(s) for n, s in sums.items()
            }
            (g,) = pullback(cotangent)
            grads[name] = jax.tree.map(lambda x: x.astype(jnp.float32), g)
        return grads

    def __call__(
        self,
        params: Any,
        tokens: np.ndarray,
        loss_mask: np.ndarray,
        token_weights: np.ndarray | None = None,
        base_params: Any = None,
    ) -> dict[str, Any]:
        """{term: Σ_b Σ_t w·m·∇ term_t} float32 pytrees shaped like `params`, for one chunk.

        Args mirror `learner.chunks.ScoreGradFn.__call__` (same padding, same weights).
        """
        if self.lora and base_params is None:
            raise ValueError("a LoRA regularizer-gradient function needs base_params")
        chunk = buckets.pad_chunk(tokens, loss_mask, token_weights, self.seq_buckets, self.pad_id)
        return self._jitted(
            params,
            base_params,
            self.reference_params,
            chunk.tokens,
            chunk.loss_mask,
            chunk.token_weights,
        )
