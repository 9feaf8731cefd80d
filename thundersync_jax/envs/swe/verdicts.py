"""Verdicts kept on disk: a patch already verified on a task in this run is not verified again.

The members of a GRPO group, and the groups of later steps, often submit the same patch
(the fix, or nothing): a tiny CPU run verified 20 patches of which 4 were distinct. Verifying
one is a fresh checkout and a sandboxed test run (about 0.6 CPU-s for mini-SWE; minutes in a
SWE-bench image), and its verdict is a function of the task, the patch and the verifier's
settings. So `cached` keeps each verdict as `<key>.json` under the run's verdict directory,
keyed by the sha256 of all three (`key`), and hands it out again.

Only clean verdicts are kept: a verifier error (it raised, e.g. a broken instance) or a test
run that timed out (a loaded machine, not the patch) is returned but never stored, so the next
identical patch is verified afresh. Concurrent verifications of one key (members of a group
finishing together, threads or processes sharing the directory) wait on a lock file for the
first one's verdict instead of running the tests side by side. A file that cannot be read back
(truncated, edited) is verified again and rewritten; writes are atomic (a rename). Turn it off
(`env.cache_verdicts=False`) for test suites whose outcome is not a function of the patch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from thundersync_jax.envs.base import VerifierResult
from thundersync_jax.envs.swe.instance import SweInstance

log = logging.getLogger(__name__)

CACHED = "verdict_cached"  # details key: True on a verdict handed out again


def key(instance: SweInstance, patch: str, settings: Mapping[str, Any]) -> str:
    """sha256 over the task's whole record, the patch and the verifier's settings (sandbox
    limits, timeouts, partial credit): any change to one of them is another verdict."""
    record = json.dumps(
        {"instance": instance.to_dict(), "patch": patch, "settings": dict(settings)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(record.encode()).hexdigest()


def cached(
    directory: str, verdict_key: str, verify: Callable[[], VerifierResult]
) -> VerifierResult:
    """The verdict stored under `verdict_key` in `directory`, else `verify()`'s (stored when
    clean). Exceptions of `verify` propagate and store nothing."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{verdict_key}.json")
    with _locked(path + ".lock"):
        kept = _read(path)
        if kept is not None:
            return VerifierResult(kept.reward, kept.reason, {**kept.details, CACHED: True})
        result = verify()
        if _clean(result):
            _write(path, result)
        return result


@contextlib.contextmanager
def _locked(lock_path: str):
    # flock locks an open file description: threads of one process exclude each other too.
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _clean(result: VerifierResult) -> bool:
    return result.error is None and not result.details.get("timed_out", False)


def _read(path: str) -> VerifierResult | None:
    try:
        with open(path) as f:
            record = json.load(f)
        return VerifierResult(float(record["reward"]), str(record["reason"]), record["details"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("verdict %s unreadable (%s): verifying again", path, e)
        return None


def _write(path: str, result: VerifierResult) -> None:
    """Stores the verdict; one that cannot be stored is only not reused (logged)."""
    record = {"reward": result.reward, "reason": result.reason, "details": result.details}
    fd, tmp = tempfile.mkstemp(prefix=".verdict-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as e:
        log.warning("verdict %s not stored (%s)", path, e)
        with contextlib.suppress(OSError):
            os.remove(tmp)
