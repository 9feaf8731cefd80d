"""What a sandbox run returns, and how a sandbox says it cannot isolate."""

from __future__ import annotations

import dataclasses


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
