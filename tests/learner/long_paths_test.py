"""The learner's programs on blockwise attention and tiled log-probs equal them on the naive
paths ([T, S] scores, whole [T, V] logits): chunks (full and LoRA), log-probs, regularizers.

Blocks of 4 keys and tiles of 3 tokens, so 20-token chunks cross many block and tile edges.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.learner import chunks, regularizers
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.models import lora, qwen3

CFG = qwen3.Qwen3Config(
    vocab_size=37,
    hidden_size=22,
    intermediate_size=26,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
    tie_word_embeddings=False,
)
BUCKETS = (24,)


def graphdef(naive: bool) -> nnx.GraphDef:
    """The model structure on the reference paths (naive) or the long-sequence ones."""
    kw = dict(attention_impl="naive", logits_tile=0)
    if not naive:
        kw = dict(attention_impl="blockwise", attention_block=4, logits_tile=3)
    return nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(CFG, **kw, rngs=nnx.Rngs(0))))[0]


@pytest.fixture(scope="module")
def params():
    _, abstract = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)


def _chunk(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (2, 20)).astype(np.int32)
    mask = np.zeros((2, 20), np.float32)
    mask[0, 3:20] = 1
    mask[1, 5:14] = 1  # row 1: tokens past 14 are padding-like (never scored)
    weights = rng.uniform(0.5, 2.0, (2, 20)).astype(np.float32)
    return tokens, mask, weights


def _relative_error(x, y):
    a = np.concatenate([np.ravel(np.asarray(t, np.float64)) for t in jax.tree.leaves(x)])
    b = np.concatenate([np.ravel(np.asarray(t, np.float64)) for t in jax.tree.leaves(y)])
    return np.linalg.norm(a - b) / np.linalg.norm(b)


# LoRA in make test, not test-quick (tests/learner/lora_policy_test.py trains adapters quickly)
@pytest.mark.parametrize("use_lora", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_score_gradient_and_logprobs(params, use_lora):
    tokens, mask, weights = _chunk(1)
    trainable, base = params, None
    if use_lora:
        rng = np.random.default_rng(2)
        fresh = lora.init(params, rank=2, alpha=4.0, key=jax.random.key(0))
        trainable = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), fresh)
        base = params
    out = {}
    for naive in (True, False):
        fn = chunks.make_score_grad_fn(graphdef(naive), BUCKETS, lora=use_lora, temperature=0.8)
        h, n = fn(trainable, tokens, mask, weights, base_params=base)
        out[naive] = (h, TokenLogprobFn(fn)(trainable, tokens, base))
    (h_ref, lp_ref), (h, lp) = out[True], out[False]
    np.testing.assert_allclose(lp, lp_ref, rtol=1e-5, atol=1e-6)
    assert _relative_error(h, h_ref) <= 1e-5


def test_kl_and_entropy_gradients(params):
    tokens, mask, weights = _chunk(3)
    rng = np.random.default_rng(4)
    ref_params = jax.tree.map(lambda x: x + rng.normal(0, 0.05, x.shape).astype(np.float32), params)
    grads = {}
    for naive in (True, False):
        fn = regularizers.RegularizerGradFn(
            graphdef(naive),
            ("kl", "entropy"),
            ref_params,
            seq_buckets=BUCKETS,
            temperature=1.3,
        )
        grads[naive] = fn(params, tokens, mask, weights)
    for term in ("kl", "entropy"):
        assert _relative_error(grads[False][term], grads[True][term]) <= 1e-5
