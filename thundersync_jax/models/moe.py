"""Sparse mixture-of-experts feed-forward block: router, dropless experts, shared experts.

Axis letters: N tokens (batch and time flattened), D hidden, E routed experts, F expert width,
K experts per token (top-k), G expert groups.

Routing, as transformers computes it:
  softmax  (Qwen3-MoE)  p = softmax(logits); top-k of p; weights = p at those experts,
                        renormalized to sum 1 when `norm_topk_prob`.
  sigmoid  (GLM-4.7-Flash, DeepSeek-V3)  s = sigmoid(logits); the choice uses s + bias (the
                        e_score_correction_bias) restricted to the `topk_group` best groups (a
                        group scores the sum of its 2 best members); weights = s (without the
                        bias) at the chosen experts, renormalized when `norm_topk_prob`, times
                        `routed_scaling_factor`.

Routing replay: given `routes` (the experts another forward chose, e.g. the inference engine's)
the block uses those experts and recomputes their gate weights from its own router scores, so
the router still gets a gradient through the weights. This is what Megatron-LM's RouterReplay
(used by verl's R3 and NeMo-RL) does, and the only thing vLLM's `routed_experts` can feed (it
reports expert ids, not weights). The block also returns its own top-k choice, so a caller can
measure how often its router disagrees with the replayed one.

Experts are dropless: every (token, expert) pair is computed. Pairs are sorted by expert and
multiplied by `jax.lax.ragged_dot` (one grouped matmul per projection, no capacity factor).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from thundersync_jax.models.qwen3 import Linear

_INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class MoeSpec:
    """Shape and routing rule of one sparse MoE block.

    Attributes:
      hidden_size: D.
      num_experts: routed experts E.
      top_k: experts per token K.
      expert_size: width F of one routed expert.
      scoring: "softmax" (Qwen3-MoE) or "sigmoid" (GLM / DeepSeek-V3).
      norm_topk_prob: renormalize the K gate weights to sum 1.
      n_group, topk_group: sigmoid only: experts in n_group groups; only the topk_group best
        groups are eligible.
      routed_scaling_factor: multiplies the routed experts' weights (sigmoid only).
      correction_bias: the router has an e_score_correction_bias. It only shifts the
        (discrete) choice, never a weight, so no gradient reaches it: the policy gradient
        cannot move it (the optimizer also exempts it from weight decay).
      shared_size: width of the shared-expert SwiGLU (0: none).
    """

    hidden_size: int
    num_experts: int
    top_k: int
    expert_size: int
    scoring: str = "softmax"
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False
    shared_size: int = 0

    def __post_init__(self):
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring={self.scoring!r}; valid: 'softmax', 'sigmoid'")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, num_experts={self.num_experts}]")
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"n_group={self.n_group} must divide num_experts={self.num_experts} and "
                f"1 <= topk_group={self.topk_group} <= n_group"
            )


def _param(rngs, init, shape, dtype, axes) -> nnx.Param:
    annotated = nnx.with_partitioning(init, axes, eager_sharding=False)
    return nnx.Param(annotated(rngs.params(), tuple(shape), dtype))


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)): the dense MLP and the shared experts."""

    def __init__(self, d: int, f: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
        self.up_proj = Linear("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
        self.down_proj = Linear("BTF,FD->BTD", (f, d), ("mlp", "embed"), **kw)

    def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nnx.Module):
    """Router logits in float32, the top-k choice, and the gate weights of chosen experts."""

    def __init__(self, spec: MoeSpec, *, param_dtype, rngs: nnx.Rngs):
        self.spec = spec
        init = nnx.initializers.normal(_INIT_STD)
        self.kernel = _param(
            rngs, init, (spec.hidden_size, spec.num_experts), param_dtype, ("embed", "expert")
        )
        if spec.correction_bias:
            zeros = nnx.initializers.zeros
            self.e_score_correction_bias = _param(
                rngs, zeros, (spec.num_experts,), param_dtype, ("expert",)
            )
        else:
            self.e_score_correction_bias = None

    def scores(self, x: Float[Array, "N D"]) -> Float[Array, "N E"]:
        """Per-expert scores: softmax probabilities or sigmoids of the float32 logits."""
        logits = jnp.einsum(
            "ND,DE->NE", x.astype(jnp.float32), self.kernel[...].astype(jnp.float32)
        )
        if self.spec.scoring == "softmax":
            return jax.nn.softmax(logits, axis=-1)
        return jax.nn.sigmoid(logits)

    def select(self, scores: Float[Array, "N E"]) -> Int[Array, "N K"]:
        """The router's own top-k experts (no gradient flows through a choice)."""
        spec = self.spec
        choice = jax.lax.stop_gradient(scores)
        if self.e_score_correction_bias is not None:
            choice = choice + self.e_score_correction_bias[...].astype(jnp.float32)
        if spec.n_group > 1:
            n = choice.shape[0]
            grouped = choice.reshape(n, spec.n_group, spec.num_experts // spec.n_group)
            group_scores = jax.lax.top_k(grouped, min(2, grouped.shape[-1]))[0].sum(-1)  # [N,G]
            _, best = jax.lax.top_k(group_scores, spec.topk_group)  # [N, topk_group]
            keep = jnp.zeros_like(group_scores, bool).at[jnp.arange(n)[:, None], best].set(True)
            keep = jnp.repeat(keep, spec.num_experts // spec.n_group, axis=1)  # [N, E]
            choice = jnp.where(keep, choice, -jnp.inf)
        return jax.lax.top_k(choice, spec.top_k)[1].astype(jnp.int32)

    def weights(self, scores: Float[Array, "N E"], experts: Int[Array, "N K"]) -> Array:
        """Gate weights [N, K] float32 of `experts` from `scores` (differentiable)."""
        w = jnp.take_along_axis(scores, experts, axis=-1)
        if self.spec.norm_topk_prob:
            # GLM adds 1e-20 to the denominator; Qwen3-MoE does not (softmax sums are > 0).
            eps = 1e-20 if self.spec.scoring == "sigmoid" else 0.0
            w = w / (w.sum(-1, keepdims=True) + eps)
        if self.spec.scoring == "sigmoid":
            w = w * self.spec.routed_scaling_factor
        return w


class Experts(nnx.Module):
    """E SwiGLU experts stored stacked ([E, ...]); dropless grouped matmuls."""

    def __init__(self, spec: MoeSpec, *, dtype, param_dtype, rngs: nnx.Rngs):
        e, d, f = spec.num_experts, spec.hidden_size, spec.expert_size
        init = nnx.initializers.normal(_INIT_STD)
        self.dtype = dtype
        self.gate_proj = _param(rngs, init, (e, d, f), param_dtype, ("expert", "embed", "mlp"))
        self.up_proj = _param(rngs, init, (e, d, f), param_dtype, ("expert", "embed", "mlp"))
        self.down_proj = _param(rngs, init, (e, f, d), param_dtype, ("expert", "mlp", "embed"))

    def __call__(
        self, x: Float[Array, "N D"], experts: Int[Array, "N K"], weights: Float[Array, "N K"]
    ) -> Float[Array, "N D"]:
        n, k = experts.shape
        num_experts = self.gate_proj.shape[0]
        flat = experts.reshape(-1)  # [N*K]
        order = jnp.argsort(flat, stable=True)  # pairs sorted by expert
        token = order // k  # [N*K] the token of each sorted pair
        sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)  # [E]
        xs = x.astype(self.dtype)[token]  # [N*K, D]
        cast = lambda p: p[...].astype(self.dtype)  # noqa: E731
        f32 = jnp.float32
        gate = jax.lax.ragged_dot(xs, cast(self.gate_proj), sizes, preferred_element_type=f32)
        up = jax.lax.ragged_dot(xs, cast(self.up_proj), sizes, preferred_element_type=f32)
        h = (jax.nn.silu(gate) * up).astype(self.dtype)  # [N*K, F]
        y = jax.lax.ragged_dot(h, cast(self.down_proj), sizes, preferred_element_type=f32)
        y = y * weights.reshape(-1)[order][:, None]  # [N*K, D] float32
        return jnp.zeros((n, x.shape[-1]), f32).at[token].add(y)


class SparseMoe(nnx.Module):
    """Routed experts (+ shared experts): x -> (output, the router's own top-k choice)."""

    def __init__(self, spec: MoeSpec, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.spec = spec
        self.dtype = dtype
        self.gate = Router(spec, param_dtype=param_dtype, rngs=rngs)
        self.experts = Experts(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.shared_experts = (
            SwiGLU(spec.hidden_size, spec.shared_size, **kw) if spec.shared_size else None
        )

    def __call__(
        self, x: Float[Array, "B T D"], routes: Int[Array, "B T K"] | None = None
    ) -> tuple[Float[Array, "B T D"], Int[Array, "B T K"]]:
        """Output, and the router's own choice (also when `routes` replays another's)."""
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        scores = self.gate.scores(flat)  # [N, E] float32
        own = self.gate.select(scores)  # [N, K]
        use = own
        if routes is not None:
            # A token whose given route has a -1 (none reported) keeps its own choice.
            given = routes.reshape(b * t, -1).astype(jnp.int32)
            use = jnp.where(jnp.all(given >= 0, axis=-1, keepdims=True), given, own)
        out = self.experts(flat, use, self.gate.weights(scores, use))
        out = out.reshape(b, t, d).astype(self.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out, own.reshape(b, t, -1)


def routing_disagreement(own: Int[Array, "... K"], given: Int[Array, "... K"], valid=None):
    """Fraction of (token, layer) top-k sets where `own` differs from `given` (as sets).

    `valid` (bool, broadcastable to own.shape[:-1]) restricts the count to real tokens.
    Returns (disagreeing count, counted sets) as float32 scalars, so callers can sum batches.
    """
    a, b = jnp.sort(own, axis=-1), jnp.sort(given.astype(own.dtype), axis=-1)
    differ = jnp.any(a != b, axis=-1)
    valid = jnp.ones_like(differ) if valid is None else jnp.broadcast_to(valid, differ.shape)
    return (differ & valid).sum().astype(jnp.float32), valid.sum().astype(jnp.float32)
