"""The engine protocol: request/result types, their wire form, and request validation.

Operations a client sends (each a msgpack map with an ``op`` field, see `wire`):

    generate      {"requests": [request...]}     -> one "result" per request, as each finishes
    cancel        {"request_ids": [...]}         -> those requests end with an error result
    load_weights  {"call_id", "path", "version", "probe"?} -> reply {"version"} once loaded
                  (and, with a probe, verified: see load_probe)
    score         {"call_id", "tokens": [...]}   -> reply {"logprobs": [array...]}
    score_turns   {"call_id", "turns": [{"episode", "tokens", "start", "end"}...]}
                  -> reply {"logprobs": [array...]}: incremental, from the process's own
                  per-episode KV cache (rollout.episode_scoring; only new tokens are forwarded)
    release_episodes {"call_id", "episodes": [...]} -> reply {"open"}: frees their caches
    health        {"call_id"}                    -> reply {"version", "active", "queued", ...}
    shutdown      {"call_id"}                    -> reply {}, then the server exits

A reply is {"op": "reply", "call_id", "ok": bool, "value": ..., "error": str | None}; a result is
{"op": "result", "result": {...}}. A bad request never takes the server down: it comes back as a
result with ``finish_reason="error"`` and an ``error`` string naming what was wrong.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported lazily: the transport side must not pull in JAX
    from thundersync_jax.models.sampling import SamplingParams

OP_GENERATE = "generate"
OP_CANCEL = "cancel"
OP_LOAD_WEIGHTS = "load_weights"
OP_SCORE = "score"
OP_HEALTH = "health"
OP_SHUTDOWN = "shutdown"
OP_RESULT = "result"
OP_REPLY = "reply"
OP_SCORE_TURNS = "score_turns"
OP_RELEASE_EPISODES = "release_episodes"
EPISODE_OPS = (OP_SCORE_TURNS, OP_RELEASE_EPISODES)
CALL_OPS = (OP_LOAD_WEIGHTS, OP_SCORE, OP_HEALTH, OP_SHUTDOWN, *EPISODE_OPS)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ERROR = "error"

_SAMPLING_FIELDS = ("temperature", "top_p", "max_new_tokens", "stop_token_ids")


class RequestError(ValueError):
    """A request the engine refuses (empty or over-long prompt, bad sampling parameters, ...)."""


class EngineError(RuntimeError):
    """An engine call failed on the server side, timed out, or the engine went away."""


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One prompt (or chat continuation) to sample from.

    Attributes:
      request_id: unique among the requests in flight on one engine.
      prompt_tokens: the full context so far (for a multi-turn chat, all previous turns).
      sampling: temperature, top_p, max_new_tokens, stop_token_ids.
      key_ids: (seed, step, prompt, member); the sampling key derives from these alone, never from
        arrival order or batch composition, so a retried request gives the same tokens.
      turn: optional turn index of a multi-turn trajectory, folded into the key.
    """

    request_id: str
    prompt_tokens: Sequence[int]
    sampling: SamplingParams
    key_ids: tuple[int, int, int, int]
    turn: int | None = None


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """What one request produced, tagged with the policy version that sampled it.

    Attributes:
      request_id: the request this answers.
      tokens: sampled tokens (a stop token, when hit, is included).
      logprobs: log π(token) under the sampling distribution's model logits, one per token;
        NaN for a token whose log-prob the engine cannot report (the learner then leaves it
        out of `engine_logprob_gap_*` and gives it importance weight 1, `losses.logprob_gap`).
      finish_reason: "stop" (stop token), "length" (max_new_tokens or cache full) or "error".
      policy_version: version of the weights loaded when the request was sampled (-1 = initial).
      error: what went wrong when finish_reason == "error", else None.
      routes: mixture-of-experts policies only: int [n, M, K], the experts each input token
        (the prompt, then every sampled token the engine fed back) was routed to in each of
        the M MoE layers; n = len(prompt) + len(tokens) - 1 (the last token is never fed).
        None for dense models or engines that cannot report them.
    """

    request_id: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    error: str | None = None
    routes: np.ndarray | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What an engine can serve; requests outside these limits are refused, not truncated."""

    vocab_size: int
    max_seq_len: int  # prompt + generated tokens held in one cache row

    @property
    def max_prompt_len(self) -> int:
        return self.max_seq_len - 1  # room for at least one generated token


def error_result(request_id: str, message: str, policy_version: int) -> GenerateResult:
    """The result sent back for a request that could not be served."""
    return GenerateResult(request_id, [], [], FINISH_ERROR, policy_version, message)


# ----------------------------------------------------------------------------- wire form


def sampling_to_wire(sp: SamplingParams) -> dict[str, Any]:
    return {
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "max_new_tokens": int(sp.max_new_tokens),
        "stop_token_ids": [int(t) for t in sp.stop_token_ids],
    }


def sampling_from_wire(d: Any) -> SamplingParams:
    from thundersync_jax.models.sampling import SamplingParams

    if not isinstance(d, dict) or set(d) != set(_SAMPLING_FIELDS):
        raise RequestError(f"sampling must be a map with fields {_SAMPLING_FIELDS}, got {d!r}")
    return SamplingParams(
        temperature=d["temperature"],
        top_p=d["top_p"],
        max_new_tokens=d["max_new_tokens"],
        stop_token_ids=tuple(d["stop_token_ids"]),
    )


def request_to_wire(req: GenerateRequest) -> dict[str, Any]:
    return {
        "request_id": req.request_id,
        "prompt_tokens": np.asarray(req.prompt_tokens, dtype=np.int32).reshape(-1),
        "sampling": sampling_to_wire(req.sampling),
        "key_ids": [int(k) for k in req.key_ids],
        "turn": None if req.turn is None else int(req.turn),
    }


def request_from_wire(d: Any) -> GenerateRequest:
    """Rebuilds a request; raises RequestError naming the first malformed field."""
    if not isinstance(d, dict):
        raise RequestError(f"a request must be a map, got {type(d).__name__}")
    missing = {"request_id", "prompt_tokens", "sampling", "key_ids", "turn"} - set(d)
    if missing:
        raise RequestError(f"request is missing fields {sorted(missing)}")
    prompt = d["prompt_tokens"]
    if not isinstance(prompt, np.ndarray) or prompt.ndim != 1 or prompt.dtype.kind not in "iu":
        raise RequestError("prompt_tokens must be a 1-D integer array")
    return GenerateRequest(
        request_id=d["request_id"],
        prompt_tokens=prompt.astype(np.int64).tolist(),
        sampling=sampling_from_wire(d["sampling"]),
        key_ids=tuple(d["key_ids"]) if isinstance(d["key_ids"], list) else d["key_ids"],
        turn=d["turn"],
    )


def result_to_wire(res: GenerateResult) -> dict[str, Any]:
    return {
        "request_id": res.request_id,
        "tokens": np.asarray(res.tokens, dtype=np.int32).reshape(-1),
        "logprobs": np.asarray(res.logprobs, dtype=np.float32).reshape(-1),
        "finish_reason": res.finish_reason,
        "policy_version": int(res.policy_version),
        "error": res.error,
        "routes": None if res.routes is None else np.asarray(res.routes, np.int32),
    }


def result_from_wire(d: dict[str, Any]) -> GenerateResult:
    return GenerateResult(
        request_id=d["request_id"],
        tokens=d["tokens"].tolist(),
        logprobs=d["logprobs"].tolist(),
        finish_reason=d["finish_reason"],
        policy_version=d["policy_version"],
        error=d["error"],
        routes=d.get("routes"),
    )


# ----------------------------------------------------------------------------- validation


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def validate_request(req: GenerateRequest, limits: EngineLimits) -> None:
    """Raises RequestError with what is wrong and what would be valid; returns None if servable."""
    if not isinstance(req.request_id, str) or not req.request_id:
        raise RequestError(f"request_id must be a non-empty string, got {req.request_id!r}")
    n = len(req.prompt_tokens)
    if n == 0:
        raise RequestError(f"request {req.request_id}: empty prompt (need at least one token)")
    if n > limits.max_prompt_len:
        raise RequestError(
            f"request {req.request_id}: prompt of {n} tokens is over-long; this engine holds "
            f"{limits.max_seq_len} tokens per sequence, so prompts may have at most "
            f"{limits.max_prompt_len}"
        )
    lo, hi = min(req.prompt_tokens), max(req.prompt_tokens)
    if lo < 0 or hi >= limits.vocab_size:
        raise RequestError(
            f"request {req.request_id}: prompt token ids must lie in [0, {limits.vocab_size}), "
            f"got min {lo} max {hi}"
        )
    keys = req.key_ids
    if len(keys) != 4 or not all(_is_int(k) and 0 <= k < 2**31 for k in keys):
        raise RequestError(
            f"request {req.request_id}: key_ids must be 4 integers (seed, step, prompt, member) "
            f"in [0, 2**31), got {keys!r}"
        )
    if req.turn is not None and not (_is_int(req.turn) and 0 <= req.turn < 2**31):
        raise RequestError(f"request {req.request_id}: turn must be None or an int >= 0")
    validate_sampling(req.sampling, limits, req.request_id)


def validate_sampling(sp: SamplingParams, limits: EngineLimits, request_id: str = "?") -> None:
    """Checks temperature >= 0 (0 = greedy), 0 < top_p <= 1, max_new_tokens >= 1, stop ids."""
    t, p = sp.temperature, sp.top_p
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise RequestError(f"request {request_id}: temperature must be finite and >= 0, got {t!r}")
    if not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
        raise RequestError(f"request {request_id}: top_p must lie in (0, 1], got {p!r}")
    m = sp.max_new_tokens
    if not _is_int(m) or m < 1:
        raise RequestError(f"request {request_id}: max_new_tokens must be an int >= 1, got {m!r}")
    bad = [s for s in sp.stop_token_ids if not (_is_int(s) and 0 <= s < limits.vocab_size)]
    if bad:
        raise RequestError(
            f"request {request_id}: stop_token_ids must lie in [0, {limits.vocab_size}), got {bad}"
        )
