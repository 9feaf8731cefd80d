"""Shared prompts (GRPO): forward once, members' prompt-K/V cotangents as tallies, one prompt
backward per group, vs each member's own full gradient (`chunks.py`, prompt + completion) added
to the same accumulator."""

import logging

import jax
import numpy as np
import pytest
from flax import nnx

from thundersync_jax import accumulators
from thundersync_jax.learner import chunks, segments, segments_prompt
from thundersync_jax.models import qwen3

CFG = qwen3.Qwen3Config(
    vocab_size=37,
    hidden_size=22,
    intermediate_size=26,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
)
GROUPS = [  # (prompt length, [(completion segment lengths, reward), ...])
    (7, [((4,), 1.0), ((3, 5), 0.0), ((6,), 1.0)]),
    (4, [((2,), 2.5), ((5,), -1.0), ((1, 3), 2.5)]),
]


@pytest.fixture(scope="module")
def parts():
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    # Segments on blockwise attention (4-key blocks) and 3-token log-prob tiles, the
    # per-member reference on the naive paths ([T, S] scores, whole [T, V] logits).
    long_model = nnx.eval_shape(
        lambda: qwen3.Qwen3(
            CFG, attention_impl="blockwise", attention_block=4, logits_tile=3, rngs=nnx.Rngs(0)
        )
    )
    fns = segments.make_segment_fns(nnx.split(long_model, nnx.Param)[0], CFG, (4, 8), (16, 32))
    naive = nnx.eval_shape(
        lambda: qwen3.Qwen3(CFG, attention_impl="naive", logits_tile=0, rngs=nnx.Rngs(0))
    )
    score = chunks.make_score_grad_fn(nnx.split(naive, nnx.Param)[0], (32,))
    return graphdef, params, fns, score


def _batch(rng):
    batch = []
    for prompt_len, members in GROUPS:
        prompt = rng.integers(1, CFG.vocab_size, prompt_len).astype(np.int32)
        batch.append(
            (
                prompt,
                [
                    ([rng.integers(1, CFG.vocab_size, n).astype(np.int32) for n in lens], r)
                    for lens, r in members
                ],
            )
        )
    return batch


def _make_acc(advantage, loss_agg):
    return accumulators.grpo(
        num_groups=len(GROUPS), group_size=3, advantage=advantage, loss_agg=loss_agg, max_len=16
    )


def _per_member_reference(acc, params, score, batch):
    state = acc.init(params)
    for k, (prompt, members) in enumerate(batch):
        for pieces, reward in members:
            tokens = np.concatenate([prompt, *pieces])
            mask = np.zeros(len(tokens), np.float32)
            mask[len(prompt) :] = 1
            h, n = score(params, tokens[None], mask[None])
            state = acc.add(state, group=k, reward=reward, grad=h, num_tokens=n)
    return acc.finalize(state)


def _shared_prompts(acc, params, fns, batch):
    state, prompt_grads, groups = acc.init(params), None, []
    for k, (prompt, members) in enumerate(batch):
        group = segments_prompt.open_group(fns, params, prompt)
        for pieces, reward in members:
            traj, h, n = segments_prompt.member(fns, group), None, 0
            for piece in pieces:
                traj, res = fns.score(params, traj, piece, np.ones(len(piece)))
                h = res.grad if h is None else jax.tree.map(np.add, h, res.grad)
                n += res.num_tokens
            deferred, traj = fns.close(params, traj)
            if deferred is not None:
                h = jax.tree.map(np.add, h, deferred)
            state = acc.add(state, group=k, reward=reward, grad=h, num_tokens=n)
            group = segments_prompt.add_member(group, traj, reward, acc.loss_weight(n))
        groups.append(group)
    batch_rewards = [r for g in groups for r in g.rewards]
    for group in groups:
        scope = batch_rewards if acc.config.batch_scope else group.rewards
        scalars = segments_prompt.advantage_scalars(acc, scope)
        g = segments_prompt.close_group(fns, params, group, scalars)
        prompt_grads = g if prompt_grads is None else jax.tree.map(np.add, prompt_grads, g)
    extra = segments_prompt.prompt_term(acc, state, prompt_grads)
    return jax.tree.map(np.add, acc.finalize(state), extra)


@pytest.mark.parametrize(
    "advantage,loss_agg",
    [
        ("grpo", "seq-mean-token-mean"),
        # in make test, not test-quick (the unit tier's slowest compiles; grpo's stays, and
        # the batch advantage's shared prompt is also tests/algorithms/grpo_test.py's, quick)
        pytest.param("drgrpo", "token-mean", marks=pytest.mark.slow),
        pytest.param("rloo", "seq-mean-token-sum", marks=pytest.mark.slow),
        pytest.param("batch", "seq-mean-token-sum-norm", marks=pytest.mark.slow),
    ],
)
def test_shared_prompt_equals_per_member_prompts(parts, advantage, loss_agg):
    _, params, fns, score = parts
    batch = _batch(np.random.default_rng(2))
    acc = _make_acc(advantage, loss_agg)
    assert segments_prompt.shared_prompts_ok(acc)
    ref = _per_member_reference(acc, params, score, batch)
    ours = _shared_prompts(acc, params, fns, batch)
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(ours)]).astype(np.float64)
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(ref)]).astype(np.float64)
    assert np.linalg.norm(b) > 0
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-5


def test_bucketed_callable_falls_back_with_a_log_line(caplog):
    acc = _make_acc(lambda r: r - r.mean(), "seq-mean-token-mean")
    with caplog.at_level(logging.INFO, logger=segments_prompt.__name__):
        assert not segments_prompt.shared_prompts_ok(acc)
    assert "not affine" in caplog.text and "its own copy of the prompt" in caplog.text
    with pytest.raises(ValueError, match="affine"):
        segments_prompt.advantage_scalars(acc, [1.0, 0.0])


def test_member_of_another_group_is_refused(parts):
    _, params, fns, _ = parts
    group = segments_prompt.open_group(fns, params, [3, 4, 5])
    stranger = fns.open()
    with pytest.raises(ValueError, match="not forked from this group"):
        segments_prompt.add_member(group, stranger, 1.0, 1.0)
