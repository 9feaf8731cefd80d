"""Weight-load verification: an engine acknowledges a version only after a probe agrees.

The publisher computes the learner's per-token log-probs of a fixed probe sequence on the
weights it publishes (`learner_probe`, JAX) and sends them with the `load_weights` call; the
engine loads, scores the same tokens with its own kernels (`Backend.score`) and compares
(`verify_probe`, numpy only). A mismatch is a `ProbeMismatchError` naming the gap and the
tolerance: the engine replies with an error instead of an ack, and refuses to sample until a
later load verifies, so a stale or mis-loaded policy is never served silently. (A load refused
before any weight changed — missing snapshot, wrong version — keeps the old weights serving,
tagged with their old version.)

Tolerance (`default_atol`), on max |Δ log p| over the probe's tokens: 2e-3 nats when the engine
computes in float32 (the same model in two implementations: 4.8e-7 measured on vLLM's CPU
backend for a tiny tied Qwen3), 0.25 nats in bfloat16 (5.7e-3 measured there; bf16 rounding
grows with depth and width). A stale or wrong weight set is off by whole nats (a wrong probe in
tests/rollout/vllm_cpu_test.py: several nats).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

PROBE_SEED = 20240531  # fixed: the same probe tokens in every process and run

_ATOL_BY_DTYPE = {"float32": 2e-3, "bfloat16": 0.25, "float16": 0.1}


class UnverifiedWeightsError(RuntimeError):
    """The engine's weights may no longer be any published version: it must not sample."""


class ProbeMismatchError(UnverifiedWeightsError):
    """The engine's log-probs of the probe differ from the learner's past the tolerance."""


def probe_tokens(vocab_size: int, length: int = 32) -> np.ndarray:
    """The fixed probe sequence: `length` token ids drawn with PROBE_SEED from [0, vocab)."""
    if length < 2:
        raise ValueError(f"a probe needs at least 2 tokens, got length={length}")
    return np.random.default_rng(PROBE_SEED).integers(0, vocab_size, size=length, dtype=np.int32)


def default_atol(dtype: str) -> float:
    """The probe tolerance (nats, max |Δ|) for an engine computing in `dtype`."""
    if dtype not in _ATOL_BY_DTYPE:
        raise ValueError(f"no probe tolerance for dtype {dtype!r}; valid: {sorted(_ATOL_BY_DTYPE)}")
    return _ATOL_BY_DTYPE[dtype]


def make_probe(tokens: np.ndarray, logprobs: np.ndarray, atol: float) -> dict[str, Any]:
    """The probe's wire form (sent inside a load_weights call)."""
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    logprobs = np.asarray(logprobs, np.float32).reshape(-1)
    if logprobs.shape != (len(tokens) - 1,):
        raise ValueError(f"a probe of {len(tokens)} tokens needs {len(tokens) - 1} log-probs")
    return {"tokens": tokens, "logprobs": logprobs, "atol": float(atol)}


def verify_probe(probe: dict[str, Any], engine_logprobs: np.ndarray, version: int) -> float:
    """Returns max |Δ| between engine and learner log-probs; raises ProbeMismatchError past atol."""
    want = np.asarray(probe["logprobs"], np.float64)
    got = np.asarray(engine_logprobs, np.float64).reshape(-1)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        raise ProbeMismatchError(
            f"version {version}: the engine scored the probe as {got.shape} values "
            f"(finite: {bool(np.all(np.isfinite(got)))}), expected {want.shape} finite values"
        )
    gap = float(np.max(np.abs(got - want)))
    if gap > float(probe["atol"]):
        worst = int(np.argmax(np.abs(got - want)))
        raise ProbeMismatchError(
            f"version {version}: engine log-probs of the load probe differ from the learner's by "
            f"max |Δ| = {gap:.4g} nats (token {worst + 1}: engine {got[worst]:.4f}, learner "
            f"{want[worst]:.4f}); tolerance {probe['atol']:.3g}. The engine did not load these "
            "weights as the learner holds them (stale, mis-converted, or tied head not refreshed)"
        )
    return gap


def learner_probe(
    model_cfg: Any, length: int = 32, *, atol: float
) -> Callable[[Any, str], dict[str, Any] | None]:
    """A `probe(params, kind)` function for EngineManager: the learner's probe log-probs.

    `params` is the published parameter tree (nnx.State of the full model). Adapter snapshots
    (kind "lora_adapters") are served on top of a base this side does not hold: no probe.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.losses import token_logprobs
    from thundersync_jax.models import auto

    tokens = probe_tokens(model_cfg.vocab_size, length)
    compiled: list = []  # built on the first publish: tracing a large model's init takes seconds

    def build():
        abstract = nnx.eval_shape(lambda: auto.build(model_cfg))
        graphdef = nnx.split(abstract, nnx.Param)[0]

        @jax.jit
        def logprobs(params):
            params = jax.tree.map(lambda p: p.astype(jnp.float32), params)  # learner's f32 view
            ids = jnp.asarray(tokens)[None]
            return token_logprobs(nnx.merge(graphdef, params)(ids[:, :-1]), ids[:, 1:])[0]

        return logprobs

    def probe(params: Any, kind: str = "params") -> dict[str, Any] | None:
        if kind == "lora_adapters":
            return None
        if not compiled:
            compiled.append(build())
        return make_probe(tokens, np.asarray(compiled[0](params)), atol)

    return probe
