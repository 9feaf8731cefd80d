"""Containment tests for the bubblewrap sandbox: real processes, real files, real sockets.

Each containment test also checks a control (the same action allowed where it should
be) so that a sandbox that simply fails everything would not pass. The containment
tests run twice: on the host toolchain and inside a container image (the host's
interpreter packaged as an OCI layout by images_fixtures.py, unpacked as the box's /).
"""

import importlib.util
import os
import pathlib
import shutil
import socket
import sys
import threading
import time
import uuid

import pytest

from thundersync_jax.envs import sandbox as sandbox_lib
from thundersync_jax.envs.sandbox import (
    Sandbox,
    SandboxUnavailableError,
    SandboxUnisolatedWarning,
    python_binds,
)

IS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def _image_fixtures():
    name = "tsj_images_test_fixtures"
    if name not in sys.modules:
        path = pathlib.Path(__file__).with_name("images_fixtures.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(params=["host", "image"])
def box(request):
    """Sandbox keyword arguments: the host toolchain, or an image as / (repo at /testbed)."""
    if request.param == "host":
        return {}
    fixtures = _image_fixtures()
    image = fixtures.cache().unpack(fixtures.python_oci())
    return {"rootfs": image.rootfs, "env": image.env, "root_at": "/testbed"}


def _host_pids_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _host_pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture
def task_dir(tmp_path):
    root = tmp_path / "task"
    root.mkdir()
    return root


def test_runs_in_task_dir_as_unprivileged_user(task_dir, box):
    with Sandbox(task_dir, **box) as sb:
        res = sb.run("pwd; id -u; echo hello > out.txt; ls /proc | grep -c '^[0-9]'")
    assert res.exit_code == 0, res.stderr
    pwd, uid, nprocs = res.stdout.split()
    assert pwd == box.get("root_at", sandbox_lib.WORKDIR)
    assert int(uid) != 0
    assert int(nprocs) <= 4  # its own pid namespace: init, bash, ls, grep — no host pids
    assert (task_dir / "out.txt").read_text() == "hello\n"
    assert not res.timed_out and res.isolated


@pytest.mark.skipif(not IS_ROOT, reason="uid separation from the host user needs root")
def test_cannot_read_host_secrets(tmp_path, task_dir, box):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("TOP-SECRET-OUTSIDE\n")
    os.chmod(secret, 0o600)
    root_secret = f"/root/tsj_sandbox_secret_{uuid.uuid4().hex}"
    with open(root_secret, "w") as f:
        f.write("TOP-SECRET-ROOT\n")
    os.chmod(root_secret, 0o600)
    try:
        # Even mounted into the box, a root-only 0600 file stays unreadable: the box user
        # is a different host uid, not root in a user namespace.
        with Sandbox(task_dir, ro_binds=[(str(outside), "/mnt/outside")], **box) as sb:
            attempts = {
                "outside path": sb.run(f"cat {secret}"),
                "mounted": sb.run("cat /mnt/outside/secret.txt"),
                "/root": sb.run(f"cat {root_secret}"),
                "shadow": sb.run("cat /etc/shadow"),
                "host pid 1 env": sb.run("cat /proc/1/environ"),
            }
            listing = sb.run("ls /mnt/outside")
    finally:
        os.remove(root_secret)
    for name, res in attempts.items():
        assert res.exit_code != 0, name
        assert "TOP-SECRET" not in res.stdout, name
    assert "Permission denied" in attempts["mounted"].stderr
    assert listing.stdout.split() == ["secret.txt"]  # control: the mount itself is there


def test_cannot_write_outside_task_dir(tmp_path, task_dir, box):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)  # even a world-writable host dir: it is not in the box
    venv_bin = os.path.dirname(sys.executable)
    targets = [str(outside / "pwned"), "/usr/pwned", "/etc/pwned", "/pwned", f"{venv_bin}/pwned"]
    with Sandbox(task_dir, **box) as sb:
        results = [sb.run(f"echo x > {t}") for t in targets]
        inside = sb.run("echo ok > allowed.txt && echo tmp > /tmp/scratch && cat /tmp/scratch")
    for target, res in zip(targets, results, strict=True):
        assert res.exit_code != 0, target
        assert not os.path.exists(target), target
    assert inside.exit_code == 0 and inside.stdout == "tmp\n"
    assert (task_dir / "allowed.txt").read_text() == "ok\n"


def test_no_connection_to_host_loopback(task_dir, box):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    probe = (
        'python -c "import socket\n'
        f"try:\n socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        "except OSError as e:\n print('FAILED', e)\""
    )
    try:
        with Sandbox(task_dir, **box) as sb:
            isolated = sb.run(probe)
        with Sandbox(task_dir, network=True, **box) as sb:  # control: the probe can succeed
            shared = sb.run(probe)
    finally:
        listener.close()
    assert isolated.stdout.startswith("FAILED"), isolated.stdout + isolated.stderr
    assert shared.stdout.startswith("CONNECTED"), shared.stdout + shared.stderr


def test_timeout_kills_the_command(task_dir, box):
    with Sandbox(task_dir, timeout_s=30, **box) as sb:
        start = time.monotonic()
        res = sb.run("echo started; sleep 30", timeout_s=1.0)
        elapsed = time.monotonic() - start
    assert res.timed_out
    assert res.stdout == "started\n"
    assert 1.0 <= elapsed < 2.5, elapsed  # killed at 1 s; the rest is teardown


def test_memory_limit(task_dir, box):
    alloc = "python -c 'x = bytearray({} << 20); print(len(x) >> 20)'"
    with Sandbox(task_dir, memory_mb=256, **box) as sb:
        small = sb.run(alloc.format(32))
        large = sb.run(alloc.format(512))
    assert small.exit_code == 0 and small.stdout == "32\n", small.stderr
    assert large.exit_code != 0
    assert "MemoryError" in large.stderr


def test_output_flood_is_capped(task_dir, box):
    cap = 1 << 20
    with Sandbox(task_dir, max_output_bytes=cap, **box) as sb:
        start = time.monotonic()
        endless = sb.run("yes", timeout_s=2.0)
        endless_s = time.monotonic() - start
        big = sb.run("head -c 50000000 /dev/zero | tr '\\0' a; echo done >&2")
    assert endless.timed_out and endless.stdout_truncated
    assert len(endless.stdout) == cap and set(endless.stdout) == {"y", "\n"}
    assert endless_s < 4.0, endless_s
    # Past the cap the pipe is drained, so a finite flood finishes on its own.
    assert not big.timed_out and big.exit_code == 0
    assert big.stdout_truncated and len(big.stdout) == cap and big.stderr == "done\n"


def test_process_limit(task_dir, box):
    spawn = (
        'python -c "import os, time\n'
        "n = 0\n"
        "for _ in range(100):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(3); os._exit(0)\n"
        "    n += 1\n"
        'print(n)"'
    )
    with Sandbox(task_dir, max_processes=16, **box) as sb:
        res = sb.run(spawn)
    assert res.exit_code == 0, res.stderr
    assert 0 < int(res.stdout) < 16


def test_fork_bomb_is_contained(task_dir, box):
    limit = 32
    counts = []
    stop = threading.Event()

    def sample(uid):  # the host's view: how many processes the box's uid holds
        while not stop.is_set():
            counts.append(len(_host_pids_of_uid(uid)))
            time.sleep(0.05)

    with Sandbox(task_dir, max_processes=limit, **box) as sb:
        sampler = threading.Thread(target=sample, args=(sb.uid,), daemon=True)
        sampler.start()
        start = time.monotonic()
        # `exec` keeps the box alive without needing a fork while the bomb runs.
        res = sb.run(":(){ :|:& };: ; exec sleep 30", timeout_s=3.0)
        elapsed = time.monotonic() - start
        stop.set()
        sampler.join()
        after = sb.run("echo alive")
        left = _host_pids_of_uid(sb.uid)
    assert res.timed_out and elapsed < 5.0, elapsed
    assert after.stdout == "alive\n"
    if IS_ROOT:  # the box uid is a host uid of its own only when we are root
        assert limit // 2 <= max(counts) <= limit, counts  # the bomb ran, and hit the cap
        assert left == []


def test_no_process_survives_run(task_dir, box):
    marker = f"{uuid.uuid4().int % 10**12:012d}"  # unique fraction of a `sleep` argument
    daemon = (
        f"setsid sleep 1000.{marker} >/dev/null 2>&1 < /dev/null & "
        f"nohup sleep 1001.{marker} >/dev/null 2>&1 & "
        f"python -c 'import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0:\n"
        f'  os.execvp("sleep", ["sleep", "1002.{marker}"])\' ; '
    )
    with Sandbox(task_dir, **box) as sb:
        # Control: the three daemons really run (and detach) while the box is up.
        quick = sb.run(daemon + f"sleep 0.5; pgrep -c -f '^sleep 100[0-2][.]{marker}'")
        assert _host_pids_with(marker) == []
        timed = sb.run(daemon + "sleep 30", timeout_s=1.0)
        assert _host_pids_with(marker) == []
    assert int(quick.stdout) == 3, quick.stdout + quick.stderr
    assert timed.timed_out


def test_python_and_pytest_work(task_dir, box):
    (task_dir / "test_sample.py").write_text(
        "def test_passes():\n    assert 1 + 1 == 2\n\ndef test_fails():\n    assert 1 + 1 == 3\n"
    )
    with Sandbox(task_dir, timeout_s=30, **box) as sb:
        res = sb.run("pytest -q -p no:cacheprovider test_sample.py")
        version = sb.run("python -c 'import sys; print(sys.version_info[:2])'")
    assert res.exit_code == 1, res.stdout + res.stderr
    assert "1 failed, 1 passed" in res.stdout
    assert version.stdout.strip() == str(sys.version_info[:2])


def test_refuses_dangerous_roots(tmp_path):
    for root in ["/", "/usr", "/tmp", os.path.expanduser("~")]:
        with pytest.raises(ValueError, match="system directory"):
            Sandbox(root)
    inner = tmp_path / "venv"
    inner.mkdir()
    with pytest.raises(ValueError, match="read-only bind"):  # would chown the bound dir
        Sandbox(tmp_path, ro_binds=[str(inner)])
    closed = Sandbox(tmp_path)
    with closed:
        pass
    with pytest.raises(RuntimeError, match="not open"):
        closed.run("true")


def test_python_binds_expose_only_interpreter_dirs():
    binds = python_binds(sys.executable)
    assert sys.prefix in binds or sys.prefix.startswith("/usr")
    for d in binds:
        assert d not in ("/", "/root", "/home", "/work")
        assert os.path.isdir(d)


def test_missing_bubblewrap_refuses_unless_allowed(task_dir, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # bwrap is not on PATH for this process
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        with Sandbox(task_dir):
            pass
    with (
        pytest.warns(SandboxUnisolatedWarning),
        Sandbox(task_dir, allow_unisolated=True, memory_mb=256, max_processes=16) as sb,
    ):
        ok = sb.run("echo hi > note.txt; cat note.txt")
        limits = sb.run("ulimit -v; ulimit -u")
        slow = sb.run("sleep 30", timeout_s=0.5)
    assert not ok.isolated and ok.stdout == "hi\n"
    assert (task_dir / "note.txt").read_text() == "hi\n"
    assert limits.stdout.split() == [str(256 * 1024), "16"]
    assert slow.timed_out and slow.elapsed_s < 2.0


def test_image_without_a_shell_and_a_nested_repository_path(tmp_path, task_dir):
    # An image of two plain files: no shell, no libc, no util-linux. The box still starts
    # (the host's bash, setpriv and prlimit run through the host's loader), shows the image
    # as / read-only, and mounts the task directory under a directory the image owns.
    rootfs = tmp_path / "rootfs"
    (rootfs / "opt" / "app").mkdir(parents=True)
    (rootfs / "opt" / "app" / "data.txt").write_text("from the image\n")
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "hostname").write_text("image\n")
    (task_dir / "mine.txt").write_text("task\n")
    with Sandbox(task_dir, rootfs=str(rootfs), root_at="/opt/app/repo", python=None) as sb:
        res = sb.run(
            "pwd; read -r line < /opt/app/data.txt; echo $line; read -r t < mine.txt; echo $t;"
            " echo x > /opt/app/new.txt || echo read-only; echo ok > made.txt"
        )
        listing = sb.run(["/.tsj-host/no-such-binary"])
    assert res.stdout.split("\n")[:4] == ["/opt/app/repo", "from the image", "task", "read-only"]
    assert (task_dir / "made.txt").read_text() == "ok\n"
    assert not (rootfs / "opt" / "app" / "new.txt").exists()
    assert listing.exit_code != 0  # argv commands are the image's own: nothing to run here
    with pytest.raises(ValueError, match="overlaps a directory the sandbox mounts"):
        Sandbox(task_dir, rootfs=str(rootfs), root_at="/etc/repo")
