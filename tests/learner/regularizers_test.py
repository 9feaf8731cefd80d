"""KL-to-reference and entropy terms streamed through the GRPO learner equal the direct gradient.

The reference is `jax.grad` of the whole batch's total loss written out directly
(policy term with numpy GRPO advantages, plus coef · (1/Z) Σ_i w_i Σ_t term_t), one
unpadded trajectory at a time, summed in float64. The learner side packs, pads, reorders
and streams the same trajectories through the planner.
"""

import dataclasses
import functools
import queue

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax import accumulators, losses
from thundersync_jax.algorithms import grpo
from thundersync_jax.learner import chunks, regularizers
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem

K, G = 3, 3
EPS = 1e-6
BUCKETS = (32,)  # one length bucket: fewer compilations
PAD = 32  # the reference pads every trajectory to one length (inert: causal attention)


@dataclasses.dataclass
class _Traj:
    tokens: np.ndarray
    loss_mask: np.ndarray
    reward: float
    policy_versions: tuple = (0,)


@dataclasses.dataclass(frozen=True)
class _Rl:
    kl_coef: float
    kl_estimator: str
    entropy_coef: float


@pytest.fixture(scope="module")
def setup(tiny_policy):
    cfg, graphdef, params = tiny_policy(0)
    # The reference policy differs from the policy, so every KL term is non-zero.
    noise = jax.random.key(11)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(noise, len(leaves))
    shifted = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    ref = jax.tree.unflatten(treedef, shifted)
    rng = np.random.default_rng(3)
    rewards = [[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 1.0, 0.25]]  # group 1 tied: A = 0
    trajs = {}
    for k in range(K):
        for m in range(G):
            n = int(rng.integers(7, 29))
            prompt = int(rng.integers(2, 5))
            mask = np.zeros(n, np.float32)
            mask[prompt:] = 1
            tokens = rng.integers(1, cfg.vocab_size, size=n).astype(np.int32)
            trajs[(k, m)] = _Traj(tokens, mask, rewards[k][m])
    score_fn = chunks.make_score_grad_fn(graphdef, seq_buckets=BUCKETS, pad_id=0)
    return graphdef, params, ref, trajs, score_fn


def _advantages(rewards):
    r = np.asarray(rewards, np.float64)
    if len(r) == 1:
        return r
    return (r - r.mean()) / (r.std(ddof=1) + EPS)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _trajectory_grad(graphdef, estimator, params, ref, tokens, mask, adv, w, kl_coef, ent_coef):
    """∇ of one trajectory's total loss w·Σ_t m_t·(−A·logp_t + β·kl_t − α·H_t)."""

    def loss(p):
        targets = tokens[None, 1:]
        logits = nnx.merge(graphdef, p)(tokens[None, :-1])
        logp = losses.token_logprobs(logits, targets)[0]
        ref_logp = losses.token_logprobs(nnx.merge(graphdef, ref)(tokens[None, :-1]), targets)[0]
        kl = regularizers.KL_ESTIMATORS[estimator](logp, ref_logp)
        per_token = -adv * logp + kl_coef * kl - ent_coef * losses.entropy(logits)[0]
        return w * jnp.sum(per_token * mask[1:])

    return jax.grad(loss)(params)


def _direct_gradient(graphdef, params, ref, trajs, loss_agg, rl):
    """∇ of the total loss, trajectory by trajectory, summed in float64."""
    total = jax.tree.map(lambda x: np.zeros(x.shape, np.float64), params)
    num_tokens = sum(int(t.loss_mask.sum()) for t in trajs.values())
    z = len(trajs) if loss_agg == "seq-mean-token-mean" else num_tokens
    for k in range(K):
        adv = _advantages([trajs[(k, m)].reward for m in range(G)])
        for m in range(G):
            t = trajs[(k, m)]
            n = int(t.loss_mask.sum())
            w = 1.0 / n if loss_agg == "seq-mean-token-mean" else 1.0
            tokens = np.pad(t.tokens, (0, PAD - len(t.tokens)))
            mask = np.pad(t.loss_mask, (0, PAD - len(t.tokens)))
            g = _trajectory_grad(
                graphdef,
                rl.kl_estimator,
                params,
                ref,
                tokens,
                mask,
                np.float32(adv[m]),
                np.float32(w),
                np.float32(rl.kl_coef),
                np.float32(rl.entropy_coef),
            )
            total = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64), total, g)
    return jax.tree.map(lambda x: x / z, total)


def _streamed_gradient(setup, loss_agg, rl, schedule, order):
    graphdef, params, ref, trajs, score_fn = setup
    coefs = regularizers.term_coefficients(rl)
    acc = accumulators.grpo(num_groups=K, group_size=G, loss_agg=loss_agg, eps=EPS)
    acc = regularizers.combined_accumulator(acc, coefs)
    reg_fn = regularizers.RegularizerGradFn(
        graphdef, tuple(coefs), ref, kl_estimator=rl.kl_estimator, seq_buckets=BUCKETS
    )
    learner = grpo.batch_learner(acc, score_fn, pad_id=0, regularizer_fn=reg_fn)
    q: queue.Queue = queue.Queue()
    for i, (k, m) in enumerate(order):
        t = trajs[(k, m)]
        q.put(WorkItem(f"g{k}m{m}", k, t.reward, int(t.loss_mask.sum()), float(i), payload=t))
    planner = Planner(schedule, K, G, max_chunk_tokens=96)
    state, _ = run_learner_batch(planner, q, learner.init(params, 0), learner.process)
    return learner.finalize(state)


def _relative_error(got, want) -> float:
    num = sum(float(np.sum((np.asarray(a, np.float64) - b) ** 2)) for a, b in _pairs(got, want))
    den = sum(float(np.sum(b**2)) for _, b in _pairs(got, want))
    return float(np.sqrt(num / den))


def _pairs(got, want):
    return zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "rl, loss_agg",
    [
        (_Rl(0.7, "k1", 0.0), "seq-mean-token-mean"),
        (_Rl(0.0, "k3", 0.3), "seq-mean-token-mean"),
        (_Rl(0.4, "k3", 0.3), "token-mean"),
    ],
    ids=["kl-k1", "entropy", "kl-k3+entropy"],
)
def test_streamed_terms_match_direct_gradient(setup, rl, loss_agg):
    graphdef, params, ref, trajs, _ = setup
    want = _direct_gradient(graphdef, params, ref, trajs, loss_agg, rl)
    # The terms must matter, or this test could not catch a regularizer that adds nothing.
    plain = _direct_gradient(graphdef, params, ref, trajs, loss_agg, _Rl(0.0, rl.kl_estimator, 0))
    assert _relative_error(want, plain) > 1e-2
    keys = sorted(trajs)
    rng = np.random.default_rng(5)
    for schedule in ("sync", "stream"):  # sync packs same-slot rows; stream goes one by one
        order = [keys[i] for i in rng.permutation(len(keys))]
        got = _streamed_gradient(setup, loss_agg, rl, schedule, order)
        err = _relative_error(got, want)
        assert err < 1e-5, (schedule, err)


def test_invalid_estimator_is_rejected():
    with pytest.raises(ValueError, match="rl.kl_estimator='k2' is not valid"):
        regularizers.term_coefficients(_Rl(0.1, "k2", 0.0))
