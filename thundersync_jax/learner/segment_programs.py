"""The jitted passes behind `segments.py`: forward, direct gradient, and one sweep step.

The direct pass takes the engine's log-probs of the segment's targets (NaN where none): from
its own forward it gives the engine/learner gap sums and, with `tis_cap` > 0, weights each
scored token by min(π_learner / π_engine, tis_cap), detached (`logprobs.policy_objective`), so
the cotangents buffered for the sweep carry the weight too.

Each is a pure function of (params, caches, one padded segment); every program compiles once
per (segment bucket, cache capacity) pair, and `Programs.compiles` counts the traces. Cache and
cotangent buffers are donated, so on a backend that honours donation they update in place.
On the learner mesh every output has a fixed sharding (`segment_layout.py`): caches keep the
caches' layout, gradients come out laid out like the trainable params.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from thundersync_jax.learner import logprobs, segment_layout
from thundersync_jax.models import lora, qwen3


class SegmentInputs(NamedTuple):
    """One segment, padded to its bucket (length T).

    Attributes:
      start: int32 scalar, the cache slot (= RoPE position) of its first input token.
      inputs: int32 [T] input tokens (padding: pad_id).
      targets: int32 [T] the token each input predicts (scored where loss_mask is 1).
      real: bool [T] False on padding.
    """

    start: jax.Array
    inputs: Any
    targets: Any
    real: Any


def _write(cache, new, start, real):
    """Writes a segment's [L, 1, T, K, H] block at slots start.. (padding dropped)."""
    slots = jnp.where(real, start + jnp.arange(real.shape[0], dtype=jnp.int32), cache.shape[2])
    return cache.at[:, 0, slots].set(new[:, 0].astype(cache.dtype), mode="drop")


def _read(buffer, start, real):
    """The [L, 1, T, K, H] block of `buffer` at slots start.. (zeros on padding / past S)."""
    slots = start + jnp.arange(real.shape[0], dtype=jnp.int32)
    block = jnp.take(buffer, slots, axis=2, mode="fill", fill_value=0)
    return jnp.where(real[None, None, :, None, None], block, 0.0)


def _zeros_f32(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)


class Programs:
    """Jitted forward / direct / sweep passes for one model structure."""

    def __init__(
        self,
        graphdef: Any,
        remat: bool,
        lora_adapters: bool,
        temperature: float,
        tis_cap: float = 0.0,
        layout: segment_layout.SegmentLayout = segment_layout.SegmentLayout(),
    ):
        self.graphdef = graphdef
        self.layout = layout
        self.remat = remat
        self.lora = lora_adapters
        self.temperature = temperature
        self.tis_cap = float(tis_cap)
        self.compiles = 0
        self._lock = threading.Lock()
        # `past_slots` (static): how many leading cache slots a segment attends to, a cache
        # bucket >= its start (0 for a trajectory's first segment), so attention and its
        # backward cost what the valid past costs, not the whole capacity.
        cache, rep, grads = layout.cache, layout.replicated, layout.grads
        self._forward = jax.jit(
            self._forward_fn,
            static_argnames=("past_slots",),
            donate_argnums=(2, 3),
            **layout.jit_kwargs((cache, cache)),
        )
        self._direct = jax.jit(
            self._direct_fn,
            static_argnames=("distill", "past_slots"),
            donate_argnums=(2,),
            **layout.jit_kwargs((grads, cache, cache, cache, cache, rep, rep, rep)),
        )
        # The sweep reads k, v (every step of a sweep uses them) and donates dk, dv, total.
        self._sweep = jax.jit(
            self._sweep_fn,
            static_argnames=("past_slots",),
            donate_argnums=(4, 5, 6),
            **layout.jit_kwargs((grads, cache, cache)),
        )
        # One program, not one eager op per leaf: a sweep starts from param-sized zeros, and
        # per-leaf dispatch cost ~4 ms per close on the tiny CPU model (more than the sweep).
        self.zeros = jax.jit(_zeros_f32, **layout.jit_kwargs(grads))

    def _count(self) -> None:  # runs once per trace
        with self._lock:
            self.compiles += 1

    def _model(self, trainable, base_params):
        full = lora.merge(jax.lax.stop_gradient(base_params), trainable) if self.lora else trainable
        model = nnx.merge(self.graphdef, full)
        model.remat = self.remat
        return model

    def _segment(self, trainable, base_params, past_k, past_v, seg: SegmentInputs):
        model = self._model(trainable, base_params)
        t = seg.inputs.shape[0]
        positions = (seg.start + jnp.arange(t, dtype=jnp.int32))[None]
        valid = (jnp.arange(past_k.shape[2]) < seg.start)[None]  # [1, S]: older slots only
        out = qwen3.segment_hidden_states(
            model, seg.inputs[None], positions, seg.real[None], past_k, past_v, valid
        )
        return model, out

    # ---- forward only (prompt / unscored observation) -------------------------------------

    def _forward_fn(self, params, base_params, k, v, seg, *, past_slots):
        self._count()
        past_k, past_v = k[:, :, :past_slots], v[:, :, :past_slots]
        _, out = self._segment(params, base_params, past_k, past_v, seg)
        return _write(k, out.k, seg.start, seg.real), _write(v, out.v, seg.start, seg.real)

    def forward(self, params, base_params, k, v, seg, *, past_slots):
        """(k, v) with the segment's keys/values written at its slots."""
        return self._forward(params, base_params, k, v, seg, past_slots=past_slots)

    # ---- direct gradient ------------------------------------------------------------------

    def _direct_fn(
        self, params, base_params, caches, seg, loss_mask, side, engine, *, distill, past_slots
    ):
        self._count()
        k, v, dk, dv = caches

        def objective(trainable, past_k, past_v):
            model, out = self._segment(trainable, base_params, past_k, past_v, seg)
            logp = model.token_terms(out.hidden, seg.targets[None], self.temperature)[0][0]  # [T]
            # Â_t = log π_T − log π_s (distill), a number: no gradient through it.
            token_weights = jax.lax.stop_gradient(side - logp) if distill else side
            value, gap = logprobs.policy_objective(
                logp, loss_mask, token_weights, engine, self.tis_cap
            )
            return value, (logp, token_weights * loss_mask, gap, out.k, out.v)

        past = (k[:, :, :past_slots], v[:, :, :past_slots])
        grads, aux = jax.grad(objective, argnums=(0, 1, 2), has_aux=True)(params, *past)
        g_params, g_k, g_v = grads
        logp, weights, gap, new_k, new_v = aux
        g_params = jax.tree.map(lambda g: g.astype(jnp.float32), g_params)
        return (
            g_params,
            _write(k, new_k, seg.start, seg.real),
            _write(v, new_v, seg.start, seg.real),
            dk.at[:, :, :past_slots].add(g_k.astype(jnp.float32)),
            dv.at[:, :, :past_slots].add(g_v.astype(jnp.float32)),
            logp,
            weights,
            gap,
        )

    def direct(
        self, params, base_params, caches, seg, loss_mask, side, engine, *, distill, past_slots
    ):
        """(grad, k, v, dk, dv, logp [T], weights [T], gap sums) for one scored segment.

        `engine` [T]: the engine's log-probs of the targets (NaN: none). `weights` are the
        weights before the importance weight (OPD: Â_t·mask).
        """
        return self._direct(
            params,
            base_params,
            caches,
            seg,
            loss_mask,
            side,
            engine,
            distill=distill,
            past_slots=past_slots,
        )

    # ---- one reverse-sweep step -----------------------------------------------------------

    def _sweep_fn(self, params, base_params, k, v, dk, dv, total, seg, *, past_slots):
        self._count()

        def keys_values(trainable, past_k, past_v):
            _, out = self._segment(trainable, base_params, past_k, past_v, seg)
            return out.k, out.v  # the hidden states are unused: XLA drops the top of the net

        past = (k[:, :, :past_slots], v[:, :, :past_slots])
        (new_k, new_v), vjp = jax.vjp(keys_values, params, *past)
        ct_k = _read(dk, seg.start, seg.real).astype(new_k.dtype)
        ct_v = _read(dv, seg.start, seg.real).astype(new_v.dtype)
        g_params, g_k, g_v = vjp((ct_k, ct_v))
        total = jax.tree.map(lambda t, g: t + g.astype(jnp.float32), total, g_params)
        dk = dk.at[:, :, :past_slots].add(g_k.astype(jnp.float32))
        dv = dv.at[:, :, :past_slots].add(g_v.astype(jnp.float32))
        return total, dk, dv

    def sweep(self, params, base_params, caches, total, seg, *, past_slots):
        """(total + this segment's deferred gradient, dk, dv with its earlier cotangents)."""
        k, v, dk, dv = caches
        return self._sweep(params, base_params, k, v, dk, dv, total, seg, past_slots=past_slots)
