"""EngineManager: N rollout server processes, with restart-and-retry on failure.

    mgr = EngineManager(["--model-config", cfg_json, "--max-batch", "8"], num_engines=2)
    mgr.start()
    path = mgr.publish(params, version=1, root=snapshots.default_root("run0"))  # waits for acks
    for res in mgr.generate(requests): ...
    mgr.close()

Engine processes inherit this process's environment, except that $THUNDERSYNC_ENGINE_XLA_FLAGS,
when set, replaces XLA_FLAGS in theirs: an engine runs a few programs (prefill, decode) for
thousands of steps, so it may want XLA's full optimizations where the learner was started
with compile-fast flags (the test suite does this: tests/README.md).

A monitor thread checks every engine each `heartbeat_s`: a process that exited, or one that
has not answered a health call for `heartbeat_timeout_s`, is killed and restarted. The new
process reloads the current snapshot, and the requests that were in flight on the old one are
sent again with the same keys, so the retried trajectories are token-for-token identical.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from thundersync_jax.rollout import protocol
from thundersync_jax.rollout.client import EngineClient, ResultCallback, acknowledged_version
from thundersync_jax.rollout.protocol import EngineError, GenerateRequest, GenerateResult

# When set: the engine processes' XLA_FLAGS (module docstring).
ENGINE_XLA_FLAGS_ENV = "THUNDERSYNC_ENGINE_XLA_FLAGS"


@dataclasses.dataclass
class _Engine:
    index: int
    address: str
    process: subprocess.Popen
    client: EngineClient
    last_ok: float
    health: Any = None  # the pending health future
    restarts: int = 0


class EngineManager:
    """Spawns and supervises `num_engines` rollout servers (`python -m ...rollout.server`).

    Args:
      server_args: command-line arguments for each server, without --address/--parent-pid.
      num_engines: processes to run.
      heartbeat_s: how often the monitor checks each engine.
      heartbeat_timeout_s: an engine silent this long (no health reply) counts as hung. It
        must exceed the longest step, compiles included.
      request_timeout_s: a request with no result this long gets an error result.
      start_timeout_s: how long a new process may take to answer its first health call.
      max_restarts: per engine; past it the engine's requests fail instead of retrying.
      env: extra environment variables for the server processes.
      engine_envs: per-engine variables on top of `env` (e.g. each engine's
        CUDA_VISIBLE_DEVICES, see engine_cmd.engine_envs); one map per engine.
      python: interpreter of the server processes (default: this one), e.g. a separate
        environment that holds vLLM.
      load_probe: `probe(params, kind) -> probe | None` (load_probe.learner_probe); every
        `publish` sends it with the load, so an engine acknowledges only verified weights.
    """

    def __init__(
        self,
        server_args: Sequence[str],
        num_engines: int = 1,
        *,
        heartbeat_s: float = 1.0,
        heartbeat_timeout_s: float = 120.0,
        request_timeout_s: float = 600.0,
        start_timeout_s: float = 180.0,
        max_restarts: int = 3,
        env: dict[str, str] | None = None,
        engine_envs: Sequence[dict[str, str]] | None = None,
        python: str | None = None,
        load_probe: Any = None,
    ):
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        self.server_args = list(server_args)
        self.num_engines = num_engines
        self.heartbeat_s = heartbeat_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.request_timeout_s = request_timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.env = {**os.environ, **(env or {})}
        if self.env.get(ENGINE_XLA_FLAGS_ENV):
            self.env["XLA_FLAGS"] = self.env[ENGINE_XLA_FLAGS_ENV]
        if engine_envs is not None and len(engine_envs) != num_engines:
            raise ValueError(f"engine_envs has {len(engine_envs)} maps for {num_engines} engines")
        self.engine_envs = list(engine_envs or [{}] * num_engines)
        self.python = python or sys.executable
        self.load_probe = load_probe
        self._sock_dir = tempfile.mkdtemp(prefix="thundersync-engines-")
        self._lock = threading.RLock()
        self._engines: list[_Engine] = []
        # request_id -> (request, callback, engine index, deadline)
        self._inflight: dict[str, tuple[GenerateRequest, ResultCallback, int, float]] = {}
        self._snapshot: tuple[str, int, dict | None] | None = None  # path, version, probe
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EngineManager:
        """Starts every engine (in parallel) and the monitor; returns self."""
        procs = [self._spawn(i) for i in range(self.num_engines)]
        self._engines = [self._connect(i, addr, proc) for i, (addr, proc) in enumerate(procs)]
        self._monitor = threading.Thread(target=self._monitor_loop, name="engine-monitor")
        self._monitor.daemon = True
        self._monitor.start()
        return self

    def close(self) -> None:
        """Shuts every engine down (killing any that do not exit) and stops the monitor."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10)
        for eng in self._engines:
            try:
                eng.client.shutdown(timeout_s=5)
            except EngineError:
                pass
            eng.client.close()
            try:
                eng.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            _kill_group(eng.process)  # also sweeps children left behind by a clean exit
            eng.process.wait()
        self._engines = []
        try:
            for name in os.listdir(self._sock_dir):
                os.unlink(os.path.join(self._sock_dir, name))
            os.rmdir(self._sock_dir)
        except OSError:
            pass

    def __enter__(self) -> EngineManager:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [eng.process.pid for eng in self._engines]

    @property
    def restarts(self) -> list[int]:
        return [eng.restarts for eng in self._engines]

    @property
    def version(self) -> int | None:
        """The version every engine acknowledged last (None before the first publish)."""
        return None if self._snapshot is None else self._snapshot[1]

    def kill(self, index: int) -> None:
        """SIGKILLs engine `index` (for fault-injection tests); the monitor restarts it."""
        os.kill(self._engines[index].process.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ generate

    def submit(self, requests: Sequence[GenerateRequest], on_result: ResultCallback) -> None:
        """Sends each request to the least-loaded engine; `on_result` gets one result each."""
        with self._lock:
            for req in requests:
                if req.request_id in self._inflight:
                    raise ValueError(f"request_id {req.request_id!r} is already in flight")
            deadline = time.monotonic() + self.request_timeout_s
            for req in requests:
                load = [0] * self.num_engines
                for _, _, idx, _ in self._inflight.values():
                    load[idx] += 1
                idx = min(range(self.num_engines), key=load.__getitem__)
                self._inflight[req.request_id] = (req, on_result, idx, deadline)
                self._send(idx, [req])

    def generate(self, requests: Sequence[GenerateRequest]) -> Iterator[GenerateResult]:
        """Yields one result per request, as each finishes (retries are invisible here)."""
        results: queue.SimpleQueue = queue.SimpleQueue()
        self.submit(requests, results.put)
        for _ in range(len(requests)):
            yield results.get()

    def _send(self, idx: int, requests: list[GenerateRequest]) -> None:
        eng = self._engines[idx]
        try:
            eng.client.submit(requests, lambda res, eng=eng: self._on_result(eng, res))
        except EngineError:
            pass  # the engine is being replaced; the restart resends everything in flight

    def _on_result(self, eng: _Engine, res: GenerateResult) -> None:
        with self._lock:
            entry = self._inflight.get(res.request_id)
            # Results of a replaced client are ignored: the request was (or will be) resent.
            if entry is None or self._engines[entry[2]].client is not eng.client:
                return
            del self._inflight[res.request_id]
        entry[1](res)

    # ------------------------------------------------------------------ weights and calls

    def load_weights(
        self,
        path: str,
        version: int,
        *,
        probe: dict | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Every engine loads snapshot `path`; returns once all acknowledged `version`.

        With a `probe` every engine verifies its load against it before acknowledging.
        """
        with self._lock:
            engines = list(self._engines)
        futures = [eng.client.load_weights_async(path, version, probe=probe) for eng in engines]
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        for eng, fut in zip(engines, futures, strict=True):
            try:
                reply = fut.result(timeout=timeout)
            except Exception as e:
                raise EngineError(f"engine {eng.index} did not load {path}: {e}") from e
            acknowledged_version(reply, version, f"engine {eng.index}")
        with self._lock:
            self._snapshot = (path, int(version), probe)
        return int(version)

    def publish(self, params: Any, version: int, root: str, **publish_kwargs: Any) -> str:
        """Writes snapshot `version` (see snapshots.publish) and waits for every engine's ack."""
        from thundersync_jax.rollout import snapshots  # JAX-side; the manager itself needs no JAX

        prepare_next = publish_kwargs.pop("prepare_next", True)
        kind = publish_kwargs.get("kind", "params")
        probe = None if self.load_probe is None else self.load_probe(params, kind)
        path = snapshots.publish(params, version, root, prepare_next=False, **publish_kwargs)
        self.load_weights(path, version, probe=probe)
        if prepare_next:  # after the acks, so preparing the next file does not slow the loads
            snapshots.prepare_next(path)
        return path

    def score(self, token_lists: Sequence[Sequence[int]]) -> list:
        """Per-token log-probs (see EngineClient.score) from the first engine."""
        return self._engines[0].client.score(token_lists, timeout_s=self.request_timeout_s)

    def episode_engine(self, episode: str) -> int:
        """The engine an episode's incremental scoring sticks to (its cache lives there)."""
        return zlib.crc32(str(episode).encode()) % len(self._engines)

    def score_turns(self, turns: Sequence[dict]) -> list:
        """Incremental log-probs (EngineClient.score_turns), each episode on its own engine."""
        out: list = [None] * len(turns)
        by_engine: dict[int, list[int]] = {}
        for i, t in enumerate(turns):
            by_engine.setdefault(self.episode_engine(t["episode"]), []).append(i)
        for e, rows in by_engine.items():
            client = self._engines[e].client
            lps = client.score_turns([turns[i] for i in rows], timeout_s=self.request_timeout_s)
            for i, lp in zip(rows, lps, strict=True):
                out[i] = lp
        return out

    def release_episodes(self, episodes: Sequence[str]) -> None:
        """Frees the episodes' caches on their engines."""
        by_engine: dict[int, list[str]] = {}
        for ep in episodes:
            by_engine.setdefault(self.episode_engine(ep), []).append(str(ep))
        for e, eps in by_engine.items():
            self._engines[e].client.release_episodes(eps, timeout_s=self.request_timeout_s)

    def health(self) -> list[dict]:
        return [eng.client.health() for eng in self._engines]

    # ------------------------------------------------------------------ processes

    def _spawn(self, index: int) -> tuple[str, subprocess.Popen]:
        address = f"ipc://{self._sock_dir}/engine{index}-{uuid.uuid4().hex[:6]}.sock"
        cmd = [self.python, "-m", "thundersync_jax.rollout.server", "--address", address]
        cmd += ["--parent-pid", str(os.getpid()), *self.server_args]
        env = {**self.env, **self.engine_envs[index]}
        # Own process group: killing an engine also kills what it spawned (vLLM's engine-core
        # and worker processes, which do not exit when their parent is SIGKILLed).
        return address, subprocess.Popen(cmd, env=env, start_new_session=True)

    def _connect(self, index: int, address: str, proc: subprocess.Popen) -> _Engine:
        client = EngineClient(address, timeout_s=self.request_timeout_s)
        deadline = time.monotonic() + self.start_timeout_s
        future = client.call_async(protocol.OP_HEALTH)
        while not future.done():
            if proc.poll() is not None or time.monotonic() > deadline:
                client.close()
                _kill_group(proc)
                raise EngineError(
                    f"engine {index} did not start (exit code {proc.poll()}); see its stderr"
                )
            time.sleep(0.05)
        future.result()
        return _Engine(index, address, proc, client, time.monotonic())

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            for idx in range(len(self._engines)):
                if self._stop.is_set():
                    return
                self._check(idx)
            self._expire_requests()

    def _check(self, idx: int) -> None:
        eng = self._engines[idx]
        now = time.monotonic()
        if eng.health is not None and eng.health.done():
            if eng.health.exception() is None:
                eng.last_ok = now
            eng.health = None
        dead = eng.process.poll() is not None
        hung = now - eng.last_ok > self.heartbeat_timeout_s
        if dead or hung:
            why = f"exited with {eng.process.returncode}" if dead else "stopped answering"
            self._restart(idx, why)
        elif eng.health is None:
            eng.health = eng.client.call_async(protocol.OP_HEALTH)

    def _restart(self, idx: int, why: str) -> None:
        old = self._engines[idx]
        old.client.abandon()
        if old.process.poll() is None:
            _kill_group(old.process)
        old.process.wait()
        with self._lock:
            mine = [(rid, e) for rid, e in self._inflight.items() if e[2] == idx]
        print(f"engine manager: engine {idx} {why}; restarting ({len(mine)} requests in flight)",
              file=sys.stderr)  # fmt: skip
        if old.restarts >= self.max_restarts:
            self._fail(mine, f"engine {idx} {why} and exceeded max_restarts={self.max_restarts}")
            return
        try:
            address, proc = self._spawn(idx)
            eng = self._connect(idx, address, proc)
            if self._snapshot is not None:
                path, version, probe = self._snapshot
                eng.client.load_weights(path, version, probe=probe, timeout_s=self.start_timeout_s)
        except EngineError as e:
            old.restarts += 1
            self._fail(mine, f"engine {idx} {why}; restart failed: {e}")
            return
        eng.restarts = old.restarts + 1
        with self._lock:
            self._engines[idx] = eng
            resend = [e[0] for rid, e in self._inflight.items() if e[2] == idx]
        if resend:
            self._send(idx, resend)

    def _fail(self, entries: list, reason: str) -> None:
        for rid, (_, callback, _, _) in entries:
            with self._lock:
                if self._inflight.pop(rid, None) is None:
                    continue
            callback(protocol.error_result(rid, reason, -1))

    def _expire_requests(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [(rid, e) for rid, e in self._inflight.items() if e[3] < now]
        for rid, entry in expired:
            self._engines[entry[2]].client.cancel([rid])
        self._fail(expired, f"no result within request_timeout_s={self.request_timeout_s}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the engine's whole process group (see `_spawn`), or the process alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
