"""Token log-probs, KL estimators and entropy against float64 numpy."""

import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax import losses


def _log_softmax64(logits):
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture
def logits_and_targets():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(2, 5, 11)) * 4).astype(np.float32)  # B=2, T=5, V=11
    targets = rng.integers(0, 11, size=(2, 5))
    return logits, targets


def test_token_logprobs_matches_float64(logits_and_targets):
    logits, targets = logits_and_targets
    got = losses.token_logprobs(jnp.asarray(logits), jnp.asarray(targets))
    want = np.take_along_axis(_log_softmax64(logits), targets[..., None], -1)[..., 0]
    assert got.shape == (2, 5) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_token_logprobs_accepts_bf16_and_computes_in_float32(logits_and_targets):
    logits, targets = logits_and_targets
    bf16 = jnp.asarray(logits, jnp.bfloat16)
    got = losses.token_logprobs(bf16, jnp.asarray(targets))
    # The reference sees the same bf16-rounded logits; only the math precision differs.
    want = np.take_along_axis(_log_softmax64(np.asarray(bf16, np.float64)), targets[..., None], -1)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want[..., 0], rtol=1e-6, atol=1e-5)


def test_uniform_logits_by_hand():
    # All-equal logits over V = 11 tokens: every log-prob is −log 11, the entropy log 11.
    logits = jnp.zeros((1, 3, 11))
    np.testing.assert_allclose(
        losses.token_logprobs(logits, jnp.array([[0, 5, 10]])),
        -np.log(11) * np.ones((1, 3)),
        rtol=1e-6,
    )
    np.testing.assert_allclose(losses.entropy(logits), np.log(11) * np.ones((1, 3)), rtol=1e-6)


def test_kl_estimators_match_float64():
    rng = np.random.default_rng(1)
    logp = -rng.exponential(size=(3, 7)).astype(np.float32)
    ref = -rng.exponential(size=(3, 7)).astype(np.float32)
    d = ref.astype(np.float64) - logp.astype(np.float64)
    np.testing.assert_allclose(losses.kl_k1(logp, ref), -d, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(losses.kl_k3(logp, ref), np.exp(d) - d - 1, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(losses.kl_k3(logp, ref)) >= 0)
    np.testing.assert_array_equal(losses.kl_k3(logp, logp), np.zeros((3, 7)))


def test_entropy_matches_float64(logits_and_targets):
    logits, _ = logits_and_targets
    logp = _log_softmax64(logits)
    want = -(np.exp(logp) * logp).sum(-1)
    got = losses.entropy(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
    assert got.shape == (2, 5)
    np.testing.assert_allclose(losses.entropy(jnp.asarray(logits)), want, rtol=1e-5, atol=1e-6)
    assert got.dtype == jnp.float32
