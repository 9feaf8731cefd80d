"""The Sandbox: one bubblewrap box per `run`, on the host toolchain or an image rootfs."""

from __future__ import annotations

import math
import os
import resource
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence

from thundersync_jax.envs.sandbox import _identity, _mounts, _process
from thundersync_jax.envs.sandbox._types import (
    RunResult,
    SandboxUnavailableError,
    SandboxUnisolatedWarning,
)

WORKDIR = "/task"  # where the task directory appears inside the box (host mode)
# Python thread pools size themselves by core count; on a large node that alone would
# exhaust RLIMIT_NPROC (threads count as processes).
_SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


class Sandbox:
    """Runs shell commands inside bubblewrap with the task directory at /task.

    Use as a context manager; `run` may be called any number of times in between and
    each call gets a fresh box (processes never outlive `run`; files in /task persist).

    Args:
      root: host directory mounted read-write at `root_at` (the working directory). When the
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
      rw_binds: extra host directories bound writable, each `(host_path, box_path)`
        (chowned to the box's uid like the root), e.g. a task's /logs.
      max_processes: RLIMIT_NPROC (processes and threads of the sandbox uid).
      max_file_mb: RLIMIT_FSIZE, the largest file a process may write.
      tmp_mb: size of each tmpfs (/tmp, /dev/shm); these live in memory.
      max_output_bytes: cap on captured stdout and on stderr; the rest is discarded.
      cpu_s: RLIMIT_CPU per process; default: the run's timeout rounded up (at least 1).
      env: extra environment variables (the host environment is never passed through).
      uid: sandbox uid when the host side is root; default one from a pool.
      rootfs: an unpacked image (host directory) to show as the box's `/`, read-only,
        instead of the host's /usr; `python` is then not bound (the image brings its
        interpreter; `ro_binds` still are) and PATH is the system one unless `env` sets
        it. Needs bubblewrap: `allow_unisolated` does not apply.
      root_at: where `root` appears in the box (default /task).
      cwd: the box's working directory (default `root_at`).
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
        rw_binds: Sequence[tuple[str, str]] = (),
        max_processes: int = 64,
        max_file_mb: int = 256,
        tmp_mb: int = 256,
        max_output_bytes: int = 2 << 20,
        cpu_s: int | None = None,
        env: Mapping[str, str] | None = None,
        uid: int | None = None,
        rootfs: str | None = None,
        root_at: str = WORKDIR,
        cwd: str | None = None,
    ):
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ValueError(f"sandbox root {self.root!r} is not an existing directory")
        _check_positive(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            tmp_mb=tmp_mb,
            max_output_bytes=max_output_bytes,
        )
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
        self.rootfs = _mounts.image_rootfs_dir(rootfs)
        self.root_at, self.cwd = _mounts.box_dirs(root_at, cwd)
        self._ro_binds = [(b, b) if isinstance(b, str) else tuple(b) for b in ro_binds]
        path = _mounts.SYSTEM_PATH
        if python is not None and self.rootfs is None:
            self._ro_binds += [(d, d) for d in _mounts.python_binds(python)]
            path = os.path.dirname(os.path.abspath(python)) + ":" + path
        self._rw_binds = [(os.path.abspath(h), b) for h, b in rw_binds]
        for host, box in self._ro_binds + self._rw_binds:
            if not os.path.exists(host):
                raise ValueError(f"bind {host!r} does not exist on the host")
            if not os.path.isabs(box):
                raise ValueError(f"bind target {box!r} must be an absolute path")
        # The root is handed to the box (and chowned to its uid when we are root): it must
        # not be a system directory, a home, or hold anything the box should only read.
        guarded = [h for h, _ in self._ro_binds] + [os.path.expanduser("~")]
        guarded += [self.rootfs] if self.rootfs else []
        roots = [self.root, *(h for h, _ in self._rw_binds)]  # all handed over and chowned
        if any(r in _mounts.SYSTEM_DIRS or any(_mounts.is_under(g, r) for g in guarded)
               for r in roots):  # fmt: skip
            raise ValueError(
                f"sandbox root {self.root!r} is a system directory or contains a home or a "
                "read-only bind (e.g. the interpreter or image); use a dedicated task directory"
            )
        self._is_root = os.geteuid() == 0
        self.uid = (
            (uid if uid is not None else _identity.allocate_uid()) if self._is_root else os.getuid()
        )
        self._env = _box_env(path, env, self.rootfs)
        self._shell = shutil.which("bash", path=_mounts.SYSTEM_PATH) or "/bin/sh"
        self._etc_dir: str | None = None
        self.isolated: bool | None = None  # decided on __enter__

    @property
    def workdir(self) -> str:
        """The task directory as commands see it (`root_at`, or `root` when unisolated)."""
        return self.root_at if self.isolated else self.root

    def __enter__(self) -> Sandbox:
        if self._is_root:
            for root in [self.root, *(h for h, _ in self._rw_binds)]:
                _identity.chown_tree(root, self.uid)
        reason = self._isolation_problem()
        if reason is None:
            self.isolated = True
            return self
        self.close()
        if self.rootfs is not None:
            raise SandboxUnavailableError(
                f"cannot run in image {self.rootfs}: {reason}. Image mode needs bubblewrap "
                "(apt-get install bubblewrap) on a kernel with namespaces."
            )
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
        argv = [*self._shell_argv(), "-c", cmd] if isinstance(cmd, str) else list(cmd)
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
            popen_kw = {
                "args": argv,
                "cwd": self.root,
                "preexec_fn": lambda: _process.set_rlimits(limits),
            }
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
            box = _process.Box(proc, info_r)
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

    def _tool(self, name: str) -> list[str]:
        """How the box runs the host's `name` (bash, setpriv, prlimit): directly from the
        host's /usr, or in image mode through the host's loader under HOST_TOOLS_DIR."""
        if self.rootfs is not None:
            return list(_mounts.host_tools()[1][name])
        return [shutil.which(name, path=_mounts.SYSTEM_PATH) or name]

    def _shell_argv(self) -> list[str]:
        return self._tool("bash") if self.rootfs is not None else [self._shell]

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
                *self._tool("setpriv"),
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*drop, *self._tool("prlimit"), *limits, "--"]

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
        identity = ["/etc/passwd", "/etc/group"]
        if self.rootfs is None:
            a += _mounts.host_system_mounts()
        else:
            own = [*identity, self.root_at, *(box for _, box in self._ro_binds + self._rw_binds)]
            a += _mounts.image_rootfs_mounts(self.rootfs, own)
            a += _mounts.host_tools()[0]
        if self._etc_dir is None:
            self._etc_dir = _identity.write_identity_files(self.uid)
        for box in identity:
            a += ["--ro-bind", os.path.join(self._etc_dir, os.path.basename(box)), box]
        a += ["--proc", "/proc", "--dev", "/dev"]
        tmp_bytes = str(self.tmp_mb << 20)
        for tmpfs in ("/tmp", "/dev/shm"):
            a += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", tmpfs]
        made = {"/", "/etc", "/tmp", "/dev", "/proc", self.root_at}
        binds = [("--ro-bind", h, b) for h, b in self._ro_binds]
        for kind, host, box in binds + [("--bind", h, b) for h, b in self._rw_binds]:
            for parent in _mounts.ancestors(box):
                if parent not in made and not _mounts.is_under(parent, "/usr"):
                    a += ["--dir", parent]
                    made.add(parent)
            a += [kind, host, box]
        for parent in _mounts.ancestors(self.root_at):
            if parent not in made and self.rootfs is None:
                a += ["--dir", parent]
        a += ["--bind", self.root, self.root_at, "--chdir", self.cwd]
        if self.rootfs is not None:
            a += ["--remount-ro", "/"]  # the directories made above the image's entries
        return a + ["--"]

    def _isolation_problem(self) -> str | None:
        """None when a trivial command runs in a box built exactly like `run`'s."""
        if shutil.which("bwrap") is None:
            return "bubblewrap (bwrap) is not installed"
        for tool in ("prlimit",) + (("setpriv",) if self._is_root else ()):
            if shutil.which(tool, path=_mounts.SYSTEM_PATH) is None:
                return f"{tool} (util-linux) is not installed"
        try:
            argv = self._bwrap_argv() + self._drop_and_limit_argv(self.timeout_s)
            argv += [*self._shell_argv(), "-c", ":"]
            probe = subprocess.run(
                argv, capture_output=True, text=True, timeout=30, env=self._env, umask=0o022
            )
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            return f"bubblewrap probe failed: {e}"
        if probe.returncode != 0:
            return f"bubblewrap probe exited {probe.returncode}: {probe.stderr.strip()[:500]}"
        return None


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _box_env(path: str, env: Mapping[str, str] | None, rootfs: str | None) -> dict[str, str]:
    """The box's whole environment (the host's is never passed through)."""
    box_env = {
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
    if rootfs is not None and not _mounts.image_has_utf8_locale(rootfs):
        # The C.UTF-8 named above is not in the image: bash would warn on every command.
        if box_env.get("LC_ALL") == "C.UTF-8":
            del box_env["LC_ALL"]
    return box_env
