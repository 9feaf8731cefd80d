"""Two adapters of the agent loop's `Sampler` protocol (defined in `agent_loop`).

* `GenerateSampler` runs `sampling.generate` in process (tests, small CPU runs). Requests
  from concurrent episodes are batched by one worker thread.
* `EngineSampler` sends each turn to a rollout engine through `rollout.EngineClient`.

Sampling is keyed: turn j of episode (seed, step, prompt, member) always uses the key
derived from those ids and j, so the tokens never depend on arrival order or batching.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Any

import jax

from thundersync_jax.envs.trajectory import Sample, TurnKey
from thundersync_jax.models import sampling
from thundersync_jax.rollout.protocol import GenerateRequest


def turn_key(key_ids: TurnKey) -> jax.Array:
    """The PRNG key of one turn: the episode's sequence key with the turn index folded in."""
    key = sampling.sequence_key(*key_ids.episode_ids)
    return jax.random.fold_in(key, key_ids.turn)


class GenerateSampler:
    """In-process `Sampler` over `sampling.generate`; batches concurrent requests.

    A worker thread takes whatever requests are waiting (up to `max_batch`, waiting at most
    `batch_wait_s` for more), groups them by `max_new_tokens`, and runs one `generate` call
    per group. Results do not depend on the grouping because every row has its own key.
    """

    def __init__(
        self,
        model: Any,
        params: sampling.SamplingParams,
        pad_id: int,
        policy_version: int = -1,
        max_batch: int = 8,
        batch_wait_s: float = 0.005,
    ):
        """Args:
        model: a `qwen3.Qwen3` (or anything `sampling.generate` accepts).
        params: temperature, top_p and stop ids; `max_new_tokens` is set per request.
        pad_id: padding id for batched prompts.
        policy_version: reported with every sample. -1, as for the
          rollout engine, means initial weights that were never published.
        max_batch: most requests per `generate` call.
        batch_wait_s: how long the worker waits for more requests before running a batch.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.params = params
        self.pad_id = pad_id
        self.policy_version = policy_version
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.batch_sizes: list[int] = []  # sizes of the generate calls made, for tests/metrics
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closed = False

    def sample(self, prompt_tokens: Sequence[int], key_ids: TurnKey, max_new_tokens: int) -> Sample:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:  # closing and enqueueing exclude each other: nothing is left behind
            if self._closed:
                raise RuntimeError("GenerateSampler is closed")
            self._queue.put((list(prompt_tokens), TurnKey(*key_ids), int(max_new_tokens), future))
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="generate-sampler")
                self._worker.daemon = True
                self._worker.start()
        return future.result()

    def close(self) -> None:
        """Stops the worker thread once the requests already queued are answered."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
            if worker is not None:
                self._queue.put(None)
        if worker is not None:
            worker.join()

    def __enter__(self) -> GenerateSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get(timeout=self.batch_wait_s)
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._run_batch(batch)
            if stop:
                return

    def _run_batch(self, batch: list) -> None:
        with self._lock:
            model, version = self.model, self.policy_version
        by_len = lambda item: item[2]
        for max_new, group in itertools.groupby(sorted(batch, key=by_len), key=by_len):
            group = list(group)
            try:
                params = dataclasses.replace(self.params, max_new_tokens=max_new)
                keys = [turn_key(key_ids) for _, key_ids, _, _ in group]
                prompts = [prompt for prompt, _, _, _ in group]
                self.batch_sizes.append(len(group))
                gens = sampling.generate(model, prompts, keys, params, pad_id=self.pad_id)
                for (_, _, _, future), gen in zip(group, gens, strict=True):
                    future.set_result(
                        Sample(list(gen.tokens), list(gen.logprobs), gen.finish_reason, version)
                    )
            except Exception as e:  # hand the failure to every waiting episode, keep serving
                for _, _, _, future in group:
                    if not future.done():
                        future.set_exception(e)


class EngineSampler:
    """`Sampler` over a rollout engine: one `GenerateRequest` per turn, keyed by `TurnKey`."""

    def __init__(self, client: Any, params: sampling.SamplingParams, request_prefix: str = "turn"):
        """Args:
        client: a `rollout.EngineClient` (or any object with the same `generate`).
        params: temperature, top_p and stop ids; `max_new_tokens` is set per request.
        request_prefix: prefix of request ids, which are unique per (episode, turn).
        """
        self.client = client
        self.params = params
        self.request_prefix = request_prefix
        self._serial = itertools.count()  # keeps ids unique when the same turn is re-sampled

    def sample(self, prompt_tokens: Sequence[int], key_ids: TurnKey, max_new_tokens: int) -> Sample:
        key_ids = TurnKey(*key_ids)
        ids = "-".join(str(int(i)) for i in key_ids)
        request_id = f"{self.request_prefix}-{ids}-{next(self._serial)}"
        request = GenerateRequest(
            request_id=request_id,
            prompt_tokens=list(prompt_tokens),
            sampling=dataclasses.replace(self.params, max_new_tokens=int(max_new_tokens)),
            key_ids=key_ids.episode_ids,
            turn=key_ids.turn,
        )
        results = list(self.client.generate([request]))
        if len(results) != 1 or results[0].request_id != request_id:
            raise RuntimeError(f"engine answered {len(results)} results for request {request_id}")
        res = results[0]
        if res.error is not None:
            raise RuntimeError(f"engine failed request {request_id}: {res.error}")
        return Sample(
            list(res.tokens), list(res.logprobs), res.finish_reason, res.policy_version, res.routes
        )
