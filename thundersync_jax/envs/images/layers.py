"""Applying one image layer (a tar stream) to a rootfs directory, safely.

Layer semantics are the OCI image spec's: entries are added in order, replacing what
lower layers left at the same path; `.wh.NAME` deletes NAME from lower layers and
`.wh..wh..opq` empties its directory of lower-layer entries.

A layer comes from an untrusted image, so the host side never follows a path out of
the rootfs: paths are taken component by component, a relative symlink met on the way
is resolved inside the rootfs, and files are created with O_NOFOLLOW|O_EXCL after
removing what was there. Absolute symlinks are kept as they are (in the box `/` is the
rootfs, and real images are full of them: /etc/alternatives, the loader's link), but a
member written *through* one is refused: a host-side extractor would have left the
rootfs there, and image builders never write through links. Refused with
HostileLayerError (and nothing of that layer kept by the caller): absolute or `..`
member names, symlinks whose relative target climbs above `/`, paths through an
absolute symlink, hard links to names outside the archive's tree, device nodes, and
setuid/setgid bits (unless `setuid="strip"`).

Owners are not applied: every file belongs to the user who unpacks. In a container the
image's processes run as its root; in our box they run as an unprivileged uid, so what
the owner may read or traverse is made readable and traversable by all (/root 0700
becomes 0755, a 0600 file 0644): the rootfs is read-only in the box and holds only the
image's own files.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from typing import IO

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
_MAX_SYMLINK_HOPS = 40
_COPY_CHUNK = 1 << 20


class HostileLayerError(ValueError):
    """A layer tries to write outside the rootfs, or holds something a box must not have."""


def apply_layer(
    stream: IO[bytes], rootfs: str, label: str = "layer", *, setuid: str = "refuse"
) -> None:
    """Applies the tar read from `stream` to the directory `rootfs`.

    Args:
      stream: an uncompressed tar, read sequentially.
      rootfs: the directory holding the lower layers (modified in place).
      label: names the layer in errors ("image X layer 2 (sha256:...)").
      setuid: "refuse" (default) raises on setuid/setgid bits; "strip" clears them.
    """
    if setuid not in ("refuse", "strip"):
        raise ValueError(f"setuid must be 'refuse' or 'strip', got {setuid!r}")
    root = os.path.realpath(rootfs)
    created: set[str] = set()  # entries of this layer: whiteouts never remove them
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            parts = _member_parts(member.name, label)
            if not parts:
                continue  # the archive's root directory
            name = parts[-1]
            parent = _resolve_dir(root, parts[:-1], label, member.name)
            rel_parent = os.path.relpath(parent, root)
            if name == OPAQUE_MARKER:
                _clear_lower(parent, rel_parent, created)
                continue
            if name.startswith(WHITEOUT_PREFIX):
                target = name[len(WHITEOUT_PREFIX) :]
                if target in ("", ".", ".."):
                    raise HostileLayerError(f"{label}: malformed whiteout {member.name!r}")
                if os.path.normpath(os.path.join(rel_parent, target)) not in created:
                    _remove(os.path.join(parent, target))
                continue
            _check_member(member, label, setuid)
            path = os.path.join(parent, name)
            _extract(tar, member, root, path, label)
            created.add(os.path.normpath(os.path.join(rel_parent, name)))


def _member_parts(name: str, label: str) -> list[str]:
    """The path components of a member name; refuses absolute names and `..`."""
    if name.startswith("/"):
        raise HostileLayerError(f"{label}: absolute member path {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise HostileLayerError(f"{label}: member path {name!r} climbs out with '..'")
    return parts


def _check_member(member: tarfile.TarInfo, label: str, setuid: str) -> None:
    if member.ischr() or member.isblk():
        raise HostileLayerError(f"{label}: device node {member.name!r} (devices are refused)")
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        if setuid == "refuse":
            raise HostileLayerError(
                f"{label}: {member.name!r} has setuid/setgid bits (mode {member.mode:o}); "
                "pass setuid='strip' to unpack such images with the bits cleared"
            )
        member.mode &= ~(stat.S_ISUID | stat.S_ISGID)
    if member.issym() and _climbs_out(member.name, member.linkname):
        raise HostileLayerError(
            f"{label}: symlink {member.name!r} -> {member.linkname!r} points outside the rootfs"
        )
    if member.islnk():
        _member_parts(member.linkname, label)


def _climbs_out(name: str, target: str) -> bool:
    """Whether a relative symlink target, read from the link's directory, leaves `/`."""
    if target.startswith("/"):
        return False  # resolved against the rootfs's / (as in the box): stays inside
    depth = len([p for p in name.split("/") if p not in ("", ".")]) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _resolve_dir(root: str, parts: list[str], label: str, member: str) -> str:
    """The real directory inside `root` that `parts` names, creating missing ones (0755).

    Relative symlinks on the way are followed inside the rootfs (`..` never goes above
    it); an absolute symlink or a non-directory in the way is refused.
    """
    todo = list(parts)
    current = root
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            current = os.path.dirname(current) if current != root else root
            continue
        nxt = os.path.join(current, part)
        if os.path.islink(nxt):
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                raise HostileLayerError(f"{label}: too many symlinks under {member!r}")
            target = os.readlink(nxt)
            if target.startswith("/"):
                raise HostileLayerError(
                    f"{label}: {member!r} goes through the absolute symlink "
                    f"{os.path.relpath(nxt, root)!r} -> {target!r} (out of the rootfs on the host)"
                )
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            continue
        if not os.path.lexists(nxt):
            os.mkdir(nxt, 0o755)
        elif not os.path.isdir(nxt):
            raise HostileLayerError(f"{label}: {member!r} is under a non-directory {part!r}")
        current = nxt
    if not (current == root or current.startswith(root + os.sep)):
        raise HostileLayerError(f"{label}: {member!r} resolves outside the rootfs")
    return current


def _box_readable(mode: int) -> int:
    """`mode` with the owner's read and execute bits granted to group and others too."""
    if mode & 0o400:
        mode |= 0o044
    if mode & 0o100:
        mode |= 0o011
    return mode


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, path: str, label: str):
    mode = _box_readable(member.mode & 0o7777)
    if member.isdir():
        if os.geteuid() != 0:
            mode |= 0o700  # rootless: a 0555 directory must still take upper layers' entries
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, mode)
            return
        _remove(path)
        os.mkdir(path, 0o700)
        os.chmod(path, mode)
        return
    _remove(path)
    if member.isfile():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, tar.extractfile(member) as src:
            shutil.copyfileobj(src, out, _COPY_CHUNK)
            os.fchmod(out.fileno(), mode)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk():
        parts = _member_parts(member.linkname, label)
        source = os.path.join(_resolve_dir(root, parts[:-1], label, member.linkname), parts[-1])
        if not os.path.isfile(source) or os.path.islink(source):
            raise HostileLayerError(
                f"{label}: hard link {member.name!r} -> {member.linkname!r}: no such file"
            )
        os.link(source, path, follow_symlinks=False)
    elif member.isfifo():
        os.mkfifo(path, mode)
    else:
        raise HostileLayerError(f"{label}: unsupported member type of {member.name!r}")


def _clear_lower(directory: str, rel_dir: str, created: set[str]) -> None:
    """An opaque directory: remove every entry lower layers put in it."""
    for name in os.listdir(directory):
        if os.path.normpath(os.path.join(rel_dir, name)) not in created:
            _remove(os.path.join(directory, name))


def _remove(path: str) -> None:
    """Removes a file, link or whole directory at `path` (never following a link)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
