"""`TeacherScorer`: asynchronous per-turn teacher log-probs for on-policy distillation.

    scorer = TeacherScorer(backend)                 # backend.score(token_lists) -> log-probs
    future = scorer.score_turn(prefix, start, end)  # returns at once
    ...                                             # the turn's tool call runs meanwhile
    teacher_lp = future.result()                    # float32 [end - start]

Requests queue up and worker threads send whatever has accumulated as one `score` call (the
engine batches the rows), so many episodes' turns share a teacher forward without any caller
waiting for a batch to fill.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np


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
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self.calls = 0  # score calls sent (a batching diagnostic)
        self.turns = 0  # turns scored
        self._workers = [
            threading.Thread(target=self._work, name=f"teacher-scorer-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for w in self._workers:
            w.start()

    def score_turn(
        self, prefix_tokens: Sequence[int], turn_start: int, turn_end: int
    ) -> concurrent.futures.Future:
        """Teacher log-probs of prefix_tokens[turn_start:turn_end], each given what precedes it.

        Args:
          prefix_tokens: the trajectory up to (at least) the turn's end.
          turn_start / turn_end: the turn's sampled tokens, [turn_start, turn_end).

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
            self._queue.put(_Request(prefix[:turn_end], turn_start, turn_end, future))
        return future

    def close(self) -> None:
        """Stops the workers after the queued turns are scored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._workers:
                self._queue.put(_STOP)
        for w in self._workers:
            w.join()

    def __enter__(self) -> TeacherScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:  # everything queued meanwhile rides along
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._score_batch(batch)
            if stop:
                return

    def _score_batch(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            scored = self.backend.score([r.prefix for r in live])
            if len(scored) != len(live):
                raise RuntimeError(f"teacher returned {len(scored)} results for {len(live)} turns")
        except Exception as e:  # hand the failure to every waiting turn; keep serving
            for r in live:
                r.future.set_exception(e)
            return
        with self._lock:
            self.calls += 1
            self.turns += len(live)
        for r, lp in zip(live, scored, strict=True):
            lp = np.asarray(lp, np.float32).reshape(-1)
            if len(lp) != len(r.prefix) - 1:
                r.future.set_exception(
                    RuntimeError(
                        f"teacher returned {len(lp)} log-probs for a {len(r.prefix)}-token prefix"
                    )
                )
                continue
            # lp[t - 1] scores token t.
            r.future.set_result(lp[r.start - 1 : r.end - 1].copy())
