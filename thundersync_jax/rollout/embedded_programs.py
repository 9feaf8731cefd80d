"""What the embedded engine compiles: prompt-length buckets and its jitted programs.

Three programs, each a pure function of (params, rest, arrays) over the merged Qwen3
model: `prefill` (admitted prompts, one [1, bucket] pass each, keys/values written into
their cache rows), `decode` (one token for every active row, [R, 1]) and `score` (teacher
log-probs, no cache). Shapes are fixed by the buckets, so the compile count is bounded:
one decode program, one prefill program per bucket, one score program per (rows, bucket).
The host-side bookkeeping (rows, queue, weights) is `embedded.EmbeddedEngine`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from thundersync_jax.models import auto, qwen3, sampling
from thundersync_jax.models import lora as lora_lib

MIN_BUCKET = 16


def length_buckets(max_len: int, min_bucket: int = MIN_BUCKET) -> tuple[int, ...]:
    """Powers of two from `min_bucket`, capped by (and ending at) `max_len`."""
    buckets, b = [], min(min_bucket, max_len)
    while b < max_len:
        buckets.append(b)
        b *= 2
    return (*buckets, max_len)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"length {n} exceeds the largest bucket {buckets[-1]}")


@jax.jit
def merge_lora(base, adapters):
    return lora_lib.merge(base, adapters)


def route_shape(model) -> tuple[int, int]:
    """(MoE layers M, experts per token K) of the model; (0, 0) for a dense one."""
    m = getattr(model, "num_moe_layers", 0)
    return (m, model.cfg.moe.top_k) if m else (0, 0)


def hidden_and_routes(model, ids, **kwargs):
    """(hidden, cache, routes int32 [B, T, M, K]): the experts each input token was routed
    to (M = 0 for a dense model), reported with the samples for routing replay."""
    m, k = route_shape(model)
    if not m:
        hidden, cache = model.hidden_states(ids, **kwargs)
        return hidden, cache, jnp.zeros(ids.shape + (0, 0), jnp.int32)
    return model.hidden_states(ids, return_routes=True, **kwargs)


def sample_at(model, typed_keys, hidden, cache, key_data, temperature, top_p):
    """Samples each row's next token from `hidden` [R, D]; its position is the row's length."""
    logits = model.logits_from_hidden(hidden[:, None, :])[:, 0, :]  # [R, V]
    seq_keys = jax.random.wrap_key_data(key_data) if typed_keys else key_data
    keys = jax.vmap(sampling.token_key)(seq_keys, cache.lengths)
    return sampling.sample_token(logits, keys, temperature, top_p)


def prefill(
    graphdef,
    typed_keys,
    params,
    rest,
    cache,
    tokens,
    lengths,
    dest,
    count,
    key_data,
    temperature,
    top_p,
):
    """Prefills prompts 0..count-1 of `tokens` [P, T] into cache rows `dest`, samples each one's
    first token. Other rows of the cache are untouched.

    Each prompt runs alone as a [1, T] batch on a fresh T-slot cache (compute scales with the
    prompts admitted, not the cache rows, and a prompt's arithmetic never depends on which others
    were admitted with it); its keys/values then overwrite the first T slots of its row. The loop
    bound is traced, so prompt slots past `count` are never computed.
    """
    t = tokens.shape[1]

    def prefill_one(i, carry):
        cache, out_tokens, out_logprobs, out_routes = carry
        model = nnx.merge(graphdef, params, rest)
        row_tokens = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=0)  # [1, T]
        mask = jnp.arange(t)[None, :] < lengths[i]  # prompts are right-padded
        small = auto.init_cache(model.cfg, 1, t, cache.k.dtype)
        hidden, small, routes = hidden_and_routes(
            model, row_tokens, attention_mask=mask, cache=small
        )
        hidden_last = jax.lax.dynamic_slice_in_dim(hidden[0], lengths[i] - 1, 1, axis=0)  # [1, D]
        token, logprob = sample_at(
            model,
            typed_keys,
            hidden_last,
            small,
            key_data[i][None],
            temperature[i][None],
            top_p[i][None],
        )
        at = (0, dest[i], 0, 0, 0)
        cache = qwen3.KVCache(
            k=jax.lax.dynamic_update_slice(cache.k, small.k, at),
            v=jax.lax.dynamic_update_slice(cache.v, small.v, at),
            lengths=cache.lengths.at[dest[i]].set(small.lengths[0]),
        )
        return (
            cache,
            out_tokens.at[i].set(token[0]),
            out_logprobs.at[i].set(logprob[0]),
            out_routes.at[i].set(routes[0]),
        )

    p = tokens.shape[0]
    m, k = route_shape(nnx.merge(graphdef, params, rest))
    routes0 = jnp.zeros((p, t, m, k), jnp.int32)
    init = (cache, jnp.zeros(p, jnp.int32), jnp.zeros(p, jnp.float32), routes0)
    cache, out_tokens, out_logprobs, out_routes = jax.lax.fori_loop(0, count, prefill_one, init)
    return out_tokens, out_logprobs, out_routes, cache


def decode(
    graphdef, typed_keys, params, rest, cache, last_tokens, active, key_data, temperature, top_p
):
    """Feeds each active row its last sampled token and samples the next one; also the
    fed tokens' routes [R, M, K]."""
    model = nnx.merge(graphdef, params, rest)
    hidden, cache, routes = hidden_and_routes(
        model, last_tokens[:, None], attention_mask=active[:, None], cache=cache
    )  # [R, 1, D]
    tokens_out, logprobs = sample_at(
        model, typed_keys, hidden[:, 0], cache, key_data, temperature, top_p
    )
    return tokens_out, logprobs, routes[:, 0], cache


def score(graphdef, params, rest, tokens, mask):
    """[R, T-1] log p(tokens[:, t+1] | tokens[:, :t+1]), float32 (no cache)."""
    model = nnx.merge(graphdef, params, rest)
    hidden, _ = model.hidden_states(tokens, attention_mask=mask)  # [R, T, D]
    return model.token_terms(hidden[:, :-1], tokens[:, 1:])[0]
