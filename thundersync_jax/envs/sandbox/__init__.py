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

Image mode (`rootfs=`, see thundersync_jax.envs.images): an unpacked container image is
the box's `/` (read-only) instead of the host's /usr, the task directory is bound at the
path the image expects (`root_at`, e.g. /testbed), and the host's bash, setpriv and
prlimit are run through the host's loader so the image needs neither a shell nor
util-linux. Every other guarantee above holds unchanged.

Modules: `_core` (Sandbox), `_types` (RunResult, errors), `_mounts` (what the box sees),
`_identity` (uid, passwd), `_process` (draining, deadline kill, teardown wait).
"""

from thundersync_jax.envs.sandbox._core import WORKDIR, Sandbox
from thundersync_jax.envs.sandbox._mounts import python_binds
from thundersync_jax.envs.sandbox._types import (
    RunResult,
    SandboxUnavailableError,
    SandboxUnisolatedWarning,
)

__all__ = [
    "WORKDIR",
    "RunResult",
    "Sandbox",
    "SandboxUnavailableError",
    "SandboxUnisolatedWarning",
    "python_binds",
]
