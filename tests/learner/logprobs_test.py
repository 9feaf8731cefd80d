"""The score-gradient chunk's engine gap (aux outputs) and truncated importance weight.

References: the learner's log-probs from `TokenLogprobFn` (its own forward) and float64 numpy
for the gap; for the weighted gradient, the plain chunk with the weight computed in float64
numpy and folded into its token weights (the weight is a detached per-token constant).
"""

import jax
import numpy as np
import pytest

from thundersync_jax.learner import chunks
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.losses.logprob_gap import policy_objective

CAP = 1.5


@pytest.fixture(scope="module")
def parts(tiny_policy):
    cfg, graphdef, params = tiny_policy(0)
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, cfg.vocab_size, (3, 14)).astype(np.int32)
    mask = np.zeros((3, 14), np.float32)
    mask[0, 3:] = mask[1, 5:12] = mask[2, 2:9] = 1
    weights = np.array([[0.5], [1.0], [2.0]], np.float32) * np.ones((3, 14), np.float32)
    plain = chunks.make_score_grad_fn(graphdef, (16,))
    learner_lp = TokenLogprobFn(plain)(params, tokens).astype(np.float64)
    # An engine that samples from other numbers: the learner's log-probs, perturbed.
    engine_lp = (learner_lp + rng.normal(0, 0.4, learner_lp.shape)) * mask
    return graphdef, params, tokens, mask, weights, plain, learner_lp, engine_lp


def _close(x, y, rtol=2e-4, atol=1e-6):
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _max_diff(x, y):
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True)
    )


def test_gap_sums_come_from_the_gradient_forward(parts):
    graphdef, params, tokens, mask, weights, plain, learner_lp, engine_lp = parts
    engine = engine_lp.copy()
    engine[1, 7] = np.nan  # the engine gave no log-prob for this token: left out
    h, n, gap = plain.score_and_gap(params, tokens, mask, weights, engine)
    h_plain, n_plain = plain(params, tokens, mask, weights)
    _close(h, h_plain, rtol=1e-6)  # tis off: the gradient is the plain one
    counted = (mask > 0) & np.isfinite(engine)
    d = (engine - learner_lp)[counted]
    assert n == n_plain and int(gap["tokens"]) == counted.sum() == mask.sum() - 1
    np.testing.assert_allclose(float(gap["abs_sum"]), np.abs(d).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(gap["kl_sum"]), (np.expm1(-d) + d).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(gap["max_abs"]), np.abs(d).max(), rtol=1e-5)


def test_truncated_weight_multiplies_each_token_and_changes_the_update(parts):
    graphdef, params, tokens, mask, weights, plain, learner_lp, engine_lp = parts
    tis = chunks.make_score_grad_fn(graphdef, (16,), tis_cap=CAP)
    h, _, _ = tis.score_and_gap(params, tokens, mask, weights, engine_lp)
    rho = np.minimum(np.exp(learner_lp - engine_lp), CAP)  # float64, detached by construction
    want, _ = plain(params, tokens, mask, (weights * rho).astype(np.float32))
    _close(h, want)
    assert (rho[mask > 0] == CAP).any() and (rho[mask > 0] < 1).any()  # both sides exercised
    off, _ = plain(params, tokens, mask, weights)
    assert _max_diff(h, off) > 1e-3 * max(float(np.max(np.abs(x))) for x in jax.tree.leaves(off))
    # The engine's own numbers equal to the learner's: weight 1, the plain update.
    same, _, gap = tis.score_and_gap(params, tokens, mask, weights, learner_lp * mask)
    _close(same, off, rtol=1e-5)
    assert float(gap["abs_sum"]) < 1e-4
    with pytest.raises(ValueError, match="needs the engine's log-probs"):
        tis(params, tokens, mask, weights)


def test_policy_objective_without_engine_is_the_plain_sum():
    rng = np.random.default_rng(0)
    logp, mask, w = (
        -rng.uniform(size=(2, 5)),
        rng.uniform(size=(2, 5)) < 0.5,
        rng.uniform(size=(2, 5)),
    )
    value, gap = policy_objective(logp, mask.astype(np.float32), w)
    assert gap == {} and float(value) == pytest.approx(float(np.sum(logp * mask * w)), rel=1e-6)
    with pytest.raises(ValueError, match="tis_cap > 0 needs"):
        policy_objective(logp, mask.astype(np.float32), w, tis_cap=2.0)
