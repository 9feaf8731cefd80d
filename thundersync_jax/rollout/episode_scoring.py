"""Incremental teacher scoring: each episode keeps its own KV cache, a turn forwards only its
new tokens (DESIGN §2: "the teacher scores incrementally from its own per-episode cache").

Re-scoring the whole prefix every turn costs the teacher ≈ (n+1)/2 full forwards for n turns;
with the cache a trajectory costs one forward in total. Caches are released when the episode
ends or fails (`release`), and at most `max_episodes` are open at once: one more raises a
clear error instead of growing memory without bound.

    teacher = IncrementalTeacher(model, max_len=2048)
    lp = teacher.score("episode-7", prefix_tokens, turn_start, turn_end)   # float32 [end-start]
    teacher.release("episode-7")
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from thundersync_jax.learner import buckets
from thundersync_jax.models import qwen3


class _Episode:
    """One episode's cache and the tokens it has forwarded (host copy, for checks)."""

    def __init__(self, cache: qwen3.KVCache):
        self.cache = cache
        self.forwarded = np.zeros(0, np.int32)


class IncrementalTeacher:
    """A frozen Qwen3 teacher that scores turns from a per-episode KV cache.

    Args:
      model: the teacher (a `qwen3.Qwen3`); its parameters are read once and never change.
      max_len: cache slots per episode (the longest trajectory the teacher scores).
      seq_buckets: padded lengths of the new tokens of one call (bounded compilations).
      max_episodes: most episodes with a live cache at once.
      temperature: scores log_softmax(logits / temperature) (1.0 for distillation).
    """

    def __init__(
        self,
        model: Any,
        max_len: int,
        seq_buckets: Sequence[int] = (16, 64, 256, 1024),
        max_episodes: int = 64,
        temperature: float = 1.0,
    ):
        self.graphdef, self.params = nnx.split(model, nnx.Param)
        self.cfg = model.cfg
        # Every turn's new tokens must fit one call: the longest bucket covers the cache.
        seq_buckets = sorted({int(b) for b in seq_buckets if b < max_len} | {int(max_len)})
        self.max_len = int(max_len)
        self.seq_buckets = buckets.validate_buckets(seq_buckets)
        self.max_episodes = int(max_episodes)
        self.temperature = float(temperature)
        self.compiles = 0
        self._episodes: dict[Hashable, _Episode] = {}
        self._lock = threading.Lock()
        self._forward = jax.jit(self._forward_fn, donate_argnums=(1,))

    def _forward_fn(self, params, cache, ids, mask, targets):
        self.compiles += 1  # runs once per trace
        model = nnx.merge(self.graphdef, params)
        hidden, cache = model.hidden_states(ids, attention_mask=mask, cache=cache)
        return model.token_terms(hidden, targets, self.temperature)[0], cache

    @property
    def open_episodes(self) -> int:
        return len(self._episodes)

    def has_room(self, episode: Hashable) -> bool:
        """Whether scoring `episode` now keeps within `max_episodes` caches."""
        with self._lock:
            return episode in self._episodes or len(self._episodes) < self.max_episodes

    def score(
        self, episode: Hashable, prefix_tokens: Sequence[int], turn_start: int, turn_end: int
    ) -> np.ndarray:
        """log π_T(prefix[t] | prefix[:t]) for t in [turn_start, turn_end), float32.

        Forwards only the tokens the episode's cache has not seen (prefix[len(cache) :
        turn_end - 1]). Turns of an episode must come in order: a turn starting before the
        previous one ended would need logits the cache no longer has.
        """
        prefix = np.asarray(prefix_tokens, np.int32).reshape(-1)
        if not 1 <= turn_start < turn_end <= len(prefix) or turn_end > self.max_len + 1:
            raise ValueError(
                f"turn [{turn_start}, {turn_end}) must satisfy 1 <= start < end <= "
                f"len(prefix)={len(prefix)} and end <= max_len + 1 = {self.max_len + 1}"
            )
        with self._lock:
            state = self._episodes.get(episode)
            if state is None:
                if len(self._episodes) >= self.max_episodes:
                    raise RuntimeError(
                        f"{len(self._episodes)} teacher episode caches are open (max_episodes="
                        f"{self.max_episodes}): release finished or failed episodes first"
                    )
                state = _Episode(qwen3.init_cache(self.cfg, 1, self.max_len))
                self._episodes[episode] = state
        done = len(state.forwarded)
        if turn_start - 1 < done:
            raise ValueError(
                f"episode {episode!r}: turn starts at {turn_start} but the cache already holds "
                f"{done} tokens; turns must be scored in order, each after the previous one"
            )
        if not np.array_equal(prefix[:done], state.forwarded):
            raise ValueError(f"episode {episode!r}: the prefix differs from what was scored before")
        new = prefix[done : turn_end - 1]  # inputs; input t predicts token t + 1
        width = buckets.bucket_length(max(len(new), 2), self.seq_buckets)
        ids = np.zeros((1, width), np.int32)
        ids[0, : len(new)] = new
        mask = np.zeros((1, width), bool)
        mask[0, : len(new)] = True
        targets = np.zeros((1, width), np.int32)
        targets[0, : len(new)] = prefix[done + 1 : turn_end]
        logp, state.cache = self._forward(self.params, state.cache, ids, mask, targets)
        state.forwarded = prefix[: turn_end - 1].copy()
        # logp[i] scores token done + 1 + i; the turn's tokens start at turn_start.
        first = turn_start - (done + 1)
        return np.asarray(logp)[0, first : first + turn_end - turn_start].astype(np.float32)

    def release(self, episode: Hashable) -> None:
        """Frees an episode's cache (it ended or failed); unknown episodes are ignored."""
        with self._lock:
            self._episodes.pop(episode, None)


class EpisodeScoring:
    """The engine-process side of incremental scoring (`score_turns` / `release_episodes`).

    The rollout server hands these two calls here (protocol `EPISODE_OPS`); the teacher (an
    `IncrementalTeacher`) is built from the backend's loaded weights on first use and dropped
    when new weights load (its caches were computed with the old ones).

    Args:
      backend: the server's engine; needs `model()` (the loaded Qwen3) and `limits`.
      max_episodes: most episode caches open at once in this process; a turn of a new
        episode past that is scored from its whole prefix instead (no cache), so the teacher's
        memory stays bounded and no turn fails.
    """

    def __init__(self, backend: Any, max_episodes: int = 256):
        self.backend = backend
        self.max_episodes = int(max_episodes)
        self._teacher: IncrementalTeacher | None = None

    def reset(self) -> None:
        """New weights: every cache is stale (episodes start over from their prefix)."""
        self._teacher = None

    def teacher(self) -> IncrementalTeacher:
        if self._teacher is None:
            if not hasattr(self.backend, "model"):
                raise ValueError(
                    f"{type(self.backend).__name__} has no incremental scoring; serve the "
                    "teacher with the embedded engine"
                )
            max_len = int(self.backend.limits.max_seq_len)
            self._teacher = IncrementalTeacher(
                self.backend.model(), max_len, max_episodes=self.max_episodes
            )
        return self._teacher

    def handle(self, op: str, message: dict) -> dict:
        """The reply value of one `score_turns` or `release_episodes` call."""
        if op == "score_turns":
            teacher = self.teacher()
            out = []
            for turn in message["turns"]:
                episode, start, end = str(turn["episode"]), int(turn["start"]), int(turn["end"])
                if teacher.has_room(episode):
                    out.append(teacher.score(episode, turn["tokens"], start, end))
                else:  # every cache slot is taken: score this turn from scratch (exact too)
                    (lp,) = self.backend.score([np.asarray(turn["tokens"][:end], np.int32)])
                    out.append(np.asarray(lp, np.float32)[start - 1 : end - 1])
            return {"logprobs": out}
        if op == "release_episodes":
            if self._teacher is not None:
                for episode in message["episodes"]:
                    self._teacher.release(str(episode))
            return {"open": 0 if self._teacher is None else self._teacher.open_episodes}
        raise ValueError(f"unknown episode op {op!r}; valid: score_turns, release_episodes")
