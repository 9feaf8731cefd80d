"""Rollout server process: a ZeroMQ ROUTER in front of one generation backend.

    python -m thundersync_jax.rollout.server --address ipc:///tmp/e0.sock \\
        --model-config '{"vocab_size": 384, ...}' --init-seed 0 --max-batch 8 --max-seq-len 256

The engine thread drains incoming messages, advances the backend by one step (prefill of newly
admitted requests, then one decode token for every active row), and sends each result as soon
as its request finishes; an I/O thread owns the socket and answers health checks directly. JAX
(or vLLM) is first imported by `build_backend`, inside the server process, so a parent never
shares JAX state with an engine.

Weight loads are barriers in arrival order: requests received before a `load_weights` finish on the
old weights, requests received after it wait and run on the new ones, so every result has exactly
one policy version. A load that carries a probe (`load_probe`) is acknowledged only after the
engine's log-probs of the probe match the learner's; on a mismatch the call fails and the server
refuses to sample (error results) until a later load verifies.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import zmq

from thundersync_jax.rollout import load_probe, protocol, wire
from thundersync_jax.rollout.protocol import GenerateRequest, GenerateResult, RequestError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INITIAL_VERSION = -1  # weights that were never published (random init or a base checkpoint)


class Backend(Protocol):
    """What the server needs from a generation engine (embedded JAX sampler or vLLM)."""

    limits: protocol.EngineLimits
    version: int

    def submit(self, request: GenerateRequest) -> None: ...
    def cancel(self, request_id: str) -> bool: ...
    def has_work(self) -> bool: ...
    def step(self) -> list[GenerateResult]: ...
    def fail_all(self, reason: str) -> list[GenerateResult]: ...
    def load_weights(self, path: str, version: int) -> None: ...
    def score(self, token_lists: Sequence[np.ndarray]) -> list[np.ndarray]: ...
    def stats(self) -> dict[str, Any]: ...


class RolloutServer:
    """Serves one backend on `address` until a shutdown message (or the parent process dies).

    Two threads: an I/O thread owns the ROUTER socket and answers `health` itself from the
    latest status, so a heartbeat is answered even while the engine thread is inside a long
    XLA compile; the engine thread (the caller of `serve_forever`) handles everything else.
    """

    def __init__(self, backend: Backend, address: str, *, parent_pid: int | None = None):
        self.backend = backend
        self.address = address
        self.parent_pid = parent_pid
        self._owner: dict[str, bytes] = {}  # request_id -> client identity
        self._held: list[GenerateRequest] = []  # arrived after a pending load_weights
        self._loads: list[tuple[bytes, Any, str, int, dict | None]] = []
        self._refusing: str | None = None  # why sampling is refused (a load failed its probe)
        from thundersync_jax.rollout.episode_scoring import EpisodeScoring  # JAX-side, lazily

        self._episodes = EpisodeScoring(backend)  # incremental teacher scoring, per episode
        self._running = True
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # (identity, message) for the engine
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (identity, frame) to send
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._status: dict[str, Any] = {}
        self._update_status()
        self._io_stopped = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.bind(address)  # in the constructor: a bad address fails before serving
        self._io = threading.Thread(target=self._io_loop, name="rollout-server-io", daemon=True)

    def serve_forever(self) -> None:
        self._io.start()
        last_parent_check = time.monotonic()
        try:
            while self._running:
                if not (self.backend.has_work() or self._loads):
                    try:  # idle: sleep until a message arrives
                        self._handle(*self._inbox.get(timeout=0.1))
                    except queue.Empty:
                        pass
                while True:  # everything that arrived, before the next step
                    try:
                        self._handle(*self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if self._loads and not self.backend.has_work():
                    self._run_loads()
                if self.backend.has_work():  # held requests wait; admitted ones run to the end
                    self._step()
                self._update_status()
                if time.monotonic() - last_parent_check > 1.0:
                    last_parent_check = time.monotonic()
                    if self.parent_pid is not None and os.getppid() != self.parent_pid:
                        print("rollout server: parent process is gone, exiting", file=sys.stderr)
                        break
        finally:
            self._io_stopped.set()
            self._wake()
            self._io.join(timeout=5)

    def _update_status(self) -> None:
        self._status = {  # replaced whole, so the I/O thread never reads a half-built dict
            "version": self.backend.version,
            "pid": os.getpid(),
            "held": len(self._held),
            "pending_loads": len(self._loads),
            "progress_time": time.time(),
            **self.backend.stats(),
        }

    # ------------------------------------------------------------------ I/O thread

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a full pipe already means "wake up"

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(1000))
                if self._wake_r in events:
                    os.read(self._wake_r, 4096)
                self._flush_outbox()
                if self._io_stopped.is_set():
                    return
                while self._sock.poll(0, zmq.POLLIN):
                    identity, frame = self._sock.recv_multipart()
                    self._route(identity, frame)
        finally:
            self._flush_outbox()
            self._sock.close(linger=1000)

    def _flush_outbox(self) -> None:
        while True:
            try:
                self._sock.send_multipart(self._outbox.get_nowait())
            except queue.Empty:
                return

    def _route(self, identity: bytes, frame: bytes) -> None:
        try:
            message = wire.decode(frame)
        except wire.WireError as e:
            print(f"rollout server: dropped a bad frame: {e}", file=sys.stderr)
            return
        if message["op"] == protocol.OP_HEALTH:
            reply = self._reply_frame(message.get("call_id"), value=self._status, error=None)
            self._sock.send_multipart([identity, reply])
        else:
            self._inbox.put((identity, message))

    # ------------------------------------------------------------------ messages

    def _handle(self, identity: bytes, message: dict) -> None:
        op, call_id = message["op"], message.get("call_id")
        try:
            if op == protocol.OP_GENERATE:
                self._on_generate(identity, message.get("requests"))
            elif op == protocol.OP_CANCEL:
                self._on_cancel(message.get("request_ids") or [])
            elif op == protocol.OP_LOAD_WEIGHTS:
                path, version = message["path"], int(message["version"])
                self._loads.append((identity, call_id, path, version, message.get("probe")))
            elif op == protocol.OP_SCORE:
                value = {"logprobs": self.backend.score(message["tokens"])}
                self._reply(identity, call_id, value=value)
            elif op in protocol.EPISODE_OPS:
                self._reply(identity, call_id, value=self._episodes.handle(op, message))
            elif op == protocol.OP_SHUTDOWN:
                self._reply(identity, call_id, value={})
                self._running = False
            else:
                raise RequestError(
                    f"unknown op {op!r}; valid: generate, cancel, {protocol.CALL_OPS}"
                )
        except Exception as e:  # a bad call must not take the server down
            if op in protocol.CALL_OPS or call_id is not None:
                self._reply(identity, call_id, error=f"{type(e).__name__}: {e}")
            else:
                print(f"rollout server: {op} failed: {e}", file=sys.stderr)

    def _on_generate(self, identity: bytes, requests: Any) -> None:
        if not isinstance(requests, list):
            raise RequestError("generate needs a list of requests")
        for raw in requests:
            rid = raw.get("request_id") if isinstance(raw, dict) else None
            rid = rid if isinstance(rid, str) else "<missing request_id>"
            try:
                req = protocol.request_from_wire(raw)
                protocol.validate_request(req, self.backend.limits)
                if req.request_id in self._owner:
                    raise RequestError(f"request_id {req.request_id!r} is already in flight")
                if self._refusing is not None and not self._loads:
                    raise RequestError(f"engine refuses to sample: {self._refusing}")
            except Exception as e:
                error = str(e) if isinstance(e, RequestError) else f"{type(e).__name__}: {e}"
                res = protocol.error_result(rid, error, self.backend.version)
                self._send_result(identity, res)
                continue
            self._owner[req.request_id] = identity
            if self._loads:
                self._held.append(req)
            else:
                self.backend.submit(req)

    def _on_cancel(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            identity = self._owner.get(rid)
            held = [r for r in self._held if r.request_id == rid]
            if held:
                self._held.remove(held[0])
            elif not self.backend.cancel(rid):
                continue
            if identity is not None:
                res = protocol.error_result(rid, "cancelled", self.backend.version)
                self._send_result(identity, res)
                self._owner.pop(rid, None)

    def _run_loads(self) -> None:
        while self._loads:
            identity, call_id, path, version, probe = self._loads.pop(0)
            try:
                self.backend.load_weights(path, version)
                self._episodes.reset()
                if probe is not None:
                    engine_lp = self.backend.score([probe["tokens"]])[0]
                    gap = load_probe.verify_probe(probe, engine_lp, version)
                    print(
                        f"rollout server: version {version} verified, max |Δ| {gap:.3g}",
                        file=sys.stderr,
                    )
                self._refusing = None
                self._update_status()  # a health call right after the ack sees the new version
                self._reply(identity, call_id, value={"version": self.backend.version})
            except Exception as e:
                if isinstance(e, load_probe.UnverifiedWeightsError):
                    self._refusing = f"loading version {version} failed: {type(e).__name__}: {e}"
                self._reply(identity, call_id, error=f"{type(e).__name__}: {e}")
        held, self._held = self._held, []
        for req in held:
            if self._refusing is None:
                self.backend.submit(req)
            else:
                self._send_result(
                    self._owner.pop(req.request_id),
                    protocol.error_result(
                        req.request_id,
                        f"engine refuses to sample: {self._refusing}",
                        self.backend.version,
                    ),
                )

    def _step(self) -> None:
        try:
            finished = self.backend.step()
        except Exception:
            reason = f"engine step failed: {traceback.format_exc(limit=3)}"
            print(reason, file=sys.stderr)
            finished = self.backend.fail_all(reason)
        for res in finished:
            identity = self._owner.pop(res.request_id, None)
            if identity is not None:
                self._send_result(identity, res)

    # ------------------------------------------------------------------ replies

    def _send_result(self, identity: bytes, res: GenerateResult) -> None:
        frame = wire.encode({"op": protocol.OP_RESULT, "result": protocol.result_to_wire(res)})
        self._outbox.put([identity, frame])
        self._wake()

    def _reply(self, identity: bytes, call_id: Any, *, value: Any = None, error: str | None = None):
        self._outbox.put([identity, self._reply_frame(call_id, value=value, error=error)])
        self._wake()

    @staticmethod
    def _reply_frame(call_id: Any, *, value: Any, error: str | None) -> bytes:
        message = {
            "op": protocol.OP_REPLY,
            "call_id": call_id,
            "ok": error is None,
            "value": value,
            "error": error,
        }
        return wire.encode(message)


# ----------------------------------------------------------------------------- process entry


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="thundersync rollout engine server")
    p.add_argument("--address", required=True, help="tcp://127.0.0.1:PORT or ipc:///path")
    p.add_argument("--engine", default="embedded", choices=("embedded", "vllm"))
    p.add_argument("--model-config", default="", help="HF config.json fields as JSON")
    p.add_argument("--checkpoint", default="", help="HF safetensors directory (else random init)")
    p.add_argument("--init-seed", type=int, default=0, help="seed of the random init")
    p.add_argument("--snapshot", default="", help="published snapshot to load at start")
    p.add_argument("--version", type=int, default=INITIAL_VERSION, help="version of --snapshot")
    p.add_argument("--max-batch", type=int, default=8, help="cache rows (continuous batching)")
    p.add_argument("--max-seq-len", type=int, default=512, help="prompt + generation per row")
    p.add_argument("--dtype", default="float32", help="compute dtype (float32, bfloat16)")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this parent dies")
    p.add_argument("--lora-rank", type=int, default=0, help="serve base + published adapters")
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-targets", default=",".join(LORA_TARGETS))
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel size (vllm engine)")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="of each GPU (vllm engine)")
    p.add_argument("--vllm-kwargs", default="{}", help="JSON kwargs for vllm.LLM (vllm engine)")
    return p


def server_args(
    hf_config: dict | None = None,
    *,
    engine: str = "embedded",
    checkpoint: str = "",
    init_seed: int = 0,
    max_batch: int = 8,
    max_seq_len: int = 512,
    dtype: str = "float32",
    param_dtype: str = "float32",
    lora: tuple[int, float, Sequence[str]] | None = None,
    vllm_kwargs: dict | None = None,
    tp_size: int = 1,
    memory_fraction: float = 0.9,
) -> list[str]:
    """The command line (minus --address/--parent-pid) for EngineManager(server_args=...).

    Args:
      hf_config: the model's HF config dict (`qwen3.Qwen3Config.to_hf()`), for a random init
        with `init_seed` when there is no `checkpoint`.
      lora: (rank, alpha, targets) to serve published LoRA adapters on the initial weights.
    """
    args = ["--engine", engine, "--init-seed", str(init_seed), "--max-batch", str(max_batch)]
    args += ["--max-seq-len", str(max_seq_len), "--dtype", dtype, "--param-dtype", param_dtype]
    args += ["--tp-size", str(tp_size), "--memory-fraction", str(memory_fraction)]
    if hf_config is not None:
        args += ["--model-config", json.dumps(hf_config)]
    if checkpoint:
        args += ["--checkpoint", checkpoint]
    if lora is not None:
        rank, alpha, targets = lora
        args += ["--lora-rank", str(rank), "--lora-alpha", str(alpha)]
        args += ["--lora-targets", ",".join(targets)]
    if vllm_kwargs:
        args += ["--vllm-kwargs", json.dumps(vllm_kwargs)]
    return args


def build_backend(args: argparse.Namespace) -> Backend:
    """Creates the backend named by --engine; JAX (or vLLM) is first imported here."""
    if args.engine == "vllm":
        from thundersync_jax.rollout import vllm_engine

        return vllm_engine.VLLMBackend.from_args(args)
    from thundersync_jax.rollout import embedded

    return embedded.EmbeddedEngine.from_args(args)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_arg_parser().parse_args(argv)
    if args.model_config:
        json.loads(args.model_config)  # fail before the (slow) backend start on bad JSON
    backend = build_backend(args)
    if args.snapshot:
        backend.load_weights(args.snapshot, args.version)
    server = RolloutServer(backend, args.address, parent_pid=args.parent_pid)
    print(f"rollout server pid {os.getpid()} serving on {args.address}", file=sys.stderr)
    server.serve_forever()


if __name__ == "__main__":
    main()
