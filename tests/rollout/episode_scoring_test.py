"""Incremental teacher scoring from per-episode caches equals full-prefix re-scoring."""

import jax
import numpy as np
import pytest

from thundersync_jax.rollout.episode_scoring import IncrementalTeacher


@pytest.fixture(scope="module")
def teacher_model(tiny_qwen3_config, random_qwen3):
    return random_qwen3(tiny_qwen3_config(), seed=3)


def _full_prefix_scores(forward, prefix, start, end):
    """What the teacher computes today: a forward over the whole prefix, then log-softmax.
    (Causal: padding the prefix to 64 tokens leaves its first `end` logits as they are, and
    one jitted program serves every prefix instead of op-by-op compiles per length.)"""
    padded = np.zeros((1, 64), np.int32)
    padded[0, :end] = prefix[:end]
    logits = forward(padded)[:, :end]  # [1, end, V]
    z = np.asarray(logits[0], np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return np.array([logp[t - 1, prefix[t]] for t in range(start, end)])


@pytest.fixture(scope="module")
def forward(teacher_model):
    """The teacher's one-shot forward, jitted (one program for every 64-token prefix)."""
    jitted = jax.jit(lambda m, x: m(x))
    return lambda ids: jitted(teacher_model, ids)


def test_interleaved_episodes_score_like_full_prefixes(teacher_model, forward):
    teacher = IncrementalTeacher(teacher_model, max_len=64, seq_buckets=(8, 64))
    rng = np.random.default_rng(0)
    vocab = teacher_model.cfg.vocab_size
    episodes = {e: rng.integers(0, vocab, 60) for e in ("a", "b")}
    turns = {"a": [(3, 9), (12, 20), (20, 21), (30, 58)], "b": [(1, 4), (5, 40), (41, 60)]}
    order = [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("a", 3)]
    for episode, j in order:
        start, end = turns[episode][j]
        tokens = episodes[episode][:end]  # the episode so far
        got = teacher.score(episode, tokens, start, end)
        want = _full_prefix_scores(forward, episodes[episode], start, end)
        assert got.dtype == np.float32 and got.shape == (end - start,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert teacher.open_episodes == 2
    assert teacher.compiles <= 2  # one per length bucket
    teacher.release("a")
    teacher.release("a")  # idempotent
    assert teacher.open_episodes == 1


def test_limits_and_order_errors(teacher_model):
    teacher = IncrementalTeacher(teacher_model, max_len=32, seq_buckets=(32,), max_episodes=1)
    tokens = np.arange(1, 30) % teacher_model.cfg.vocab_size
    teacher.score(0, tokens, 5, 10)
    with pytest.raises(ValueError, match="in order"):
        teacher.score(0, tokens, 8, 12)  # overlaps the scored turn
    with pytest.raises(ValueError, match="differs"):
        teacher.score(0, tokens[::-1].copy(), 12, 14)
    with pytest.raises(RuntimeError, match="max_episodes=1"):
        teacher.score(1, tokens, 2, 4)  # a second episode while the first is open
    teacher.release(0)  # the episode ended or failed: its slot is free again
    teacher.score(1, tokens, 2, 4)
    with pytest.raises(ValueError, match="max_len"):
        teacher.score(1, np.zeros(40, np.int32), 5, 40)
