"""Keyed token sampling and batched generation with the Qwen3 KV cache.

Randomness is keyed by what a token *is*, never by where it was computed: a sequence's key comes
from (seed, step, prompt, member) and token t of it uses `token_key(sequence_key, t)` with t the
token's absolute position in the sequence (prompt tokens included). So a trajectory's tokens do
not depend on the batch it shares, its row, or its arrival order, and `sync`, `group` and `stream`
schedules sample identical trajectories.

Log-probs returned with sampled tokens are those of the distribution actually sampled from:
softmax(logits / temperature) restricted to the top-p nucleus and renormalized (greedy,
temperature 0, is a point mass: log-prob 0). They are diagnostics for the rollout side; the
learner recomputes the policy's own log-probs (temperature 1, no top-p) in its forward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from thundersync_jax.models import qwen3

_UINT31 = 2**31
_MIN_PROMPT_BUCKET = 16
_MIN_NEW_TOKENS_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    Attributes:
      temperature: >= 0; 0 means greedy (argmax).
      top_p: nucleus mass in (0, 1]; 1 disables the nucleus cut.
      max_new_tokens: >= 1, generated tokens per sequence at most (stop token included).
      stop_token_ids: generation ends after any of these is sampled (it is kept in the output).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        stop = tuple(int(t) for t in self.stop_token_ids)
        if any(t < 0 for t in stop):
            raise ValueError(f"stop_token_ids={stop} must be non-negative token ids")
        object.__setattr__(self, "stop_token_ids", stop)


class Generation(NamedTuple):
    """One generated continuation.

    Attributes:
      tokens: the new tokens (a final stop token included).
      logprobs: log-prob of each token under the distribution it was sampled from (module doc).
      finish_reason: "stop" (a stop token was sampled) or "length" (max_new_tokens reached).
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


def sequence_key(seed: int, step: int, prompt_index: int, member: int) -> jax.Array:
    """The PRNG key of one trajectory: member `member` of prompt `prompt_index` at `step`.

    All four must be ints in [0, 2**31). Independent of batch composition and arrival order.
    """
    key = jax.random.key(0)
    for name, value in (("seed", seed), ("step", step), ("prompt_index", prompt_index)) + (
        ("member", member),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}={value!r} must be an int")
        if not 0 <= value < _UINT31:
            raise ValueError(f"{name}={value} must be in [0, 2**31)")
        key = jax.random.fold_in(key, int(value))
    return key


def token_key(key: jax.Array, position: int | Int[Array, ""]) -> jax.Array:
    """Key for sampling the token at absolute `position` of the sequence keyed by `key`."""
    return jax.random.fold_in(key, position)


def sample_token(
    logits: Float[Array, "B V"],
    keys: jax.Array,
    temperature: Float[Array, " B"],
    top_p: Float[Array, " B"],
) -> tuple[Int[Array, " B"], Float[Array, " B"]]:
    """Samples one token per row with temperature and nucleus (top-p) sampling.

    Args:
      logits: [B, V] next-token logits (any float dtype; computed in float32).
      keys: [B] PRNG keys, one per row (typically `token_key(seq_key, position)`).
      temperature: [B]; 0 = greedy (argmax of the logits).
      top_p: [B] in (0, 1]: keep the most likely tokens until their mass reaches top_p (the
        token that crosses it is kept, so at least one survives).

    Returns:
      tokens int32 [B], and float32 [B] log-probs of those tokens under the distribution sampled
      from (temperature-scaled, nucleus-restricted, renormalized; 0 for greedy rows).
    """
    logits = jnp.asarray(logits, jnp.float32)
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), logits.shape[:1])
    top_p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), logits.shape[:1])
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    logp = jax.nn.log_softmax(scaled, axis=-1)

    def nucleus(logp):
        # Sort once per row; a token stays if the mass strictly before it is below top_p.
        order = jnp.argsort(-logp, axis=-1, stable=True)
        probs = jnp.exp(jnp.take_along_axis(logp, order, axis=-1))
        before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        rows = jnp.arange(logp.shape[0])[:, None]
        keep = jnp.zeros(logp.shape, bool).at[rows, order].set(keep_sorted)
        cut = jax.nn.log_softmax(jnp.where(keep, logp, -jnp.inf), axis=-1)
        # Rows without a nucleus keep their exact log-probs whatever the other rows ask for.
        return jnp.where(top_p[:, None] >= 1.0, logp, cut)

    # The sort is the costly part of a decode step for a large vocabulary: skip it when no row
    # asks for a nucleus.
    logp = jax.lax.cond(jnp.all(top_p >= 1.0), lambda lp: lp, nucleus, logp)
    sampled = jax.vmap(jax.random.categorical)(keys, logp)
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, jnp.where(greedy, 0.0, token_logp)


def next_token_logits(
    model: qwen3.Qwen3,
    input_ids: Int[Array, "B T"],
    attention_mask: Bool[Array, "B T"],
    cache: qwen3.KVCache,
) -> tuple[Float[Array, "B V"], qwen3.KVCache]:
    """Appends each row's real tokens to its cache row and returns the logits after its last one.

    The building block of prefill, decode and continuous batching: in one call some rows can
    prefill a prompt (T real tokens), others decode (1 real token + padding) and others idle
    (all padding; their logits are meaningless and their cache row is untouched). Only the
    [B, V] logits of the last real token of each row are computed, never [B, T, V].
    """
    attention_mask = jnp.asarray(attention_mask, bool)
    hidden, cache = model.hidden_states(input_ids, attention_mask=attention_mask, cache=cache)
    t = attention_mask.shape[1]
    last = t - 1 - jnp.argmax(attention_mask[:, ::-1], axis=1)  # index of the last True
    hidden_last = hidden[jnp.arange(hidden.shape[0]), last]  # [B, D]
    return model.logits_from_hidden(hidden_last[:, None])[:, 0], cache


def _bucket(n: int, minimum: int) -> int:
    """Next power of two >= max(n, minimum): bounds the number of compiled shapes."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


_generate_traces = 0


def generate_compilations() -> int:
    """How many times the generation loop has been traced (= compiled) in this process."""
    return _generate_traces


def _key_data(key) -> jax.Array:
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return jnp.asarray(key, jnp.uint32)  # a legacy raw uint32[2] key


class _LoopState(NamedTuple):
    step: Int[Array, ""]
    cache: qwen3.KVCache
    token: Int[Array, " B"]  # last sampled token (fed to the model next)
    out_tokens: Int[Array, "B M"]
    out_logprobs: Float[Array, "B M"]
    num_tokens: Int[Array, " B"]
    done: jax.Array  # bool [B]
    stopped: jax.Array  # bool [B]


@jax.jit
def _generate_loop(graphdef, state, ids, lengths, key_data, temperature, top_p, stop, max_new, out):
    """Prefill, then decode in a while loop until every row is done.

    `out` [B, M] (filled with pad_id) fixes the output width M; max_new <= M is traced, so
    several max_new_tokens share one compilation.
    """
    global _generate_traces
    _generate_traces += 1
    model = nnx.merge(graphdef, state)
    b, t = ids.shape
    m = out.shape[1]
    keys = jax.random.wrap_key_data(key_data)
    mask = jnp.arange(t)[None, :] < lengths[:, None]
    cache = qwen3.init_cache(model.cfg, b, t + m, model.dtype)
    logits, cache = next_token_logits(model, ids, mask, cache)

    def sample_at(logits, position):
        return sample_token(logits, jax.vmap(token_key)(keys, position), temperature, top_p)

    def record(s: _LoopState, token, logprob) -> _LoopState:
        live = ~s.done
        hit_stop = live & jnp.any(token[:, None] == stop[None, :], axis=-1)
        num_tokens = s.num_tokens + live
        return _LoopState(
            step=s.step + 1,
            cache=s.cache,
            token=token,
            out_tokens=s.out_tokens.at[:, s.step].set(
                jnp.where(live, token, s.out_tokens[:, s.step])
            ),
            out_logprobs=s.out_logprobs.at[:, s.step].set(jnp.where(live, logprob, 0.0)),
            num_tokens=num_tokens,
            done=s.done | hit_stop | (num_tokens >= max_new),
            stopped=s.stopped | hit_stop,
        )

    token, logprob = sample_at(logits, lengths)
    init = _LoopState(
        step=jnp.int32(0),
        cache=cache,
        token=token,
        out_tokens=out,
        out_logprobs=jnp.zeros(out.shape, jnp.float32),
        num_tokens=jnp.zeros((b,), jnp.int32),
        done=lengths == 0,  # padding rows of the batch bucket
        stopped=jnp.zeros((b,), bool),
    )
    init = record(init, token, logprob)

    def cond(s: _LoopState):
        return (s.step < max_new) & ~jnp.all(s.done)

    def body(s: _LoopState) -> _LoopState:
        # Finished rows feed padding: their cache rows are left as they are.
        logits, cache = next_token_logits(model, s.token[:, None], ~s.done[:, None], s.cache)
        token, logprob = sample_at(logits, lengths + s.step)
        return record(s._replace(cache=cache), token, logprob)

    final = jax.lax.while_loop(cond, body, init)
    return final.out_tokens, final.out_logprobs, final.num_tokens, final.stopped


def generate(
    model: qwen3.Qwen3,
    prompts: Sequence[Sequence[int]],
    keys: Sequence[jax.Array],
    sp: SamplingParams,
    pad_id: int = 0,
) -> list[Generation]:
    """Samples a continuation of every prompt: one prefill, then a jitted KV-cache decode loop.

    Token i of prompt b's continuation is drawn with `token_key(keys[b], len(prompts[b]) + i)`,
    so results do not depend on the other prompts in the call. Batch size, prompt length and
    max_new_tokens are padded to powers of two, so calls of similar sizes reuse one compilation
    (`generate_compilations()` counts them). Decoding stops when every sequence has sampled a
    stop token or max_new_tokens.

    Args:
      model: the policy.
      prompts: non-empty token-id lists (lengths may differ).
      keys: one PRNG key per prompt (`sequence_key(...)`).
      sp: sampling parameters shared by the batch.
      pad_id: token id written into padding (never attended to).
    """
    if not isinstance(sp, SamplingParams):
        raise TypeError(f"sp must be a SamplingParams, got {type(sp).__name__}")
    if len(prompts) == 0 or len(prompts) != len(keys):
        raise ValueError(
            f"need one key per prompt and at least one prompt; got "
            f"{len(prompts)} prompts, {len(keys)} keys"
        )
    vocab = model.cfg.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
    n = len(prompts)
    b = _bucket(n, 1)
    t = _bucket(max(len(p) for p in prompts), _MIN_PROMPT_BUCKET)
    m = _bucket(sp.max_new_tokens, _MIN_NEW_TOKENS_BUCKET)
    ids = np.full((b, t), pad_id, np.int32)
    lengths = np.zeros((b,), np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
        lengths[i] = len(p)
    key_data = [_key_data(k) for k in keys]
    key_data = jnp.stack(key_data + [jnp.zeros_like(key_data[0])] * (b - n))
    stop_ids = list(sp.stop_token_ids) or [-1]
    stop = np.full((_bucket(len(stop_ids), 1),), -1, np.int32)
    stop[: len(stop_ids)] = stop_ids
    graphdef, state = nnx.split(model)
    tokens, logprobs, num_tokens, stopped = _generate_loop(
        graphdef,
        state,
        ids,
        lengths,
        key_data,
        np.full((b,), sp.temperature, np.float32),
        np.full((b,), sp.top_p, np.float32),
        stop,
        np.int32(sp.max_new_tokens),
        np.full((b, m), pad_id, np.int32),
    )
    tokens, logprobs, num_tokens, stopped = jax.device_get((tokens, logprobs, num_tokens, stopped))
    return [
        Generation(
            tokens=tokens[i, : num_tokens[i]].tolist(),
            logprobs=logprobs[i, : num_tokens[i]].tolist(),
            finish_reason="stop" if stopped[i] else "length",
        )
        for i in range(n)
    ]
