"""Who the box runs as: a uid from a reserved pool, its passwd/group, and the task
directory handed to it."""

from __future__ import annotations

import itertools
import os
import tempfile

_UID_POOL_START = 200_000
_UID_POOL_SIZE = 50_000
_FALLBACK_UID = 65534  # nobody, when the pool is not mapped in our user namespace
_uid_counter = itertools.count()


def chown_tree(root: str, uid: int) -> None:
    """Gives the box's uid the task directory; symlinks themselves, never their targets."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def allocate_uid() -> int:
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


def write_identity_files(uid: int) -> str:
    """A fresh directory holding a passwd/group that name only root, nobody and the
    sandbox user (home /tmp); the caller removes it."""
    etc_dir = tempfile.mkdtemp(prefix="tsj-sandbox-etc-")
    os.chmod(etc_dir, 0o755)
    passwd = [
        "root:x:0:0:root:/root:/bin/sh",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    group = ["root:x:0:", "nogroup:x:65534:"]
    if uid not in (0, 65534):
        passwd.append(f"sandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/sh")
        group.append(f"sandbox:x:{uid}:")
    for name, lines in (("passwd", passwd), ("group", group)):
        path = os.path.join(etc_dir, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(path, 0o644)
    return etc_dir
