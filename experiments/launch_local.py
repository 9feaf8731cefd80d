r"""Starts P processes of one command on this machine, as a cluster launcher would.

    python -m experiments.launch_local --num_processes=2 --devices_per_process=4 -- \
        python -m experiments.swe_grpo --config=configs/cpu.py:smoke --workdir=DIR \
        --config.mesh.fsdp=2 --config.mesh.tp=2

Each process gets JAX_COORDINATOR_ADDRESS (loopback, a free port), JAX_NUM_PROCESSES,
JAX_PROCESS_ID and `--xla_force_host_platform_device_count=D` (fake CPU devices), which
`thundersync_jax.distributed.initialize` reads. Output lines are prefixed with `[pI]`. If any
process exits non-zero (or is killed), the others are stopped within `--grace_s` and the
launcher exits with that process's code: a dead replica never leaves the rest hanging.
SLURM / Kubernetes equivalents are in BUILD.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app, flags

_NUM = flags.DEFINE_integer("num_processes", 2, "Processes to start.", lower_bound=1)
_DEVICES = flags.DEFINE_integer(
    "devices_per_process", 1, "Fake CPU devices per process (XLA flag).", lower_bound=1
)
_PORT = flags.DEFINE_integer("port", 0, "Coordinator port on 127.0.0.1 (0: a free one).")
_GRACE = flags.DEFINE_float("grace_s", 10.0, "Seconds between SIGTERM and SIGKILL.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_env(base: dict, index: int, count: int, port: int, devices: int) -> dict:
    """The environment of process `index`: the coordinator variables and fake devices."""
    env = dict(base)
    flag = f"--xla_force_host_platform_device_count={devices}"
    kept = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env.update(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_NUM_PROCESSES=str(count),
        JAX_PROCESS_ID=str(index),
        XLA_FLAGS=" ".join([*kept, flag]),
        PYTHONUNBUFFERED="1",
    )
    return env


def _pump(index: int, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"[p{index}] ".encode() + line)
        out.flush()


def launch(
    command: list[str], count: int, devices: int, port: int = 0, grace_s: float = 10.0
) -> int:
    """Runs `command` as `count` processes; returns 0, or the first failing process's code."""
    if not command:
        raise app.UsageError("give the command after `--`, e.g. -- python -m experiments.swe_grpo")
    port = port or free_port()
    procs = []
    for i in range(count):
        p = subprocess.Popen(
            command,
            env=process_env(os.environ, i, count, port, devices),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so a stop reaches the whole process group
        )
        threading.Thread(target=_pump, args=(i, p.stdout, sys.stdout.buffer), daemon=True).start()
        procs.append(p)
    try:
        return _watch(procs, grace_s)
    except KeyboardInterrupt:
        _stop_all(procs, grace_s)
        return 130


def _watch(procs: list, grace_s: float) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i, code = failed[0]
            why = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            print(f"launch_local: process {i} {why}; stopping the others", file=sys.stderr)
            _stop_all(procs, grace_s)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop_all(procs: list, grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main(argv):
    sys.exit(launch(argv[1:], _NUM.value, _DEVICES.value, _PORT.value, _GRACE.value))


if __name__ == "__main__":
    app.run(main)
