"""Keyed sampling: distribution, log-probs, batch independence, stop tokens, compilations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3, sampling


@pytest.fixture(scope="module")
def cfg(tiny_qwen3_config):
    return tiny_qwen3_config(tie_word_embeddings=True)


@pytest.fixture(scope="module")
def model(cfg, random_qwen3):
    """Random weights large enough that next-token distributions are far from uniform."""
    return random_qwen3(cfg, seed=11)


def _prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(0, 97, size=n).tolist() for n in (5, 9, 3)]


def _full_logits(model, seq) -> np.ndarray:
    """Logits of a plain forward (no cache) over `seq`; right-padded to one compiled length."""
    padded = np.zeros((1, 32), np.int32)
    padded[0, : len(seq)] = seq
    return np.asarray(_forward(*nnx.split(model), padded))[0, : len(seq)]


@jax.jit
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)


def test_sampling_params_validation():
    assert sampling.SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    for bad, match in [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    ]:
        with pytest.raises(ValueError, match=match):
            sampling.SamplingParams(**bad)


def test_keys_depend_only_on_their_ids():
    k = sampling.sequence_key(1, 2, 3, 4)
    assert jnp.array_equal(
        jax.random.key_data(k), jax.random.key_data(sampling.sequence_key(1, 2, 3, 4))
    )
    others = [(0, 2, 3, 4), (1, 0, 3, 4), (1, 2, 0, 4), (1, 2, 3, 0)]
    for ids in others:
        assert not jnp.array_equal(
            jax.random.key_data(k), jax.random.key_data(sampling.sequence_key(*ids))
        )
    with pytest.raises(ValueError, match="member"):
        sampling.sequence_key(0, 0, 0, -1)
    assert not jnp.array_equal(
        jax.random.key_data(sampling.token_key(k, 7)), jax.random.key_data(sampling.token_key(k, 8))
    )


def test_sample_token_matches_the_float64_nucleus_distribution():
    logits = np.array([2.0, 1.0, 0.5, 0.4, -1.0, -3.0, 0.9], np.float32)
    temperature, top_p = 0.7, 0.8
    # Reference: float64 numpy, temperature then nucleus (mass before a token < top_p).
    p = np.exp((logits / temperature).astype(np.float64))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros(7, bool)
    keep[order[before < top_p]] = True
    ref = np.where(keep, p, 0.0)
    ref /= ref.sum()

    n = 6000
    keys = jax.vmap(lambda i: sampling.token_key(jax.random.key(42), i))(jnp.arange(n))
    sample = jax.jit(sampling.sample_token)
    tokens, logprobs = sample(
        jnp.broadcast_to(logits, (n, 7)), keys, jnp.full((n,), temperature), jnp.full((n,), top_p)
    )
    tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
    assert keep[tokens].all()
    freq = np.bincount(tokens, minlength=7) / n
    sigma = np.sqrt(ref * (1 - ref) / n)
    assert np.all(np.abs(freq - ref) <= 4.5 * sigma + 1e-12), (freq, ref)
    np.testing.assert_allclose(logprobs, np.log(ref[tokens]), atol=1e-5)

    # Greedy rows: argmax, log-prob 0; a nucleus row next to them does not change them.
    greedy_tokens, greedy_lp = sample(
        jnp.stack([logits, logits]), keys[:2], jnp.array([0.0, 1.0]), jnp.array([1.0, 0.3])
    )
    assert greedy_tokens.tolist() == [0, 0] and greedy_lp[0] == 0.0
    np.testing.assert_allclose(greedy_lp[1], 0.0, atol=1e-6)  # top_p=0.3 keeps token 0 only


def test_greedy_generation_equals_argmax_of_full_forward(model):
    prompts = _prompts()
    keys = [sampling.sequence_key(0, 0, i, 0) for i in range(3)]
    sp = sampling.SamplingParams(temperature=0.0, max_new_tokens=6)
    for prompt, gen in zip(prompts, sampling.generate(model, prompts, keys, sp), strict=True):
        assert gen.finish_reason == "length" and len(gen.tokens) == 6
        seq = list(prompt)
        for tok in gen.tokens:
            assert tok == int(np.argmax(_full_logits(model, seq)[-1]))
            seq.append(tok)
        assert gen.logprobs == [0.0] * 6


def test_sampled_logprobs_match_full_forward(model):
    prompts = _prompts()
    keys = [sampling.sequence_key(3, 1, i, 2) for i in range(3)]
    sp = sampling.SamplingParams(temperature=0.8, max_new_tokens=7)
    for prompt, gen in zip(prompts, sampling.generate(model, prompts, keys, sp), strict=True):
        logits = _full_logits(model, prompt + gen.tokens)
        ref = jax.nn.log_softmax(logits[len(prompt) - 1 : -1] / 0.8, axis=-1)
        ref = np.take_along_axis(np.asarray(ref), np.array(gen.tokens)[:, None], axis=1)[:, 0]
        np.testing.assert_allclose(gen.logprobs, ref, atol=1e-4)


def test_tokens_do_not_depend_on_the_rest_of_the_batch(model):
    prompts = _prompts()
    keys = [sampling.sequence_key(7, 0, i, 0) for i in range(3)]
    sp = sampling.SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=9)
    batch = sampling.generate(model, prompts, keys, sp)
    alone = sampling.generate(model, prompts[1:2], keys[1:2], sp)[0]
    shuffled = sampling.generate(model, prompts[::-1], keys[::-1], sp)[1]
    for other in (alone, shuffled):
        assert other.tokens == batch[1].tokens
        np.testing.assert_allclose(other.logprobs, batch[1].logprobs, atol=1e-5)
    # Different members of the same prompt diverge.
    member1 = sampling.generate(model, prompts[1:2], [sampling.sequence_key(7, 0, 1, 1)], sp)[0]
    assert member1.tokens != batch[1].tokens


def test_stop_tokens_end_a_sequence_and_compilations_are_bucketed(model):
    prompts = _prompts()
    keys = [sampling.sequence_key(0, 0, i, 0) for i in range(3)]
    free = sampling.generate(model, prompts, keys, sampling.SamplingParams(max_new_tokens=12))
    stop = free[0].tokens[3]
    first = free[0].tokens.index(stop)
    compiles = sampling.generate_compilations()
    # Same buckets (batch 4, prompt 16, new tokens 16): no new compilation.
    stopped = sampling.generate(
        model, prompts, keys, sampling.SamplingParams(max_new_tokens=11, stop_token_ids=(stop,))
    )
    sampling.generate(
        model, prompts[:2] + [[1] * 12], keys, sampling.SamplingParams(0.5, 0.7, max_new_tokens=16)
    )
    assert sampling.generate_compilations() == compiles
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].tokens == free[0].tokens[: first + 1]
    for gen, ref in zip(stopped[1:], free[1:], strict=True):
        n = ref.tokens.index(stop) + 1 if stop in ref.tokens[:11] else 11
        assert gen.tokens == ref.tokens[:n]
        assert gen.finish_reason == ("stop" if stop in ref.tokens[:11] else "length")


def test_generate_rejects_bad_prompts(model):
    sp = sampling.SamplingParams()
    key = sampling.sequence_key(0, 0, 0, 0)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sampling.generate(model, [[]], [key], sp)
    with pytest.raises(ValueError, match=r"outside \[0, 97\)"):
        sampling.generate(model, [[97]], [key], sp)
    with pytest.raises(ValueError, match="one key per prompt"):
        sampling.generate(model, [[1], [2]], [key], sp)


def test_next_token_logits_mixes_prefill_and_idle_rows(cfg, model):
    """Left-padded prefill, right-padded prefill and an idle row in one call."""
    ids = np.array([[0, 0, 7, 8, 9], [4, 5, 6, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], bool)

    @jax.jit
    def step(graphdef, state, ids, mask, cache):
        return sampling.next_token_logits(nnx.merge(graphdef, state), ids, mask, cache)

    logits, cache = step(*nnx.split(model), ids, mask, qwen3.init_cache(cfg, 3, 8))
    assert logits.shape == (3, 97)
    np.testing.assert_array_equal(cache.lengths, [3, 3, 0])
    np.testing.assert_allclose(logits[0], _full_logits(model, [7, 8, 9])[-1], atol=2e-5)
    np.testing.assert_allclose(logits[1], _full_logits(model, [4, 5, 6])[-1], atol=2e-5)
