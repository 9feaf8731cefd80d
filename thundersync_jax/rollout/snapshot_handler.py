"""The Orbax CheckpointHandler behind weight snapshots: one aligned data file plus a manifest.

Inside the directory Orbax commits (it saves into `<final>.orbax-checkpoint-tmp`, then renames
it to `<final>` in one step, so a reader sees no snapshot or a complete one):

    params.bin            every leaf's bytes in flatten order, each at a 64-byte aligned offset
    manifest.json         format, version, kind, tree hash, leaf table (path, shape, dtype,
                          offset, nbytes), data size, optional Adler-32, "complete": true;
                          written after the data
    _CHECKPOINT_METADATA  Orbax's own step metadata

Why not Orbax's PyTreeCheckpointHandler: it costs one TensorStore spec and file set per array
and needed a learner-side concatenation and an engine-side copy out of TensorStore; publication
reached ~3% of memory-copy bandwidth. Here the learner copies each leaf once, straight into the
file (into a preallocated, mapped spare file when one is ready, see snapshot_spares.py), and an
engine maps the file read-only: on CPU `jax.device_put` aliases 64-byte aligned host buffers
instead of copying, on GPU the mapping is the source of the host-to-device copy.

Lifetime of a mapping: the arrays `restore` returns are views of a read-only shared mapping, and
the mapping stays alive while any array (numpy or a JAX array aliasing it) references it. When
the learner prunes the snapshot, Linux unlinks the file but keeps its pages until the last
mapping goes away, so an engine keeps serving the old weights safely and the memory is freed
when it loads the next version. Snapshots are never written after commit, so a mapping never
sees its bytes change.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import zlib
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

FORMAT = "thundersync-snapshot/2"
DATA_FILE = "params.bin"
MANIFEST = "manifest.json"
# XLA's CPU client aliases (does not copy) host buffers aligned to 64 bytes.
ALIGN = 64


class SnapshotError(RuntimeError):
    """A snapshot is missing, torn, corrupt, of the wrong version, or of another tree."""


def layout(signature: list[tuple[str, tuple[int, ...], str]]) -> tuple[list[dict], int]:
    """The leaf table (path, shape, dtype, offset, nbytes) and the data file's size."""
    table, end = [], 0
    for path, shape, dtype in signature:
        offset = -(-end // ALIGN) * ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        table.append(
            {"path": path, "shape": list(shape), "dtype": dtype, "offset": offset, "nbytes": nbytes}
        )
        end = offset + nbytes
    return table, end


def _bytes_of(leaf: np.ndarray) -> np.ndarray:
    """The leaf's bytes as a flat uint8 view (a copy only if the leaf is not C-contiguous)."""
    return np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)


# ----------------------------------------------------------------------------- Orbax args
# Registered with the handler at the end of the file, so ocp.Checkpointer routes them to it.


@dataclasses.dataclass
class SnapshotSave(ocp.args.CheckpointArgs):
    """What `SnapshotHandler.save` writes.

    Attributes:
      leaves: host arrays in flatten order (np.asarray of a CPU JAX array is not a copy).
      header: manifest fields (format, version, kind, tree_hash, ...) without the leaf table.
      table: the leaf table from `layout`; `size` the data file's size.
      checksum: also record an Adler-32 of the leaf bytes (one more pass on each side).
      spare: a preallocated, mapped file of exactly `size` bytes to fill instead of writing a
        new one (see snapshot_spares.SpareFile), or None.
    """

    leaves: list[np.ndarray]
    header: dict
    table: list[dict]
    size: int
    checksum: bool = False
    spare: Any = None


@dataclasses.dataclass
class SnapshotRestore(ocp.args.CheckpointArgs):
    """How `SnapshotHandler.restore` reads: the manifest already read and checked by the caller."""

    manifest: dict
    verify_checksum: bool = True


# ----------------------------------------------------------------------------- handler


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data)
    while len(view):  # pwrite moves at most ~2 GiB per call
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _write_new_file(path: str, leaves: list[np.ndarray], table: list[dict], size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, size)  # the alignment padding reads as zeros
        for leaf, entry in zip(leaves, table, strict=True):
            _pwrite_all(fd, _bytes_of(leaf), entry["offset"])
        os.fsync(fd)
    finally:
        os.close(fd)


def _fill_spare(path: str, spare: Any, leaves: list[np.ndarray], table: list[dict]) -> None:
    buf = spare.adopt(path)  # renamed into the snapshot; still mapped writable
    for leaf, entry in zip(leaves, table, strict=True):
        dest = np.frombuffer(buf, np.uint8, entry["nbytes"], entry["offset"])
        np.copyto(dest, _bytes_of(leaf))
        del dest  # unmapping refuses while views exist
    del buf
    spare.finish()


def _checksum(parts: Any) -> int:
    value = 1
    for part in parts:
        value = zlib.adler32(part, value)
    return value


class SnapshotHandler(ocp.CheckpointHandler):
    """Saves a list of host arrays as one aligned file; restores them as zero-copy views."""

    def save(self, directory: epath.Path, args: SnapshotSave) -> None:  # type: ignore[override]
        directory = os.fspath(directory)
        data = os.path.join(directory, DATA_FILE)
        if args.spare is not None:
            _fill_spare(data, args.spare, args.leaves, args.table)
        else:
            _write_new_file(data, args.leaves, args.table, args.size)
        manifest = dict(args.header)
        manifest.update(leaves=args.table, data_bytes=args.size)
        if args.checksum:
            manifest["adler32"] = _checksum(_bytes_of(x) for x in args.leaves)
        manifest["complete"] = True  # readers reject a manifest without it
        with open(os.path.join(directory, MANIFEST), "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())

    def restore(self, directory: epath.Path, args: SnapshotRestore) -> list[np.ndarray]:  # type: ignore[override]
        path = os.fspath(directory)
        manifest = args.manifest
        data = os.path.join(path, DATA_FILE)
        try:
            fd = os.open(data, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotError(f"torn snapshot at {path}: missing file {DATA_FILE}") from None
        try:
            actual = os.fstat(fd).st_size
            if actual != manifest["data_bytes"]:
                raise SnapshotError(
                    f"corrupt snapshot at {path}: {DATA_FILE} has {actual} bytes, the manifest "
                    f"recorded {manifest['data_bytes']}"
                )
            if actual == 0:
                return [np.zeros(e["shape"], e["dtype"]) for e in manifest["leaves"]]
            # Read-only and shared: the page-cache pages themselves, page tables filled now
            # (MAP_POPULATE) rather than faulted in one by one during the first forward pass.
            buf = mmap.mmap(
                fd, actual, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
            )
        finally:
            os.close(fd)  # the mapping holds its own reference to the file
        leaves = [
            np.frombuffer(
                buf, e["dtype"], int(np.prod(e["shape"], dtype=np.int64)), e["offset"]
            ).reshape(e["shape"])
            for e in manifest["leaves"]
        ]
        want = manifest.get("adler32")
        if args.verify_checksum and want is not None:
            if _checksum(_bytes_of(x) for x in leaves) != want:
                raise SnapshotError(f"corrupt snapshot at {path}: checksum mismatch in {DATA_FILE}")
        return leaves

    def metadata(self, directory: epath.Path) -> dict:
        with open(os.path.join(os.fspath(directory), MANIFEST)) as f:
            return json.load(f)


ocp.args.register_with_handler(SnapshotHandler, for_save=True)(SnapshotSave)
ocp.args.register_with_handler(SnapshotHandler, for_restore=True)(SnapshotRestore)
