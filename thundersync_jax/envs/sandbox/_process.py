"""Running one box: capped draining of its pipes, the deadline kill, and the wait until
every process of its pid namespace is gone."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import selectors
import signal
import subprocess
import time

_READ_CHUNK = 1 << 16
DRAIN_GRACE_S = 2.0  # how long to wait for pipes to close once the process is gone


class CappedBuffer:
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


class Box:
    """One running box: capped pipe draining, the deadline kill, and the final teardown wait.

    bwrap reports the host pid of the box's pid 1 on --info-fd; we hold a pidfd on it.
    When pid 1 dies the kernel kills everything else in the namespace before pid 1
    counts as exited, so a readable pidfd means no process of the box is left. (bwrap
    itself may exit a moment earlier: it relays the command's status without waiting.)
    """

    def __init__(self, proc: subprocess.Popen, info_fd: int):
        self.proc = proc
        self.info_fd = info_fd
        self.out = CappedBuffer(0)
        self.err = CappedBuffer(0)
        self._pid1: int | None = None
        self._pidfd: int | None = None

    def collect(self, deadline: float, cap: int) -> bool:
        """Reads both pipes until EOF, keeping `cap` bytes each; returns whether it timed out.

        Pipes are drained (not just abandoned) past the cap so a chatty child never blocks
        on a full pipe and finishes on its own schedule.
        """
        proc = self.proc
        self.out, self.err = CappedBuffer(cap), CappedBuffer(cap)
        info = CappedBuffer(1 << 16)
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
                    kill_group(proc.pid)
                elif ended_at is None and now >= deadline:
                    timed_out, ended_at = True, now
                    self._kill()
                if ended_at is not None and now > ended_at + DRAIN_GRACE_S:
                    break
                wait = (deadline if ended_at is None else ended_at + DRAIN_GRACE_S) - now
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
            proc.wait(timeout=DRAIN_GRACE_S)
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
        kill_group(self.proc.pid)

    def _wait_until_empty(self) -> None:
        if self._pidfd is not None:
            try:
                for _ in range(2):  # a second time after SIGKILL, should it hang
                    if select.select([self._pidfd], [], [], DRAIN_GRACE_S)[0]:
                        return
                    self._kill()
            finally:
                os.close(self._pidfd)
                self._pidfd = None
        elif self._pid1 is not None:
            stop = time.monotonic() + 2 * DRAIN_GRACE_S
            while _alive(self._pid1) and time.monotonic() < stop:
                time.sleep(0.005)


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def set_rlimits(limits: list[tuple[int, int]]) -> None:
    """Unisolated mode only: runs in the forked child before exec."""
    for res, value in limits:
        resource.setrlimit(res, (value, value))


def kill_group(pgid: int) -> None:
    """SIGKILLs a process group (bwrap, or the command itself when unisolated)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
