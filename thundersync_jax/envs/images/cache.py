"""The content-addressed rootfs cache: each image is unpacked once, by layer digests.

    ROOT/entries/KEY/rootfs      the unpacked image (read-only to the box)
    ROOT/entries/KEY/meta.json   {"diff_ids": [...], "size_bytes": N}
    ROOT/entries/KEY/used        its mtime is the last use (LRU order)
    ROOT/locks/KEY.lock          flock: exclusive while unpacking or evicting,
                                 shared while an episode uses the entry
    ROOT/tmp/                    unpacks in progress (renamed into entries/ when done)

KEY is the sha256 of the image's ordered diff_ids, so two images with the same layers
share an entry whatever their tags, compression or config. An image whose lower layers
are already cached as another entry starts from a hard-linked copy of it (`cp -al`) and
applies only the layers above: shared files take disk space once. That is safe because
applying a layer never writes into an existing file: it unlinks and creates.

Concurrent episodes (threads or processes) unpacking the same image serialise on the
entry's lock; the first unpacks into tmp/ and renames, the others find the entry.
Size accounting counts each entry's files (shared hard links once per entry, so the
total is an over-estimate); past `max_bytes`, least-recently-used entries that no
episode holds are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator

from thundersync_jax.envs.images import layers as layers_lib
from thundersync_jax.envs.images import layout

DEFAULT_CACHE_ENV = "TSJ_IMAGE_CACHE"  # cache directory
DEFAULT_LIMIT_ENV = "TSJ_IMAGE_CACHE_GB"  # size limit
DEFAULT_SETUID_ENV = "TSJ_IMAGE_SETUID"  # "refuse" (default) or "strip"
_DEFAULT_LIMIT_GB = 50.0


@dataclasses.dataclass(frozen=True)
class UnpackedImage:
    """An image ready to run: its cached rootfs and the config the box needs.

    Attributes:
      key: the cache key (sha256 of the ordered diff_ids).
      rootfs: host directory of the unpacked filesystem.
      env: the image's Env.
      working_dir: the image's WorkingDir ("" when unset).
      diff_ids: the layers, bottom first.
      size_bytes: bytes of the entry's files.
      unpacked_now: this call unpacked it (False: found in the cache).
      seconds: time this call spent getting it (unpacking or looking it up).
    """

    key: str
    rootfs: str
    env: dict[str, str]
    working_dir: str
    diff_ids: tuple[str, ...]
    size_bytes: int
    unpacked_now: bool
    seconds: float


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    key: str
    path: str
    diff_ids: tuple[str, ...]
    size_bytes: int
    last_used: float


def chain_key(diff_ids: tuple[str, ...] | list[str]) -> str:
    return hashlib.sha256("\n".join(diff_ids).encode()).hexdigest()


class ImageCache:
    """Unpacks images into ROOT once and hands out their rootfs (see the module doc).

    Args:
      root: cache directory (created on first use).
      max_bytes: size limit; None = no limit.
      setuid: "refuse" or "strip" setuid/setgid bits in layers (layers.apply_layer).
    """

    def __init__(self, root: str, max_bytes: int | None = None, *, setuid: str = "refuse"):
        self.root = os.path.abspath(root)
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes!r}")
        self.max_bytes = max_bytes
        if setuid not in ("refuse", "strip"):
            raise ValueError(f"setuid must be 'refuse' or 'strip', got {setuid!r}")
        self.setuid = setuid

    def _make_dirs(self) -> None:
        """Created on first use, so a cache that is only configured leaves no trace."""
        for sub in ("entries", "locks", "tmp"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)

    def entry_dir(self, key: str) -> str:
        return os.path.join(self.root, "entries", key)

    @contextlib.contextmanager
    def lease(self, image: str | layout.ImageSource) -> Iterator[UnpackedImage]:
        """The unpacked image, held (never evicted) until the block ends."""
        start = time.monotonic()
        self._make_dirs()
        source = image if isinstance(image, layout.ImageSource) else layout.open_image(image)
        key = chain_key(source.diff_ids)
        # A cached entry is taken with a shared lock alone, so leases nest (an episode's
        # verifier leases the image its episode holds); the exclusive lock is only for
        # an entry that is missing, which nobody can be holding.
        with self._lock(key, fcntl.LOCK_SH) as fd:
            unpacked_now = not os.path.isdir(self.entry_dir(key))
            if unpacked_now:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not os.path.isdir(self.entry_dir(key)):  # not made while we waited
                    self._ensure_lower(source)
                    self._unpack(source, key)
                else:
                    unpacked_now = False
                fcntl.flock(fd, fcntl.LOCK_SH)  # others may use it now; evictors may not
            os.utime(os.path.join(self.entry_dir(key), "used"))
            if unpacked_now:
                self.evict(keep={key})
            meta = self._meta(key)
            yield UnpackedImage(
                key=key,
                rootfs=os.path.join(self.entry_dir(key), "rootfs"),
                env=dict(source.env),
                working_dir=source.working_dir,
                diff_ids=source.diff_ids,
                size_bytes=int(meta["size_bytes"]),
                unpacked_now=unpacked_now,
                seconds=time.monotonic() - start,
            )

    def unpack(self, image: str | layout.ImageSource) -> UnpackedImage:
        """Makes sure the image is cached (unpacking it if needed) and returns it, unheld."""
        with self.lease(image) as unpacked:
            return unpacked

    def entries(self) -> list[CacheEntry]:
        """The complete entries, least recently used first."""
        found = []
        if not os.path.isdir(os.path.join(self.root, "entries")):
            return found
        for key in os.listdir(os.path.join(self.root, "entries")):
            try:
                meta = self._meta(key)
                used = os.stat(os.path.join(self.entry_dir(key), "used")).st_mtime
            except (OSError, ValueError):
                continue
            found.append(
                CacheEntry(
                    key, self.entry_dir(key), tuple(meta["diff_ids"]), meta["size_bytes"], used
                )
            )
        return sorted(found, key=lambda e: e.last_used)

    def evict(self, keep: set[str] = frozenset()) -> list[str]:
        """Removes least-recently-used entries not in `keep` and not held, until the cache
        fits `max_bytes`; returns the keys removed."""
        if self.max_bytes is None:
            return []
        entries = self.entries()
        total = sum(e.size_bytes for e in entries)
        removed = []
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry.key in keep:
                continue
            with self._lock(entry.key, fcntl.LOCK_EX | fcntl.LOCK_NB, missing_ok=True) as fd:
                if fd is None or not os.path.isdir(entry.path):
                    continue  # held by an episode (or gone)
                trash = os.path.join(self.root, "tmp", f"evict-{entry.key}-{uuid.uuid4().hex}")
                os.rename(entry.path, trash)
                shutil.rmtree(trash, ignore_errors=True)
            total -= entry.size_bytes
            removed.append(entry.key)
        return removed

    # -- internals ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, key: str, how: int, missing_ok: bool = False) -> Iterator[int | None]:
        path = os.path.join(self.root, "locks", key + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, how)
            except BlockingIOError:
                if not missing_ok:
                    raise
                yield None
                return
            yield fd
        finally:
            os.close(fd)  # releases the flock

    def _meta(self, key: str) -> dict:
        with open(os.path.join(self.entry_dir(key), "meta.json")) as f:
            return json.load(f)

    def _ensure_lower(self, source: layout.ImageSource) -> None:
        """Caches the image without its top layer too, when no lower chain is cached: the
        next image that differs only in its top layer (one per repository, on a shared
        interpreter) then starts from hard links of it."""
        n = len(source.layers) - 1
        if n < 1 or any(
            os.path.isdir(self.entry_dir(chain_key(source.diff_ids[:i]))) for i in range(1, n + 1)
        ):
            return
        lower = dataclasses.replace(source, layers=source.layers[:n])
        key = chain_key(lower.diff_ids)
        with self._lock(key, fcntl.LOCK_EX):
            if not os.path.isdir(self.entry_dir(key)):
                self._unpack(lower, key)

    def _unpack(self, source: layout.ImageSource, key: str) -> None:
        """Builds the entry in tmp/ (from the longest cached lower chain) and renames it in."""
        self._remove_stale_tmp()
        tmp = os.path.join(self.root, "tmp", f"{key}.{os.getpid()}.{uuid.uuid4().hex}")
        os.mkdir(tmp)
        try:
            rootfs = os.path.join(tmp, "rootfs")
            start = self._clone_lower(source.diff_ids, rootfs)
            for i, layer in enumerate(source.layers[start:], start):
                label = f"image {source.path} layer {i} ({layer.diff_id})"
                reader = layout.LayerReader(layer, label)
                try:
                    layers_lib.apply_layer(reader, rootfs, label, setuid=self.setuid)
                except tarfile.TarError as e:
                    raise layout.ImageError(f"{label}: not a readable tar ({e})") from None
                reader.finish()
            meta = {"diff_ids": list(source.diff_ids), "size_bytes": _tree_bytes(rootfs)}
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(meta, f)
            open(os.path.join(tmp, "used"), "w").close()
            os.rename(tmp, self.entry_dir(key))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _clone_lower(self, diff_ids: tuple[str, ...], rootfs: str) -> int:
        """Hard-link copies the cached entry of the longest proper prefix of `diff_ids`
        into `rootfs` (else makes it empty); returns how many layers that covers."""
        for n in range(len(diff_ids) - 1, 0, -1):
            key = chain_key(diff_ids[:n])
            with self._lock(key, fcntl.LOCK_SH | fcntl.LOCK_NB, missing_ok=True) as fd:
                lower = os.path.join(self.entry_dir(key), "rootfs")
                if fd is None or not os.path.isdir(lower):
                    continue
                subprocess.run(["cp", "-a", "-l", lower, rootfs], check=True, timeout=3600)
                return n
        os.mkdir(rootfs, 0o755)
        return 0

    def _remove_stale_tmp(self) -> None:
        """Removes unpacks left by processes that died (their pid is in the name)."""
        for name in os.listdir(os.path.join(self.root, "tmp")):
            parts = name.split(".")
            if len(parts) == 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
                shutil.rmtree(os.path.join(self.root, "tmp", name), ignore_errors=True)


def default_cache() -> ImageCache:
    """The cache at $TSJ_IMAGE_CACHE (default ~/.cache/thundersync_jax/images), limited to
    $TSJ_IMAGE_CACHE_GB (default 50) GB, with setuid bits handled as $TSJ_IMAGE_SETUID
    says ("refuse", the default; "strip" for distribution images, whose su and mount
    are setuid: the box mounts everything nosuid and drops privileges anyway)."""
    root = os.environ.get(DEFAULT_CACHE_ENV) or os.path.expanduser(
        "~/.cache/thundersync_jax/images"
    )
    limit_gb = float(os.environ.get(DEFAULT_LIMIT_ENV) or _DEFAULT_LIMIT_GB)
    setuid = os.environ.get(DEFAULT_SETUID_ENV) or "refuse"
    return ImageCache(root, max_bytes=int(limit_gb * (1 << 30)), setuid=setuid)


def _tree_bytes(root: str) -> int:
    """Bytes of the regular files under root, each inode once, plus 4 KiB per directory."""
    seen, total = set(), 0
    for dirpath, dirnames, filenames in os.walk(root):
        total += 4096 * len(dirnames)
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
