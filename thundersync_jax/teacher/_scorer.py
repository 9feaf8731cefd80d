"""`TeacherScorer`: asynchronous per-turn teacher log-probs for on-policy distillation.

    scorer = TeacherScorer(backend)                 # backend.score(token_lists) -> log-probs
    future = scorer.score_turn(prefix, start, end)  # returns at once
    ...                                             # the turn's tool call runs meanwhile
    teacher_lp = future.result()                    # float32 [end - start]

Requests queue up and worker threads send whatever has accumulated as one `score` call (the
engine batches the rows), so many episodes' turns share a teacher forward without any caller
waiting for a batch to fill.

With an `episode` key (and a backend with `score_turns`, e.g. the teacher's `EngineManager`)
a turn is scored incrementally: the teacher process keeps that episode's KV cache and forwards
only the tokens it has not seen (`rollout.episode_scoring`), so a trajectory costs the teacher one
forward in total instead of one per turn over the whole prefix. An episode's requests stay on
one worker (in order: its cache only grows); `release(episode)` frees the cache once the
episode ended or failed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)


class ScoreBackend(Protocol):
    """Anything with the rollout engines' `score` call (EngineManager, EngineClient, engine)."""

    def score(self, token_lists: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """For a sequence of T tokens: float32 [T-1], log p(tokens[t] | tokens[:t]), t >= 1."""
        ...


@dataclasses.dataclass
class _Request:
    prefix: np.ndarray
    start: int
    end: int
    future: concurrent.futures.Future
    episode: str | None = None


@dataclasses.dataclass
class _Release:
    episode: str


_STOP = object()


class TeacherScorer:
    """Scores assistant turns with a frozen teacher, asynchronously.

    Args:
      backend: where teacher log-probs come from (usually the teacher's engine process).
      num_workers: concurrent `score` calls in flight (one per teacher engine is enough).
      max_batch: most turns sent in one `score` call.
    """

    def __init__(self, backend: ScoreBackend, num_workers: int = 1, max_batch: int = 16):
        if num_workers < 1 or max_batch < 1:
            raise ValueError(
                f"num_workers={num_workers} and max_batch={max_batch} must both be >= 1"
            )
        self.backend = backend
        self.max_batch = max_batch
        self.incremental = hasattr(backend, "score_turns")
        self._queues: list[queue.Queue] = [queue.Queue() for _ in range(num_workers)]
        self._next_queue = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        self.calls = 0  # score calls sent (a batching diagnostic)
        self.turns = 0  # turns scored
        self._workers = [
            threading.Thread(target=self._work, args=(q,), name=f"teacher-scorer-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for w in self._workers:
            w.start()

    def _queue_of(self, episode: str | None) -> queue.Queue:
        if episode is None:
            return self._queues[next(self._next_queue) % len(self._queues)]
        return self._queues[zlib.crc32(episode.encode()) % len(self._queues)]

    def score_turn(
        self,
        prefix_tokens: Sequence[int],
        turn_start: int,
        turn_end: int,
        episode: str | None = None,
    ) -> concurrent.futures.Future:
        """Teacher log-probs of prefix_tokens[turn_start:turn_end], each given what precedes it.

        Args:
          prefix_tokens: the trajectory up to (at least) the turn's end.
          turn_start / turn_end: the turn's sampled tokens, [turn_start, turn_end).
          episode: a key unique to the episode: score incrementally from its cache (turns of
            an episode in order). None: score the prefix from scratch.

        Returns:
          A future of float32 [turn_end - turn_start]: entry i is
          log π_T(prefix[turn_start + i] | prefix[:turn_start + i]).
        """
        prefix = np.asarray(prefix_tokens, np.int32).reshape(-1)
        if not 1 <= turn_start < turn_end <= len(prefix):
            raise ValueError(
                f"turn [{turn_start}, {turn_end}) must satisfy 1 <= start < end <= "
                f"len(prefix)={len(prefix)} (the first token has no context to score it)"
            )
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("TeacherScorer is closed")
            # Only the context the turn depends on travels to the teacher (causal attention).
            key = episode if self.incremental else None
            request = _Request(prefix[:turn_end], turn_start, turn_end, future, key)
            self._queue_of(key).put(request)
        return future

    def release(self, episode: str) -> None:
        """Frees the episode's teacher cache after its queued turns (it ended or failed)."""
        with self._lock:
            if self.incremental and not self._closed:
                self._queue_of(episode).put(_Release(episode))

    def close(self) -> None:
        """Stops the workers after the queued turns are scored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for q in self._queues:
                q.put(_STOP)
        for w in self._workers:
            w.join()

    def __enter__(self) -> TeacherScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work(self, own: queue.Queue) -> None:
        while True:
            first = own.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:  # everything queued meanwhile rides along
                try:
                    nxt = own.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._score_batch(batch)
            if stop:
                return

    def _score_batch(self, batch: list) -> None:
        releases = [r.episode for r in batch if isinstance(r, _Release)]
        requests = [r for r in batch if isinstance(r, _Request)]
        self._score_requests([r for r in requests if r.episode is None])
        self._score_incremental([r for r in requests if r.episode is not None])
        if releases:  # after the batch's turns: an episode's release is queued after them
            try:
                self.backend.release_episodes(releases)
            except Exception as e:  # a lost cache is memory only: log-probs stay right
                log.warning("teacher: releasing %d episode caches failed: %s", len(releases), e)

    def _score_incremental(self, batch: list[_Request]) -> None:
        def score(live):
            return self.backend.score_turns(
                [dict(episode=r.episode, tokens=r.prefix, start=r.start, end=r.end) for r in live]
            )

        # The engine returns the turn's own log-probs.
        self._deliver(batch, score, lambda r: (r.end - r.start, f"{r.end - r.start}-token turn"),
                      lambda r, lp: lp)  # fmt: skip

    def _score_requests(self, batch: list[_Request]) -> None:
        # The engine scores the whole prefix: lp[t - 1] scores token t.
        self._deliver(
            batch,
            lambda live: self.backend.score([r.prefix for r in live]),
            lambda r: (len(r.prefix) - 1, f"{len(r.prefix)}-token prefix"),
            lambda r, lp: lp[r.start - 1 : r.end - 1].copy(),
        )

    def _deliver(self, batch: list[_Request], score, expect, turn_logprobs) -> None:
        """Scores the batch's live requests with `score(live)` and resolves each future with
        `turn_logprobs(r, lp)`, or with an error when the engine fails or `lp` has not the
        `expect(r)` length: a failure reaches every waiting turn, and the worker keeps serving."""
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            scored = score(live)
            if len(scored) != len(live):
                raise RuntimeError(f"teacher returned {len(scored)} results for {len(live)} turns")
        except Exception as e:
            for r in live:
                r.future.set_exception(e)
            return
        with self._lock:
            self.calls += 1
            self.turns += len(live)
        for r, lp in zip(live, scored, strict=True):
            lp = np.asarray(lp, np.float32).reshape(-1)
            want, what = expect(r)
            if len(lp) != want:
                error = f"teacher returned {len(lp)} log-probs for a {what}"
                r.future.set_exception(RuntimeError(error))
            else:
                r.future.set_result(turn_logprobs(r, lp))
