"""Jitted score-gradient chunks: h = Σ_b Σ_t w[b,t]·m[b,t]·∇ log π(o[b,t] | o[b,<t]).

π is the distribution the rollout engine samples from: softmax(logits / temperature). A
rollout temperature below 1 therefore stays on-policy as long as the learner is built with the
same `temperature` (the trainer passes `config.rollout.temperature`).

One call covers one trajectory, or several trajectories of the same (group, reward) slot packed
as rows (OPD's `trajectory` granularity: every scored turn masked in). Per-turn OPD runs on the
learner's own KV cache instead (`segments.py`: no prefix re-run per turn).

Shapes are padded to buckets (see `buckets.py`) so the number of compilations is bounded;
`fn.compiles` counts them per function (the loop reports each step's new compilations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from thundersync_jax.learner import buckets
from thundersync_jax.losses import logprob_gap
from thundersync_jax.models import lora, moe


def _weighted_logprob_sum(
    model: Any,
    tokens: Int[Array, "B T"],
    loss_mask: Float[Array, "B T"],
    token_weights: Float[Array, "B T"],
    temperature: float = 1.0,
    engine_logprobs: Float[Array, "B T"] | None = None,
    tis_cap: float = 0.0,
    routes: Int[Array, "B T M K"] | None = None,
    replay: bool = True,
) -> tuple[Float[Array, ""], dict]:
    """(Σ w·m·log π(tokens[:, t] | tokens[:, <t]), engine gap sums); position 0 is never scored.

    With `engine_logprobs` the same forward also gives the engine/learner gap sums and, with
    `tis_cap` > 0, each token's truncated importance weight (`losses.logprob_gap.policy_objective`).
    With `routes` (a MoE policy; -1 = none reported) the forward replays them when `replay`
    (else routes by itself) and the sums also count the token x layer top-k sets where the
    learner's own router disagrees with them (`route_differ` of `route_sets`).
    """
    if routes is None:
        hidden, _ = model.hidden_states(tokens[:, :-1])  # [B, T-1, D]: t-1 predicts t
        route_sums = {}
    else:
        given = routes[:, :-1]  # [B, T-1, M, K]
        hidden, _, own = model.hidden_states(
            tokens[:, :-1], routes=given if replay else None, return_routes=True
        )
        differ, sets = moe.routing_disagreement(own, given, jnp.all(given >= 0, axis=-1))
        route_sums = {"route_differ": differ, "route_sets": sets}
    logp, _ = model.token_terms(hidden, tokens[:, 1:], temperature)  # [B, T-1] float32
    engine = None if engine_logprobs is None else engine_logprobs[:, 1:]
    total, gap = logprob_gap.policy_objective(
        logp, loss_mask[:, 1:], token_weights[:, 1:], engine, tis_cap
    )
    return total, {**gap, **route_sums}


ROUTING_MODES = ("replay", "recompute")


def tempered(logits: Float[Array, "B T V"], temperature: float) -> Float[Array, "B T V"]:
    """logits / temperature: the logits of the sampling distribution (1.0 leaves them as is)."""
    return logits if temperature == 1.0 else logits / jnp.float32(temperature)


def check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (t > 0 and np.isfinite(t)):  # also rejects NaN
        raise ValueError(
            f"temperature={temperature!r} must be a finite number > 0: the learner scores "
            "softmax(logits / temperature); greedy (0) sampling has no score gradient"
        )
    return t


class ScoreGradFn:
    """A jitted score-gradient function with a compile counter (see `make_score_grad_fn`).

    Attributes:
      seq_buckets: allowed padded sequence lengths (sorted).
      remat: per-layer rematerialization in the backward pass.
      lora: whether the trainable parameters are LoRA adapters over frozen base params.
      temperature: the rollout sampling temperature the log-probs are taken at.
      tis_cap: > 0 weights each token by min(π_learner / π_engine, tis_cap) (`score_and_gap`).
      routing: MoE policies: "replay" the engine's routes in the forward, or "recompute".
      compiles: number of compilations so far (one per distinct padded shape / tree layout).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        seq_buckets: Sequence[int],
        remat: bool = False,
        lora_adapters: bool = False,
        pad_id: int = 0,
        out_shardings: Any = None,
        temperature: float = 1.0,
        rows: Any = None,
        tis_cap: float = 0.0,
        routing: str = "replay",
    ):
        if routing not in ROUTING_MODES:
            raise ValueError(f"model.routing={routing!r}; valid: {ROUTING_MODES}")
        self.routing = routing
        self.graphdef = graphdef
        self.tis_cap = float(tis_cap)
        self.rows = rows
        self.temperature = check_temperature(temperature)
        self.seq_buckets = buckets.validate_buckets(seq_buckets)
        self.remat = bool(remat)
        self.lora = bool(lora_adapters)
        self.pad_id = int(pad_id)
        self.compiles = 0
        jit_kwargs = {}
        if out_shardings is not None:
            # The gap sums are scalars: replicated over the parameters' mesh.
            mesh = jax.tree.leaves(out_shardings)[0].mesh
            scalars = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            jit_kwargs = {"out_shardings": (out_shardings, scalars)}
        # One program per padded shape, with or without engine log-probs (NaN: none given).
        self._jitted = jax.jit(self._score_grad, **jit_kwargs)

    def _model(self, params: Any, base_params: Any) -> Any:
        full = lora.merge(jax.lax.stop_gradient(base_params), params) if self.lora else params
        model = nnx.merge(self.graphdef, full)
        if self.remat:
            if not hasattr(model, "remat"):
                raise ValueError(
                    f"{type(model).__name__} has no `remat` switch for per-layer remat"
                )
            model.remat = True  # the model wraps each decoder layer in nnx.remat
        return model

    def _score_grad(
        self, params, base_params, tokens, loss_mask, token_weights, engine_lp=None, routes=None
    ):
        # Runs once per trace, i.e. once per compilation of this jitted function. The calls
        # always pass engine_lp (NaN where none); None (tracing by hand) gives no gap sums.
        self.compiles += 1

        def objective(trainable):
            model = self._model(trainable, base_params)
            return _weighted_logprob_sum(
                model,
                tokens,
                loss_mask,
                token_weights,
                self.temperature,
                engine_lp,
                self.tis_cap,
                routes,
                self.routing == "replay",
            )

        grads, gap = jax.grad(objective, has_aux=True)(params)
        # Tallies are float32 whatever the param dtype (bf16 grads are upcast once, here).
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads), gap

    def lower(self, params, base_params, tokens, loss_mask, token_weights):
        """The jitted program lowered at these (possibly abstract) arguments (`--dry_run`).

        The engine log-probs are shaped, typed and laid out like `token_weights`.
        """
        engine = token_weights
        return self._jitted.lower(params, base_params, tokens, loss_mask, token_weights, engine)

    def _padded(self, tokens, loss_mask, token_weights, engine_logprobs):
        chunk = buckets.pad_chunk(tokens, loss_mask, token_weights, self.seq_buckets, self.pad_id)
        if not np.all((chunk.loss_mask == 0) | (chunk.loss_mask == 1)):
            raise ValueError("loss_mask must hold only 0 and 1 (put weights in token_weights)")
        if engine_logprobs is None:
            engine_logprobs = np.full(np.shape(tokens), np.nan, np.float32)
        e = np.asarray(engine_logprobs, np.float32)
        if e.shape != np.shape(tokens):
            raise ValueError(f"engine_logprobs {e.shape} must match tokens {np.shape(tokens)}")
        pad = [(0, p - n) for p, n in zip(chunk.tokens.shape, e.shape, strict=True)]
        arrays = [chunk.tokens, chunk.loss_mask, chunk.token_weights, np.pad(e, pad)]
        if self.rows is not None:
            arrays = place_rows(arrays, self.rows)  # padding rows have mask 0: never counted
        return tuple(arrays), int(chunk.loss_mask.sum())

    def __call__(
        self,
        params: Any,
        tokens: Int[Array, "B T"] | np.ndarray,
        loss_mask: Float[Array, "B T"] | np.ndarray,
        token_weights: Float[Array, "B T"] | np.ndarray | None = None,
        base_params: Any = None,
    ) -> tuple[Any, int]:
        """Returns (h, n): h the float32 score-gradient pytree (shaped like `params`), n = Σ mask.

        Args:
          params: trainable parameters: the model params, or LoRA `Adapters` when built with
            `lora=True` (then h is shaped like the adapters).
          tokens: int [B, T]; row b is one sequence (prompt and completion), right-padded.
          loss_mask: [B, T] 0/1; 1 scores tokens[b, t] given tokens[b, <t] (position 0 must be 0).
          token_weights: [B, T] per-token weights (1/n_i per row for seq-mean-token-mean packing,
            Â_t for OPD); None = all ones.
          base_params: frozen model params, required with `lora=True`.
        """
        if self.tis_cap:
            raise ValueError(
                f"tis_cap={self.tis_cap} needs the engine's log-probs: call score_and_gap"
            )
        h, n, _ = self.score_and_gap(params, tokens, loss_mask, token_weights, None, base_params)
        return h, n

    def score_and_gap(
        self,
        params: Any,
        tokens: Int[Array, "B T"] | np.ndarray,
        loss_mask: Float[Array, "B T"] | np.ndarray,
        token_weights: Float[Array, "B T"] | np.ndarray | None,
        engine_logprobs: Float[Array, "B T"] | np.ndarray | None,
        base_params: Any = None,
        routes: np.ndarray | None = None,
    ) -> tuple[Any, int, dict]:
        """(h, n, gap): `__call__` given the engine's log-probs of the chunk's tokens.

        `engine_logprobs` [B, T] is aligned with `tokens` (entry t: the engine's log π of
        token t; NaN where the engine gave none; None = none at all). From the same forward as
        h, `gap` holds the chunk's engine/learner gap sums (`losses.logprob_gap.gap_sums`:
        device scalars), and with `tis_cap` > 0 every scored token's term is weighted by
        min(π_learner / π_engine, tis_cap), detached: h = Σ w·m·ρ·∇ log π.
        `routes` [B, T, M, K] (MoE policies; -1 = none) are the engine's experts per token:
        replayed under `routing="replay"`, and compared with the learner's own (`gap`'s
        `route_differ` / `route_sets`).
        """
        if self.lora and base_params is None:
            raise ValueError("a LoRA score-gradient function needs base_params (the frozen model)")
        arrays, n = self._padded(tokens, loss_mask, token_weights, engine_logprobs)
        if routes is not None:
            arrays = (*arrays, self._padded_routes(routes, arrays[0].shape))
        h, gap = self._jitted(params, base_params, *arrays)
        return h, n, gap

    def _padded_routes(self, routes: np.ndarray, shape: tuple[int, ...]) -> Any:
        """Routes padded with -1 (none: the learner routes those tokens itself) to `shape`."""
        routes = np.asarray(routes, np.int32)
        pad = [(0, p - n) for p, n in zip(shape, routes.shape[:2], strict=True)]
        routes = np.pad(routes, pad + [(0, 0), (0, 0)], constant_values=-1)
        if self.rows is not None:
            return jax.device_put(routes, self.rows)
        return routes


def place_rows(arrays: Sequence[np.ndarray], rows: Any) -> tuple[jax.Array, ...]:
    """[B, T] chunk arrays put on `rows` (a NamedSharding splitting B over "fsdp").

    B is padded with zero rows (token 0, mask 0, weight 0: they add exactly 0 to h) to a
    multiple of the "fsdp" size; with fewer real rows than devices each device still does
    one row's work, the same as running the chunk replicated.
    """
    ways = int(rows.mesh.shape["fsdp"])
    pad = -arrays[0].shape[0] % ways
    if pad:
        arrays = [np.pad(a, ((0, pad), (0, 0))) for a in arrays]
    return tuple(jax.device_put(a, rows) for a in arrays)


def make_score_grad_fn(
    graphdef: nnx.GraphDef,
    seq_buckets: Sequence[int] = (128, 256, 512, 1024, 2048),
    remat: bool = False,
    *,
    lora: bool = False,
    pad_id: int = 0,
    out_shardings: Any = None,
    temperature: float = 1.0,
    rows: Any = None,
    tis_cap: float = 0.0,
    routing: str = "replay",
) -> ScoreGradFn:
    """Builds the jitted score-gradient function for a model structure (`nnx.split` graphdef).

    Args:
      graphdef: from `graphdef, params = nnx.split(model, nnx.Param)`.
      seq_buckets: padded sequence lengths; a chunk longer than the largest raises ValueError.
      remat: rematerialize each decoder layer in the backward pass (less activation memory,
        about one extra forward of compute).
      lora: trainable params are LoRA adapters; call as fn(adapters, ..., base_params=params).
      pad_id: token id used for padding (never scored).
      out_shardings: optional sharding pytree for h (e.g. the parameter shardings), so the
        gradient lands laid out like the parameters and the accumulator tallies.
      temperature: the rollout sampling temperature; log π = log_softmax(logits / temperature),
        so the gradient is the one of the distribution the engine sampled from.
      rows: optional NamedSharding for the chunk's rows (`learner.mesh.batch_sharding`):
        rows are split over "fsdp" (padded with zero rows to a multiple of its size).
      tis_cap: > 0 applies the truncated importance weight in `score_and_gap` (0 = off).
      routing: MoE policies: "replay" (use the engine's routes) or "recompute".

    Returns:
      fn(params, tokens, loss_mask, token_weights=None, base_params=None) -> (h, n), with
      `fn.compiles` counting compilations.
    """
    return ScoreGradFn(
        graphdef,
        seq_buckets,
        remat,
        lora,
        pad_id,
        out_shardings,
        temperature,
        rows,
        tis_cap,
        routing,
    )
