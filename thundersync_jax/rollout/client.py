"""Client side of the engine protocol: a ZeroMQ DEALER driven by one background I/O thread.

The I/O thread owns the socket (ZeroMQ sockets must not be shared between threads); public
methods hand it messages through a queue and wake it through a pipe, so any number of threads
(e.g. one agent loop per trajectory) can call `generate`, `score` or `health` concurrently.
Results stream back per request as each finishes.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import zmq

from thundersync_jax.rollout import protocol, wire
from thundersync_jax.rollout.protocol import EngineError, GenerateRequest, GenerateResult

ResultCallback = Callable[[GenerateResult], None]


class EngineClient:
    """Talks to one rollout server at `address` (tcp://host:port or ipc:///path).

    Args:
      address: the server's bound ZeroMQ endpoint.
      timeout_s: default deadline for generate requests and calls.
    """

    def __init__(self, address: str, *, timeout_s: float = 300.0):
        self.address = address
        self.timeout_s = float(timeout_s)
        self._ctx = zmq.Context.instance()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already means "wake up"
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[GenerateRequest, ResultCallback]] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._io_loop, name=f"engine-io {address}")
        self._thread.daemon = True
        self._thread.start()

    # ------------------------------------------------------------------ generate

    def submit(self, requests: Iterable[GenerateRequest], on_result: ResultCallback) -> None:
        """Sends requests; `on_result` is called (from the I/O thread) once per request."""
        requests = list(requests)
        with self._lock:
            if self._closed.is_set():
                raise EngineError(f"client for {self.address} is closed")
            for req in requests:
                if req.request_id in self._pending:
                    raise ValueError(f"request_id {req.request_id!r} is already in flight")
            ids = [r.request_id for r in requests]
            if len(set(ids)) != len(ids):
                raise ValueError(f"duplicate request_ids in one submit: {ids}")
            for req in requests:
                self._pending[req.request_id] = (req, on_result)
        wire_requests = [protocol.request_to_wire(r) for r in requests]
        self._send({"op": protocol.OP_GENERATE, "requests": wire_requests})

    def generate(
        self, requests: Sequence[GenerateRequest], *, timeout_s: float | None = None
    ) -> Iterator[GenerateResult]:
        """Yields one result per request, in completion order.

        A request not answered within `timeout_s` yields an error result ("timed out") and is
        cancelled on the server, which frees its cache row.
        """
        results: queue.SimpleQueue = queue.SimpleQueue()
        self.submit(requests, results.put)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        waiting = {r.request_id for r in requests}
        while waiting:
            try:
                res = results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            waiting.discard(res.request_id)
            yield res
        if waiting:
            timed_out = sorted(waiting)
            self.cancel(timed_out)
            for rid in timed_out:
                yield protocol.error_result(
                    rid, f"timed out after {timeout_s or self.timeout_s}s", -1
                )

    def cancel(self, request_ids: Sequence[str]) -> None:
        """Drops the requests locally and asks the server to free their rows."""
        with self._lock:
            for rid in request_ids:
                self._pending.pop(rid, None)
        self._send({"op": protocol.OP_CANCEL, "request_ids": list(request_ids)})

    # ------------------------------------------------------------------ calls

    def call_async(self, op: str, **fields: Any) -> concurrent.futures.Future:
        """Sends a call (load_weights, score, health, shutdown); the future gets the reply."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._call_ids)
        with self._lock:
            if self._closed.is_set():
                future.set_exception(EngineError(f"client for {self.address} is closed"))
                return future
            self._calls[call_id] = future
        try:
            self._send({"op": op, "call_id": call_id, **fields})
        except EngineError as e:
            future.set_exception(e)
        return future

    def call(self, op: str, *, timeout_s: float | None = None, **fields: Any) -> Any:
        return self._result(self.call_async(op, **fields), op, timeout_s)

    def _result(self, future: concurrent.futures.Future, op: str, timeout_s: float | None) -> Any:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise EngineError(f"{op} on {self.address} got no reply within {timeout}s") from None

    def load_weights_async(
        self, path: str, version: int, *, probe: dict | None = None
    ) -> concurrent.futures.Future:
        """Sends the load of snapshot `path` (see `load_weights`); the future gets the reply,
        whose version `acknowledged_version` checks (EngineManager loads all engines at once)."""
        extra = {} if probe is None else {"probe": probe}
        return self.call_async(protocol.OP_LOAD_WEIGHTS, path=path, version=int(version), **extra)

    def load_weights(
        self,
        path: str,
        version: int,
        *,
        probe: dict | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Makes the engine load snapshot `path`; returns the version it acknowledged.

        Requests sent before this call finish on the old weights; later ones use the new.
        With a `probe` (load_probe.make_probe) the engine acknowledges only once its log-probs
        of the probe match; otherwise this raises EngineError with the measured gap.
        """
        future = self.load_weights_async(path, version, probe=probe)
        return acknowledged_version(
            self._result(future, protocol.OP_LOAD_WEIGHTS, timeout_s), version, "engine"
        )

    def score(
        self, token_lists: Sequence[Sequence[int]], *, timeout_s: float | None = None
    ) -> list[np.ndarray]:
        """Per-token log-probs of each sequence under the loaded weights.

        Returns, for a sequence of T tokens, a float32 array of T-1 entries:
        log p(tokens[t] | tokens[:t]) for t = 1..T-1.
        """
        arrays = [np.asarray(t, dtype=np.int32).reshape(-1) for t in token_lists]
        reply = self.call(protocol.OP_SCORE, tokens=arrays, timeout_s=timeout_s)
        return [np.asarray(x, dtype=np.float32) for x in reply["logprobs"]]

    def score_turns(self, turns: Sequence[dict], *, timeout_s: float | None = None) -> list:
        """Incremental teacher log-probs: per turn {"episode", "tokens", "start", "end"},
        float32 [end - start], from the engine's own per-episode cache (see protocol)."""
        reply = self.call(protocol.OP_SCORE_TURNS, turns=list(turns), timeout_s=timeout_s)
        return [np.asarray(x, dtype=np.float32) for x in reply["logprobs"]]

    def release_episodes(self, episodes: Sequence[str], *, timeout_s: float | None = None) -> int:
        """Frees the episodes' caches on the engine; returns how many stay open there."""
        reply = self.call(
            protocol.OP_RELEASE_EPISODES, episodes=list(episodes), timeout_s=timeout_s
        )
        return int(reply["open"])

    def health(self, *, timeout_s: float = 10.0) -> dict:
        """The server's status: version, active rows, queued requests, pid, compiles."""
        return self.call(protocol.OP_HEALTH, timeout_s=timeout_s)

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        """Waits until the server answers health (it may still be importing JAX)."""
        return self.health(timeout_s=timeout_s)

    def shutdown(self, *, timeout_s: float = 10.0) -> None:
        """Asks the server process to exit."""
        self.call(protocol.OP_SHUTDOWN, timeout_s=timeout_s)

    # ------------------------------------------------------------------ lifecycle

    def abandon(self) -> list[tuple[GenerateRequest, ResultCallback]]:
        """Closes the client without answering its in-flight requests; returns them (for retry)."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        self.close()
        return pending

    def close(self) -> None:
        """Stops the I/O thread; in-flight requests get error results, calls fail."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._wake()
        self._thread.join(timeout=10)
        self._fail_all(f"client for {self.address} closed")
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ I/O thread

    def _send(self, message: dict) -> None:
        frame = wire.encode(message)
        with self._lock:  # close() takes the lock before closing the pipe
            if self._closed.is_set():
                raise EngineError(f"client for {self.address} is closed")
            self._outbox.put(frame)
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _io_loop(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._closed.is_set():
                events = dict(poller.poll(1000))
                if self._wake_r in events:
                    os.read(self._wake_r, 4096)
                while True:
                    try:
                        sock.send(self._outbox.get_nowait(), copy=False)
                    except queue.Empty:
                        break
                while sock.poll(0, zmq.POLLIN):
                    self._dispatch(sock.recv(copy=False).bytes)
        finally:
            sock.close(linger=0)

    def _dispatch(self, frame: bytes) -> None:
        try:
            message = wire.decode(frame)
        except wire.WireError:
            return  # not from a well-behaved server; nothing to route it to
        if message["op"] == protocol.OP_RESULT:
            res = protocol.result_from_wire(message["result"])
            with self._lock:
                entry = self._pending.pop(res.request_id, None)
            if entry is not None:
                entry[1](res)
        elif message["op"] == protocol.OP_REPLY:
            with self._lock:
                future = self._calls.pop(message["call_id"], None)
            if future is None:
                return
            if message["ok"]:
                future.set_result(message["value"])
            else:
                future.set_exception(EngineError(message["error"]))

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            pending = list(self._pending.values())
            calls = list(self._calls.values())
            self._pending.clear()
            self._calls.clear()
        for req, callback in pending:
            callback(protocol.error_result(req.request_id, reason, -1))
        for future in calls:
            if not future.done():
                future.set_exception(EngineError(reason))


def acknowledged_version(reply: dict, version: int, engine: str) -> int:
    """The version a load reply acknowledged; EngineError naming `engine` if not `version`."""
    if int(reply["version"]) != int(version):
        raise EngineError(f"{engine} acknowledged version {reply['version']}, sent {version}")
    return int(version)
