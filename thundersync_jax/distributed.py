"""Process start-up for multi-controller runs, the global mesh, and process-to-group ownership.

    info = distributed.initialize(config.distributed)   # once, before any other JAX call
    mesh = distributed.global_mesh(fsdp=2, tp=2)         # axes (dp, fsdp, tp)
    mine = distributed.owned_groups(num_groups, info)    # group k belongs to process k mod P

One learner replica per process (DESIGN §7): a process's own devices form its `fsdp` x `tp`
block, the processes form the `dp` axis. Where the variables come from, in order:
explicit arguments; the config section (`coordinator_address`, `num_processes`,
`process_id`); the launcher's environment (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID`, as `experiments.launch_local` sets them); a cluster JAX detects itself
(SLURM, Open MPI, Kubernetes); else one process, and nothing is initialised.

Failure is bounded in time: a coordinator that cannot be reached is a `DistributedError`
after `init_timeout_s` (not JAX's five-minute wait), and a peer that dies makes the others
fail within `heartbeat_timeout_s` (JAX's coordination service), or at the next collective
(gloo: "connection closed by peer"), whichever comes first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
# Cluster variables that mean "several processes": JAX's own cluster detection reads the rest.
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class DistributedError(RuntimeError):
    """Multi-process start-up or layout is wrong; the message says what and what would do."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the run.

    Attributes:
      index: this process's id, 0 .. count-1 (process 0 writes metrics and exports).
      count: number of processes (learner replicas).
      coordinator: the coordinator's host:port, or "" for a one-process run.
    """

    index: int = 0
    count: int = 1
    coordinator: str = ""

    @property
    def is_main(self) -> bool:
        return self.index == 0


def _setting(section: Any, name: str, default: Any) -> Any:
    if section is None:
        return default
    value = section.get(name, default) if hasattr(section, "get") else getattr(section, name)
    return default if value in (None, "") else value


def resolve(
    section: Any = None,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: dict[str, str] | None = None,
) -> ProcessInfo | None:
    """The explicit layout to initialise with, or None when the cluster must say (or 1 process).

    Raises DistributedError naming the bad value when the pieces contradict each other.
    """
    env = os.environ if environ is None else environ
    addr = (
        coordinator_address
        or _setting(section, "coordinator_address", "")
        or env.get(ENV_COORDINATOR, "")
    )
    count = num_processes or int(_setting(section, "num_processes", 0) or 0)
    count = count or int(env.get(ENV_NUM_PROCESSES, "0") or 0)
    index = process_id if process_id is not None else int(_setting(section, "process_id", -1))
    if index < 0:
        index = int(env.get(ENV_PROCESS_ID, "-1") or -1)
    if not addr and count <= 1:
        return ProcessInfo() if count <= 1 and index <= 0 else _bad_layout(addr, count, index)
    if not addr or count < 1 or not 0 <= index < count:
        return _bad_layout(addr, count, index)
    if ":" not in addr:
        raise DistributedError(f"coordinator address {addr!r} needs a port: use host:port")
    return ProcessInfo(index=index, count=count, coordinator=addr)


def _bad_layout(addr: str, count: int, index: int):
    raise DistributedError(
        f"incomplete multi-process layout: coordinator_address={addr!r}, num_processes={count}, "
        f"process_id={index}; give all three (process_id in 0..num_processes-1), e.g. via "
        f"{ENV_COORDINATOR}=host:port {ENV_NUM_PROCESSES}=P {ENV_PROCESS_ID}=i, or none for one "
        "process"
    )


def _cluster_says_several(env: dict[str, str]) -> bool:
    return any(int(env.get(v, "1") or 1) > 1 for v in _CLUSTER_SIZE_VARS)


def wait_for_coordinator(address: str, timeout_s: float, info: ProcessInfo) -> None:
    """Polls a TCP connection to the coordinator; a clear error once `timeout_s` has passed."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, timeout_s)):
                return
        except OSError as e:  # refused / unreachable: the coordinator is not up (yet)
            last = e
            time.sleep(0.2)
    raise DistributedError(
        f"process {info.index} of {info.count}: the coordinator at {address} could not be "
        f"reached within {timeout_s:.0f} s ({last}); is process 0 running, and is the address "
        "right?"
    )


def initialize(
    section: Any = None,
    *,
    init_timeout_s: float | None = None,
    heartbeat_timeout_s: int | None = None,
    environ: dict[str, str] | None = None,
    **explicit: Any,
) -> ProcessInfo:
    """Initialises `jax.distributed` once (no-op for one process); returns this process's place."""
    import jax

    env = os.environ if environ is None else environ
    timeout = float(init_timeout_s or _setting(section, "init_timeout_s", 120.0))
    heartbeat = int(heartbeat_timeout_s or _setting(section, "heartbeat_timeout_s", 30))
    info = resolve(section, environ=env, **explicit)
    if info.count == 1 and not info.coordinator and not _cluster_says_several(env):
        return info
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        # CPU collectives across processes need an implementation (gloo is JAX's default).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = dict(
        initialization_timeout=max(1, int(timeout)), heartbeat_timeout_seconds=heartbeat
    )
    if info.coordinator:
        if info.index != 0:
            wait_for_coordinator(info.coordinator, timeout, info)
        kwargs.update(
            coordinator_address=info.coordinator,
            num_processes=info.count,
            process_id=info.index,
        )
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # jax raises a bare RuntimeError/XlaRuntimeError here
        raise DistributedError(
            f"jax.distributed.initialize failed for process {info.index} of {info.count} "
            f"(coordinator {info.coordinator or 'from the cluster'}): {e}"
        ) from e
    info = ProcessInfo(jax.process_index(), jax.process_count(), info.coordinator)
    log.info("process %d of %d joined (coordinator %s)", info.index, info.count, info.coordinator)
    return info


def owned_groups(num_groups: int, info: ProcessInfo) -> list[int]:
    """The groups of a batch this process samples and streams: group k belongs to k mod P."""
    return [k for k in range(int(num_groups)) if k % info.count == info.index]


def global_mesh(fsdp: int, tp: int, devices: Sequence[Any] | None = None):
    """Mesh (dp, fsdp, tp): one `dp` row per process, each row that process's own devices.

    Raises DistributedError when a process's device count is not fsdp * tp.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = list(jax.devices() if devices is None else devices)
    by_process: dict[int, list] = {}
    for d in devices:
        by_process.setdefault(int(d.process_index), []).append(d)
    per_process = int(fsdp) * int(tp)
    for p, devs in sorted(by_process.items()):
        if len(devs) != per_process:
            raise DistributedError(
                f"process {p} has {len(devs)} devices but mesh.fsdp={fsdp} x mesh.tp={tp} = "
                f"{per_process}: set fsdp*tp to the devices of one process "
                f"(valid here: fsdp*tp = {len(devs)})"
            )
    rows = [sorted(devs, key=lambda d: d.id) for _, devs in sorted(by_process.items())]
    grid = np.array(rows, dtype=object).reshape(len(rows), int(fsdp), int(tp))
    return Mesh(grid, ("dp", "fsdp", "tp"))


@contextlib.contextmanager
def main_first(name: str):
    """Process 0 runs the block first, the others after it (e.g. a cache they then hit).

    Every process must enter it (a barrier named `name` sits after process 0's block and
    before the others'); with one process it is a plain block.
    """
    import jax
    from jax.experimental import multihost_utils

    several, is_main = jax.process_count() > 1, jax.process_index() == 0
    if several and not is_main:
        multihost_utils.sync_global_devices(f"{name}: process 0 done")
    yield
    if several and is_main:
        multihost_utils.sync_global_devices(f"{name}: process 0 done")


def allgather(values: Any) -> Any:
    """[P, ...] numpy array of every process's `values` (same shape and dtype on each)."""
    import jax
    import numpy as np

    local = np.asarray(values)
    if jax.process_count() == 1:
        return local[None]
    from jax.experimental import multihost_utils

    # As bytes: JAX (without x64) would carry float64 / int64 as 32-bit, losing bits.
    raw = np.ascontiguousarray(local).reshape(-1).view(np.uint8)
    every = np.asarray(multihost_utils.process_allgather(raw))
    return every.view(local.dtype).reshape(every.shape[0], *local.shape)


@contextlib.contextmanager
def exit_on_failure():
    """With several processes, an exception ends this process at once (exit code 1).

    A failing process must not wait in JAX's shutdown barrier for peers that wait for it in
    the next collective: it logs the error and exits, so `launch_local` (or the cluster's
    launcher) stops the rest, and the others' heartbeat fails within `heartbeat_timeout_s`.
    """
    import jax

    try:
        yield
    except BaseException:
        if jax.process_count() == 1:
            raise
        log.exception("process %d of %d failed; exiting", jax.process_index(), jax.process_count())
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        logging.shutdown()
        os._exit(1)


def finish(info: ProcessInfo) -> None:
    """Ends a multi-process run in order: every process leaves together (no-op for one).

    JAX's own exit hook destroys the CPU client (and with it gloo's connections) before its
    shutdown barrier, so a process that finishes first closes its sockets while a slower peer
    may still be reading the last collective's bytes: gloo then throws "connection closed by
    peer" and the peer aborts (SIGABRT). A last collective and then the coordination
    service's shutdown barrier, both while every client is alive, leave nothing in flight.
    """
    if info.count == 1:
        return
    import jax
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("run finished")
    jax.distributed.shutdown()  # returns once every process has called it
    log.info("process %d of %d finished", info.index, info.count)
