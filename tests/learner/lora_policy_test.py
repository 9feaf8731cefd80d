"""LoRA in the GRPO trainer: one tiny training step touches only the adapters.

The train state, the accumulator tallies and the optimizer state are adapter-shaped;
after the step the merged model differs from the warm start only in targeted weights,
and the gradient equals the direct jax.grad of the batch loss through the adapters.
"""

import dataclasses
import queue

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.common import get_base_config
from thundersync_jax import accumulators, losses
from thundersync_jax.algorithms import grpo
from thundersync_jax.learner import chunks, lora_policy
from thundersync_jax.learner.train_state import init_train_state, make_apply_update, make_optimizer
from thundersync_jax.models import lora
from thundersync_jax.schedule.config_check import ConfigError, check_lora_config
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem

K, G = 2, 3
TARGETS = ("q_proj", "down_proj")


@dataclasses.dataclass
class _Traj:
    tokens: np.ndarray
    loss_mask: np.ndarray
    reward: float
    policy_versions: tuple = (0,)


def _config(**lora_overrides):
    c = get_base_config()
    c.lora.enabled = True
    c.lora.rank = 3
    c.lora.alpha = 6.0
    c.lora.targets = TARGETS
    c.lora.publish = "merged"
    for k, v in lora_overrides.items():
        setattr(c.lora, k, v)
    return c


@pytest.fixture(scope="module")
def setup(tiny_policy):
    cfg, graphdef, params = tiny_policy(1, num_hidden_layers=2)
    rng = np.random.default_rng(2)
    rewards = [[1.0, 0.0, 0.5], [0.0, 1.0, 1.0]]
    trajs = {}
    for k in range(K):
        for m in range(G):
            n = int(rng.integers(6, 20))
            mask = np.zeros(n, np.float32)
            mask[2:] = 1
            tokens = rng.integers(1, cfg.vocab_size, size=n).astype(np.int32)
            trajs[(k, m)] = _Traj(tokens, mask, rewards[k][m])
    return graphdef, params, trajs


def _one_step(graphdef, params, trajs, config):
    policy = lora_policy.make_policy(config, params)
    acc = accumulators.grpo(num_groups=K, group_size=G)
    score_fn = chunks.make_score_grad_fn(graphdef, seq_buckets=(8, 16, 32), lora=True)
    learner = grpo.batch_learner(acc, score_fn, pad_id=0)
    batch = learner.init(policy.trainable, 0, base_params=policy.base)
    q: queue.Queue = queue.Queue()
    for i, (k, m) in enumerate(sorted(trajs)):
        t = trajs[(k, m)]
        q.put(WorkItem(f"g{k}m{m}", k, t.reward, int(t.loss_mask.sum()), float(i), payload=t))
    planner = Planner("stream", K, G, max_chunk_tokens=64)
    batch, _ = run_learner_batch(planner, q, batch, learner.process)
    optimizer = make_optimizer(config.optim)
    state = init_train_state(policy.trainable, optimizer, 0)
    grads = learner.finalize(batch)
    # donate=False: the tests compare the state before and after the step.
    new_state, finite, _ = make_apply_update(optimizer, donate=False)(state, grads)
    assert bool(finite)
    return policy, batch, state, grads, new_state


def test_one_lora_step_changes_only_adapters(setup):
    graphdef, params, trajs = setup
    policy, batch, state, grads, new_state = _one_step(graphdef, params, trajs, _config())
    adapters_tree = jax.tree.structure(policy.trainable)
    # Train state, tallies and optimizer state cover the adapters only.
    assert isinstance(new_state.params, lora.Adapters)
    assert jax.tree.structure(batch.acc.total) == adapters_tree
    assert jax.tree.structure(grads) == adapters_tree
    n_adapter = lora.num_params(policy.trainable)
    n_full = sum(x.size for x in jax.tree.leaves(params))
    assert n_adapter < n_full
    tally_size = sum(x.size for x in jax.tree.leaves(batch.acc.total))
    assert tally_size == n_adapter
    opt_size = sum(x.size for x in jax.tree.leaves(new_state.opt_state) if x.ndim > 0)
    assert opt_size == 2 * n_adapter  # AdamW: first and second moments
    # Only targeted weights move in the merged model; the base itself is untouched.
    before = policy.full_params(state.params)
    after = policy.full_params(new_state.params)
    moved = set()
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after), strict=True
    ):
        if not np.array_equal(np.asarray(a), np.asarray(b)):
            moved.add(lora.path_name(path))
    targeted = {p for p, _ in policy.trainable.layouts}
    assert moved == targeted, (moved, targeted)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # B = 0 at step 0
    # Merged publication is full-model shaped.
    assert jax.tree.structure(policy.publishable(new_state.params)) == jax.tree.structure(params)


@pytest.mark.slow
def test_lora_gradient_matches_direct_grad(setup):
    graphdef, params, trajs = setup
    policy, _, _, grads, _ = _one_step(graphdef, params, trajs, _config())

    def loss(adapters):
        total = 0.0
        for k in range(K):
            r = np.array([trajs[(k, m)].reward for m in range(G)])
            adv = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
            for m in range(G):
                t = trajs[(k, m)]
                logits = lora.apply(graphdef, params, adapters, jnp.asarray(t.tokens[None, :-1]))
                logp = losses.token_logprobs(logits, jnp.asarray(t.tokens[None, 1:]))[0]
                n = t.loss_mask[1:].sum()
                total = total - adv[m] * jnp.sum(logp * t.loss_mask[1:]) / n
        return total / (K * G)

    # B = 0 makes ∇A zero; ∇B is the informative part and must be non-zero.
    want = jax.jit(jax.grad(loss))(policy.trainable)  # one program, not thousands of eager ops
    for path in want.weights:
        for f in ("a", "b"):
            np.testing.assert_allclose(
                grads.weights[path][f], want.weights[path][f], rtol=1e-4, atol=1e-7
            )
        assert np.abs(np.asarray(grads.weights[path]["b"])).max() > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(publish="adapters"), "lora.publish='adapters' needs an engine"),
        (dict(targets=("q_proj", "wq")), "lora.targets="),
        (dict(rank=0), "lora.rank=0 must be >= 1"),
        (dict(alpha=0.0), "lora.alpha=0.0 must be > 0"),
    ],
)
def test_invalid_lora_config_is_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_lora_config(_config(**overrides))
