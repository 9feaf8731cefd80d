"""TeacherScorer: per-turn teacher log-probs, aligned with the turn, computed asynchronously.

The backend is the real embedded engine (the code a teacher process runs), in-process; the
reference is a direct forward of the same model.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from thundersync_jax import losses
from thundersync_jax.models import qwen3
from thundersync_jax.rollout.embedded import EmbeddedEngine
from thundersync_jax.rollout.episode_scoring import EpisodeScoring
from thundersync_jax.teacher import TeacherScorer

CFG = qwen3.Qwen3Config(
    vocab_size=41,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=1,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=8,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def teacher():
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(3))
    return model, EmbeddedEngine(model, max_batch=4, max_seq_len=16)


def _reference(model, sequences: list[np.ndarray]) -> list[np.ndarray]:
    """Per sequence, [T-1] log π(tokens[t] | tokens[<t]) for t >= 1, from one jitted forward
    over the right-padded batch (padding after a sequence cannot change it: causal)."""
    width = max(len(s) for s in sequences)
    tokens = np.zeros((len(sequences), width), np.int32)
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = seq
    graphdef, params = nnx.split(model)
    forward = jax.jit(
        lambda p, x: losses.token_logprobs(nnx.merge(graphdef, p)(x[:, :-1]), x[:, 1:])
    )
    lp = np.asarray(forward(params, tokens), np.float64)
    return [lp[row, : len(seq) - 1] for row, seq in enumerate(sequences)]


def test_score_turn_returns_the_teachers_logprobs_of_that_turn(teacher):
    model, engine = teacher
    rng = np.random.default_rng(0)
    turns = []
    for _ in range(7):
        n = int(rng.integers(6, 15))
        tokens = rng.integers(1, CFG.vocab_size, size=n).astype(np.int32)
        start = int(rng.integers(1, n - 2))
        end = int(rng.integers(start + 1, n + 1))
        turns.append((tokens, start, end))
    with TeacherScorer(engine, num_workers=1, max_batch=4) as scorer:
        # The trajectory may go on past the turn: only its prefix matters (causal).
        futures = [scorer.score_turn(t, s, e) for t, s, e in turns]
        results = [f.result(timeout=120) for f in futures]
        assert scorer.turns == len(turns)
        assert scorer.calls <= len(turns)
    full = _reference(model, [t for t, _, _ in turns])
    for (_, start, end), got, lp in zip(turns, results, full, strict=True):
        assert got.dtype == np.float32 and got.shape == (end - start,)
        want = lp[start - 1 : end - 1]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_backend_errors_reach_the_turns_future_and_the_scorer_keeps_serving(teacher):
    _, engine = teacher
    too_long = np.ones(40, np.int32)  # the engine holds 16 tokens per row
    with TeacherScorer(engine) as scorer:
        bad = scorer.score_turn(too_long, 30, 40)
        with pytest.raises(Exception, match="40 tokens"):
            bad.result(timeout=120)
        ok = scorer.score_turn(np.arange(1, 9, dtype=np.int32), 3, 8)
        assert ok.result(timeout=120).shape == (5,)


def test_invalid_turns_and_closed_scorer_are_refused(teacher):
    _, engine = teacher
    scorer = TeacherScorer(engine)
    with pytest.raises(ValueError, match="turn \\[0, 3\\)"):
        scorer.score_turn(np.arange(5), 0, 3)
    with pytest.raises(ValueError, match="len\\(prefix\\)=5"):
        scorer.score_turn(np.arange(5), 2, 7)
    scorer.close()
    with pytest.raises(RuntimeError, match="closed"):
        scorer.score_turn(np.arange(5), 1, 3)


class _ServedEngine:
    """The engine with the server's episode calls wired as the rollout server wires them
    (`rollout.episode_scoring.EpisodeScoring` in front of the same backend), in-process."""

    def __init__(self, engine):
        self.engine = engine
        self.episodes = EpisodeScoring(engine)

    def score(self, token_lists):
        return self.engine.score(token_lists)

    def score_turns(self, turns):
        return self.episodes.handle("score_turns", {"turns": turns})["logprobs"]

    def release_episodes(self, episodes):
        return self.episodes.handle("release_episodes", {"episodes": episodes})["open"]


def test_episode_turns_score_incrementally_and_release_their_caches(teacher):
    model, engine = teacher
    served = _ServedEngine(engine)
    rng = np.random.default_rng(5)
    episodes = {}
    for name in ("a", "b", "c"):
        tokens = rng.integers(1, CFG.vocab_size, size=16).astype(np.int32)
        cuts = sorted(rng.choice(np.arange(2, 16), size=3, replace=False).tolist())
        spans = [(s, e) for s, e in zip([1, *cuts[:-1]], cuts, strict=True)]
        episodes[name] = (tokens, spans)
    with TeacherScorer(served, num_workers=2, max_batch=4) as scorer:
        assert scorer.incremental
        futures = {
            (name, j): scorer.score_turn(tokens[:e], s, e, episode=name)
            for name, (tokens, spans) in episodes.items()
            for j, (s, e) in enumerate(spans)
        }
        results = {key: f.result(timeout=120) for key, f in futures.items()}
        assert served.episodes.teacher().open_episodes == 3  # one cache per episode
        for name in episodes:
            scorer.release(name)
    assert served.episodes.teacher().open_episodes == 0
    # Past max_episodes caches, a new episode's turns are scored from their whole prefix.
    tight = _ServedEngine(engine)
    tight.episodes.max_episodes = 1
    with TeacherScorer(tight, num_workers=1) as scorer:
        for name, (tokens, spans) in episodes.items():
            for j, (s, e) in enumerate(spans):
                results[(name, j, "tight")] = scorer.score_turn(tokens[:e], s, e, name).result()
        assert tight.episodes.teacher().open_episodes == 1
    full = _reference(model, [tokens for tokens, _ in episodes.values()])
    for key, got in results.items():
        name, j = key[:2]
        s, e = episodes[name][1][j]
        want = full[list(episodes).index(name)][s - 1 : e - 1]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
