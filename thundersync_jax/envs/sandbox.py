"""Bubblewrap sandbox for untrusted shell commands (agent tool calls and verifiers).

Every `Sandbox.run` starts a fresh bubblewrap container:

* namespaces: mount, pid, ipc, uts, cgroup (where supported) and network (unless
  `network=True`); the box's init is pid 1 of its own pid namespace, so when the
  command ends, or bubblewrap is killed at the timeout, the kernel kills every process
  left inside, daemonized (`setsid`) ones included.
* filesystem: /usr (and /bin, /lib* as on the host) read-only, a short list of /etc
  files a shell and Python need (never /etc/shadow), a synthetic passwd/group, the
  interpreter's prefixes read-only (`python_binds`), a fresh size-capped tmpfs on /tmp
  and /dev/shm, a minimal /dev, the box's own /proc, and the task directory read-write
  at /task (the working directory). Nothing of /root, /home, host /proc or /sys.
* identity: an unprivileged uid. When the host side is root, bubblewrap runs
  privileged without a user namespace and `setpriv` drops to a uid taken from a pool:
  a user namespace created by root would map the box user onto host root, which owns
  (and could read) root's 0600 files. A uid of its own also makes RLIMIT_NPROC, which
  the kernel counts per uid host-wide, count only this sandbox's processes.
* limits (`prlimit`): address space, CPU seconds, processes, file size, open files,
  no core dumps; plus a wall-clock timeout and a cap on captured output.

Where bubblewrap is missing or cannot create namespaces, `Sandbox` refuses to start
unless `allow_unisolated=True`; then commands run with rlimits only (and a warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import resource
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence

WORKDIR = "/task"  # where the task directory appears inside the box

# /etc entries a shell, coreutils and Python need; secrets (shadow, ssh, sudoers,
# gitconfig/npmrc/pip.conf that may hold tokens) are deliberately absent.
_ETC_ENTRIES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gai.conf",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
)
_SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root"]
    + ["/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var"]
)
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Python thread pools size themselves by core count; on a large node that alone would
# exhaust RLIMIT_NPROC (threads count as processes).
_SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}
_UID_POOL_START = 200_000
_UID_POOL_SIZE = 50_000
_FALLBACK_UID = 65534  # nobody, when the pool is not mapped in our user namespace
_READ_CHUNK = 1 << 16
_DRAIN_GRACE_S = 2.0  # how long to wait for pipes to close once the process is gone
_uid_counter = itertools.count()


class SandboxUnavailableError(RuntimeError):
    """Bubblewrap is missing or cannot create namespaces on this host."""


class SandboxUnisolatedWarning(UserWarning):
    """Commands run with resource limits only, without namespace isolation."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one command.

    Attributes:
      exit_code: the command's exit status; 128+N when a signal N ended it inside the
        box. After a timeout it is whatever the killed box reported: read `timed_out`.
      stdout, stderr: captured output, decoded as UTF-8 (invalid bytes replaced), each
        at most `max_output_bytes` long.
      timed_out: the wall-clock timeout fired and the box was killed.
      elapsed_s: wall-clock seconds from start to the last process gone.
      stdout_truncated, stderr_truncated: output past the cap was read and discarded.
      isolated: the command ran inside bubblewrap (False in unisolated mode).
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolated: bool = True


def python_binds(executable: str = sys.executable) -> tuple[str, ...]:
    """Host directories an interpreter needs, to bind read-only into the box.

    For a virtual environment this is the environment and the base installation it
    points to (e.g. /work/main/.venv and /root/.pyenv/versions/3.11.7), never their
    parents: /root stays hidden. Directories under /usr are left out (always bound).

    Args:
      executable: path of a python interpreter on the host.

    Returns:
      Absolute directories, outermost first, none nested in another.
    """
    exe = os.path.abspath(executable)
    if not os.access(exe, os.X_OK):
        raise ValueError(f"python executable {executable!r} does not exist or is not executable")
    if os.path.realpath(exe) == os.path.realpath(sys.executable):
        prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        query = (
            "import sys; print(sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)"
        )
        out = subprocess.run([exe, "-I", "-c", query], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ValueError(f"could not query prefixes of {executable!r}: {out.stderr.strip()}")
        prefixes = out.stdout.split()
    real_exe = os.path.realpath(exe)
    dirs = {os.path.realpath(p) for p in prefixes} | {os.path.dirname(os.path.dirname(exe))}
    if not any(_is_under(real_exe, d) for d in dirs | {"/usr"}):
        dirs.add(os.path.dirname(real_exe))
    for d in dirs:
        if d in ("/", "/root", "/home", "/etc", "/proc", "/sys", "/dev"):
            raise ValueError(
                f"python {executable!r} lives in {d!r}; binding that would expose the host. "
                "Use an interpreter installed in its own prefix (venv, pyenv, conda, /usr)."
            )
    kept = []
    for d in sorted(dirs, key=len):
        if not _is_under(d, "/usr") and not any(_is_under(d, k) for k in kept):
            kept.append(d)
    return tuple(kept)


class Sandbox:
    """Runs shell commands inside bubblewrap with the task directory at /task.

    Use as a context manager; `run` may be called any number of times in between and
    each call gets a fresh box (processes never outlive `run`; files in /task persist).

    Args:
      root: host directory mounted read-write at /task (the working directory). When the
        host side runs as root it is chowned (recursively, not following symlinks) to the
        sandbox's uid so the box can write it; the host can still read and delete it.
      timeout_s: default wall-clock limit of one `run`.
      memory_mb: address-space limit (RLIMIT_AS) of each process; Python plus pytest
        needs about 200 MB of headroom.
      network: keep the host network namespace (default: none, not even loopback).
      allow_unisolated: where bubblewrap is unusable, run with rlimits only (and warn)
        instead of raising SandboxUnavailableError.
      python: interpreter whose prefixes are bound read-only and whose bin directory
        leads PATH (so `python` and `pytest` work); None binds none.
      ro_binds: extra host paths bound read-only, each `path` or `(host_path, box_path)`.
      max_processes: RLIMIT_NPROC (processes and threads of the sandbox uid).
      max_file_mb: RLIMIT_FSIZE, the largest file a process may write.
      tmp_mb: size of each tmpfs (/tmp, /dev/shm); these live in memory.
      max_output_bytes: cap on captured stdout and on stderr; the rest is discarded.
      cpu_s: RLIMIT_CPU per process; default: the run's timeout rounded up (at least 1).
      env: extra environment variables (the host environment is never passed through).
      uid: sandbox uid when the host side is root; default one from a pool.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        network: bool = False,
        allow_unisolated: bool = False,
        *,
        python: str | None = sys.executable,
        ro_binds: Sequence[str | tuple[str, str]] = (),
        max_processes: int = 64,
        max_file_mb: int = 256,
        tmp_mb: int = 256,
        max_output_bytes: int = 2 << 20,
        cpu_s: int | None = None,
        env: Mapping[str, str] | None = None,
        uid: int | None = None,
    ):
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ValueError(f"sandbox root {self.root!r} is not an existing directory")
        for name, value in [
            ("timeout_s", timeout_s),
            ("memory_mb", memory_mb),
            ("max_processes", max_processes),
            ("max_file_mb", max_file_mb),
            ("tmp_mb", tmp_mb),
            ("max_output_bytes", max_output_bytes),
        ]:
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.network = bool(network)
        self.allow_unisolated = allow_unisolated
        self.max_processes = int(max_processes)
        self.max_file_mb = int(max_file_mb)
        self.tmp_mb = int(tmp_mb)
        self.max_output_bytes = int(max_output_bytes)
        if cpu_s is not None and not cpu_s > 0:
            raise ValueError(f"cpu_s must be positive, got {cpu_s!r}")
        self.cpu_s = None if cpu_s is None else int(cpu_s)
        self._ro_binds = [(b, b) if isinstance(b, str) else tuple(b) for b in ro_binds]
        path = _SYSTEM_PATH
        if python is not None:
            self._ro_binds += [(d, d) for d in python_binds(python)]
            path = os.path.dirname(os.path.abspath(python)) + ":" + path
        for host, box in self._ro_binds:
            if not os.path.exists(host):
                raise ValueError(f"ro_binds entry {host!r} does not exist on the host")
            if not os.path.isabs(box):
                raise ValueError(f"ro_binds target {box!r} must be an absolute path")
        # The root is handed to the box (and chowned to its uid when we are root): it must
        # not be a system directory, a home, or hold anything the box should only read.
        guarded = [h for h, _ in self._ro_binds] + [os.path.expanduser("~")]
        if self.root in _SYSTEM_DIRS or any(_is_under(g, self.root) for g in guarded):
            raise ValueError(
                f"sandbox root {self.root!r} is a system directory or contains a home or a "
                "read-only bind (e.g. the interpreter); use a dedicated task directory"
            )
        self._is_root = os.geteuid() == 0
        self.uid = (uid if uid is not None else _allocate_uid()) if self._is_root else os.getuid()
        self._env = {
            "PATH": path,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            **_SINGLE_THREAD_ENV,
            **(env or {}),
        }
        self._shell = shutil.which("bash", path=_SYSTEM_PATH) or "/bin/sh"
        self._etc_dir: str | None = None
        self.isolated: bool | None = None  # decided on __enter__

    @property
    def workdir(self) -> str:
        """The task directory as commands see it (/task, or `root` when unisolated)."""
        return WORKDIR if self.isolated else self.root

    def __enter__(self) -> Sandbox:
        if self._is_root:
            _chown_tree(self.root, self.uid)
        reason = self._isolation_problem()
        if reason is None:
            self.isolated = True
            return self
        self.close()
        if not self.allow_unisolated:
            raise SandboxUnavailableError(
                f"cannot isolate commands: {reason}. Install bubblewrap (apt-get install "
                "bubblewrap) on a kernel with namespaces, or pass allow_unisolated=True to run "
                "with resource limits only."
            )
        warnings.warn(
            f"sandbox runs commands WITHOUT isolation ({reason}); only rlimits apply",
            SandboxUnisolatedWarning,
            stacklevel=2,
        )
        self.isolated = False
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Removes the box's private host files. Safe to call twice."""
        self.isolated = None
        if self._etc_dir is not None:
            shutil.rmtree(self._etc_dir, ignore_errors=True)
            self._etc_dir = None

    def run(self, cmd: str | Sequence[str], timeout_s: float | None = None) -> RunResult:
        """Runs `cmd` (a bash command line, or an argv list) in a fresh box under /task.

        Returns when the command and everything it started are gone: at exit, or at the
        wall-clock timeout (then `timed_out` is True). Never raises for anything the
        command does.
        """
        if self.isolated is None:
            raise RuntimeError(
                "the sandbox is not open: use `with Sandbox(...) as sb: sb.run(...)`"
            )
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        argv = [self._shell, "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("cmd must be a non-empty string or argv list")
        return self._spawn_and_collect(argv, timeout)

    # -- process handling -------------------------------------------------------------

    def _spawn_and_collect(self, argv: list[str], timeout: float) -> RunResult:
        start = time.monotonic()
        info_r, info_w = os.pipe()  # bwrap reports the box's pid 1 here (--info-fd)
        if self.isolated:
            bwrap = self._bwrap_argv(info_fd=info_w)
            popen_kw: dict = {"args": bwrap + self._drop_and_limit_argv(timeout) + argv}
        else:
            limits = self._limits(timeout)
            popen_kw = {"args": argv, "cwd": self.root, "preexec_fn": lambda: _set_rlimits(limits)}
            if self._is_root:
                popen_kw.update(user=self.uid, group=self.uid, extra_groups=[])
        try:
            proc = subprocess.Popen(
                **popen_kw,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                start_new_session=True,  # its own process group: killpg reaches the whole tree
                pass_fds=(info_w,) if self.isolated else (),
                umask=0o022,  # bwrap creates mount points with it; the box user must traverse
            )
        finally:
            os.close(info_w)
        try:
            box = _Box(proc, info_r)
            timed_out = box.collect(start + timeout, self.max_output_bytes)
        finally:
            os.close(info_r)
        return RunResult(
            exit_code=proc.returncode,
            stdout=box.out.text(),
            stderr=box.err.text(),
            timed_out=timed_out,
            elapsed_s=time.monotonic() - start,
            stdout_truncated=box.out.truncated,
            stderr_truncated=box.err.truncated,
            isolated=bool(self.isolated),
        )

    def _limits(self, timeout: float) -> list[tuple[int, int]]:
        cpu_s = self.cpu_s if self.cpu_s is not None else max(1, math.ceil(timeout))
        return [
            (resource.RLIMIT_AS, self.memory_mb << 20),
            (resource.RLIMIT_CPU, cpu_s),
            (resource.RLIMIT_NPROC, self.max_processes),
            (resource.RLIMIT_FSIZE, self.max_file_mb << 20),
            (resource.RLIMIT_NOFILE, 1024),
            (resource.RLIMIT_CORE, 0),
        ]

    # -- bubblewrap command line ------------------------------------------------------

    def _drop_and_limit_argv(self, timeout: float) -> list[str]:
        """setpriv (root only: become the sandbox uid) then prlimit, inside the box."""
        names = {
            resource.RLIMIT_AS: "--as",
            resource.RLIMIT_CPU: "--cpu",
            resource.RLIMIT_NPROC: "--nproc",
            resource.RLIMIT_FSIZE: "--fsize",
            resource.RLIMIT_NOFILE: "--nofile",
            resource.RLIMIT_CORE: "--core",
        }
        limits = [f"{names[res]}={value}" for res, value in self._limits(timeout)]
        drop = []
        if self._is_root:
            drop = [
                shutil.which("setpriv", path=_SYSTEM_PATH) or "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*drop, shutil.which("prlimit", path=_SYSTEM_PATH) or "prlimit", *limits, "--"]

    def _bwrap_argv(self, info_fd: int | None = None) -> list[str]:
        a = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session"]
        if info_fd is not None:
            a += ["--info-fd", str(info_fd)]
        a += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        a += ["--hostname", "sandbox"]
        if not self.network:
            a.append("--unshare-net")
        if self._is_root:
            # setpriv inside needs these two; it drops them (and everything else).
            a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            a += ["--unshare-user", "--disable-userns"]
        a += ["--ro-bind", "/usr", "/usr"]
        for link in _ROOT_LINKS:
            if os.path.islink(link):
                a += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                a += ["--ro-bind", link, link]
        # bwrap would create missing mount points' parents 0700 (untraversable by the box
        # user); explicit --dir makes them 0755.
        a += ["--dir", "/etc"]
        for name in _ETC_ENTRIES:
            a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        etc = self._identity_files()
        a += ["--ro-bind", os.path.join(etc, "passwd"), "/etc/passwd"]
        a += ["--ro-bind", os.path.join(etc, "group"), "/etc/group"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        tmp_bytes = str(self.tmp_mb << 20)
        for tmpfs in ("/tmp", "/dev/shm"):
            a += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", tmpfs]
        made = {"/", "/etc", "/tmp", "/dev", "/proc", WORKDIR}
        for host, box in self._ro_binds:
            for parent in _ancestors(box):
                if parent not in made and not _is_under(parent, "/usr"):
                    a += ["--dir", parent]
                    made.add(parent)
            a += ["--ro-bind", host, box]
        a += ["--bind", self.root, WORKDIR, "--chdir", WORKDIR]
        return a + ["--"]

    def _identity_files(self) -> str:
        """A passwd/group naming only root, nobody and the sandbox user (home /tmp)."""
        if self._etc_dir is None:
            self._etc_dir = tempfile.mkdtemp(prefix="tsj-sandbox-etc-")
            os.chmod(self._etc_dir, 0o755)
            passwd = [
                "root:x:0:0:root:/root:/bin/sh",
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
            ]
            group = ["root:x:0:", "nogroup:x:65534:"]
            if self.uid not in (0, 65534):
                passwd.append(f"sandbox:x:{self.uid}:{self.uid}:sandbox:/tmp:/bin/sh")
                group.append(f"sandbox:x:{self.uid}:")
            for name, lines in (("passwd", passwd), ("group", group)):
                path = os.path.join(self._etc_dir, name)
                with open(path, "w") as f:
                    f.write("\n".join(lines) + "\n")
                os.chmod(path, 0o644)
        return self._etc_dir

    def _isolation_problem(self) -> str | None:
        """None when a trivial command runs in a box built exactly like `run`'s."""
        if shutil.which("bwrap") is None:
            return "bubblewrap (bwrap) is not installed"
        for tool in ("prlimit",) + (("setpriv",) if self._is_root else ()):
            if shutil.which(tool, path=_SYSTEM_PATH) is None:
                return f"{tool} (util-linux) is not installed"
        argv = self._bwrap_argv() + self._drop_and_limit_argv(self.timeout_s) + ["/bin/true"]
        try:
            probe = subprocess.run(
                argv, capture_output=True, text=True, timeout=30, env=self._env, umask=0o022
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bubblewrap probe failed: {e}"
        if probe.returncode != 0:
            return f"bubblewrap probe exited {probe.returncode}: {probe.stderr.strip()[:500]}"
        return None


class _CappedBuffer:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _Box:
    """One running box: capped pipe draining, the deadline kill, and the final teardown wait.

    bwrap reports the host pid of the box's pid 1 on --info-fd; we hold a pidfd on it.
    When pid 1 dies the kernel kills everything else in the namespace before pid 1
    counts as exited, so a readable pidfd means no process of the box is left. (bwrap
    itself may exit a moment earlier: it relays the command's status without waiting.)
    """

    def __init__(self, proc: subprocess.Popen, info_fd: int):
        self.proc = proc
        self.info_fd = info_fd
        self.out = _CappedBuffer(0)
        self.err = _CappedBuffer(0)
        self._pid1: int | None = None
        self._pidfd: int | None = None

    def collect(self, deadline: float, cap: int) -> bool:
        """Reads both pipes until EOF, keeping `cap` bytes each; returns whether it timed out.

        Pipes are drained (not just abandoned) past the cap so a chatty child never blocks
        on a full pipe and finishes on its own schedule.
        """
        proc = self.proc
        self.out, self.err = _CappedBuffer(cap), _CappedBuffer(cap)
        info = _CappedBuffer(1 << 16)
        bufs = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err}
        bufs[self.info_fd] = info
        sel = selectors.DefaultSelector()
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        timed_out = False
        ended_at = None  # when the main process exited or was killed
        try:
            while sel.get_map():
                now = time.monotonic()
                if ended_at is None and proc.poll() is not None:
                    # Unisolated mode only can leave stragglers holding the pipes: they share
                    # the process group, so kill it and drain what is left.
                    ended_at = now
                    _kill_group(proc.pid)
                elif ended_at is None and now >= deadline:
                    timed_out, ended_at = True, now
                    self._kill()
                if ended_at is not None and now > ended_at + _DRAIN_GRACE_S:
                    break
                wait = (deadline if ended_at is None else ended_at + _DRAIN_GRACE_S) - now
                for key, _ in sel.select(timeout=min(max(wait, 0.0), 0.2)):
                    try:
                        chunk = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if chunk:
                        bufs[key.fd].add(chunk)
                    else:
                        sel.unregister(key.fd)
                        if key.fd == self.info_fd:
                            self._watch_pid1(info.data)
        finally:
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        try:
            proc.wait(timeout=_DRAIN_GRACE_S)
        except subprocess.TimeoutExpired:
            self._kill()
            proc.wait()
        self._wait_until_empty()
        return timed_out

    def _watch_pid1(self, info: bytes) -> None:
        """Opens a pidfd on the box's pid 1 from bwrap's info JSON (absent when unisolated)."""
        try:
            self._pid1 = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return
        try:
            self._pidfd = os.pidfd_open(self._pid1)
        except ProcessLookupError:
            self._pid1 = None  # already gone, namespace included
        except (OSError, AttributeError):
            pass  # no pidfd support (kernel < 5.3): fall back to polling /proc

    def _kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        elif self._pid1 is not None:
            with contextlib.suppress(OSError):
                os.kill(self._pid1, signal.SIGKILL)
        _kill_group(self.proc.pid)

    def _wait_until_empty(self) -> None:
        if self._pidfd is not None:
            try:
                for _ in range(2):  # a second time after SIGKILL, should it hang
                    if select.select([self._pidfd], [], [], _DRAIN_GRACE_S)[0]:
                        return
                    self._kill()
            finally:
                os.close(self._pidfd)
                self._pidfd = None
        elif self._pid1 is not None:
            stop = time.monotonic() + 2 * _DRAIN_GRACE_S
            while _alive(self._pid1) and time.monotonic() < stop:
                time.sleep(0.005)


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _set_rlimits(limits: list[tuple[int, int]]) -> None:
    """Unisolated mode only: runs in the forked child before exec."""
    for res, value in limits:
        resource.setrlimit(res, (value, value))


def _kill_group(pgid: int) -> None:
    """SIGKILLs a process group (bwrap, or the command itself when unisolated)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _chown_tree(root: str, uid: int) -> None:
    """Gives the box's uid the task directory; symlinks themselves, never their targets."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def _allocate_uid() -> int:
    """A uid for this sandbox: distinct per process and per call, from a reserved pool."""
    uid = _UID_POOL_START + (os.getpid() * 1009 + next(_uid_counter)) % _UID_POOL_SIZE
    return uid if _uid_mapped(uid) else _FALLBACK_UID


def _uid_mapped(uid: int) -> bool:
    """Whether `uid` exists in our user namespace (a rootless container maps few)."""
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                first, _, count = (int(x) for x in line.split())
                if first <= uid < first + count:
                    return True
    except OSError:
        return False
    return False


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of an absolute path, outermost first ("/a/b/c" -> ["/a", "/a/b"])."""
    parts = os.path.normpath(path).strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")
