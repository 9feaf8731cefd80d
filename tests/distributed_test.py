"""Process start-up: layouts from config or launcher variables, ownership, meshes, failures."""

import socket
import subprocess
import sys
import time

import jax
import pytest

from thundersync_jax import distributed
from thundersync_jax.distributed import DistributedError, ProcessInfo


def test_one_process_when_nothing_is_set():
    assert distributed.resolve(environ={}) == ProcessInfo(0, 1, "")
    assert distributed.initialize(environ={}) == ProcessInfo(0, 1, "")


def test_launcher_variables_and_explicit_arguments():
    env = {
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:9",
        "JAX_NUM_PROCESSES": "3",
        "JAX_PROCESS_ID": "2",
    }
    assert distributed.resolve(environ=env) == ProcessInfo(2, 3, "127.0.0.1:9")
    # Explicit arguments win over the environment.
    got = distributed.resolve(environ=env, process_id=0, num_processes=4)
    assert got == ProcessInfo(0, 4, "127.0.0.1:9")


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"JAX_COORDINATOR_ADDRESS": "127.0.0.1:9", "JAX_NUM_PROCESSES": "2"}, "process_id=-1"),
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "coordinator_address=''"),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
            "process_id=2",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "host", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
            "port",
        ),
    ],
)
def test_bad_layouts_are_clear_errors(env, needle):
    with pytest.raises(DistributedError, match=needle.replace("(", r"\(")):
        distributed.resolve(environ=env)


def test_owned_groups_is_k_mod_p_and_covers_the_batch():
    infos = [ProcessInfo(i, 3, "x:1") for i in range(3)]
    owned = [distributed.owned_groups(8, info) for info in infos]
    assert owned == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert sorted(sum(owned, [])) == list(range(8))


def test_global_mesh_one_process():
    mesh = distributed.global_mesh(fsdp=4, tp=2)
    assert dict(mesh.shape) == {"dp": 1, "fsdp": 4, "tp": 2}
    with pytest.raises(DistributedError, match="8 devices but mesh.fsdp=2 x mesh.tp=2"):
        distributed.global_mesh(fsdp=2, tp=2)
    assert len(jax.devices()) == 8


def test_unreachable_coordinator_is_a_clear_error_in_bounded_time():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    info = ProcessInfo(1, 2, f"127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match="could not be reached within 2 s"):
        distributed.wait_for_coordinator(info.coordinator, 2.0, info)
    assert time.monotonic() - t0 < 10


def test_unreachable_coordinator_through_initialize(tmp_path):
    # A second process that never sees process 0 exits with the message, not a hang.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "from thundersync_jax import distributed\n"
        f"distributed.initialize(coordinator_address='127.0.0.1:{port}', num_processes=2, "
        "process_id=1, init_timeout_s=3)\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "could not be reached within 3 s" in out.stderr
    assert time.monotonic() - t0 < 45
