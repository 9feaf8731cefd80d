"""Versioned weight snapshots: the learner publishes, rollout engines load.

Layout of one snapshot (default root /dev/shm/thundersync/<run>):

    <root>/v<version>/
      arrays/         an Orbax PyTree checkpoint {dtype name: one flat 1-D buffer}
      manifest.json   version, kind, tree hash, leaf table (path, shape, dtype, offset), file sizes,
                      "complete": true  (written last)

Why one flat buffer per dtype: Orbax's cost is dominated by per-array work (a TensorStore
spec, metadata, a file set per array), so a model's hundreds of leaves publish several times
slower than the same bytes as a few large arrays. The leaf table in the manifest restores the
tree as views of the buffers (no copy). The buffers are saved uncompressed (zarr3, no OCDBT)
in chunks TensorStore writes and reads in parallel; see experiments/bench_publish.py.

Atomicity: everything is written into `<root>/.tmp-v<version>-<random>/`, fsynced, then renamed
to `v<version>` in one step, so a reader sees either no snapshot or a complete one. A loader
still checks the manifest's completeness marker, the file sizes and the tree structure, and
raises SnapshotError naming what is wrong on a torn, corrupt or mismatched snapshot.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
import zlib
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

FORMAT = "thundersync-snapshot/1"
MANIFEST = "manifest.json"
ARRAYS_DIR = "arrays"
DEFAULT_BASE = "/dev/shm/thundersync"
KINDS = ("params", "lora_adapters", "merged")
# TensorStore splits each buffer into chunks of this size and writes/reads them concurrently.
CHUNK_BYTES = 8 << 20
_VERSION_DIR = re.compile(r"^v(\d+)$")


class SnapshotError(RuntimeError):
    """A snapshot is missing, torn, corrupt, of the wrong version, or of another tree."""


def default_root(run: str, base: str = DEFAULT_BASE) -> str:
    """Where a run's snapshots live: `<base>/<run>` (shared memory by default)."""
    if not run or "/" in run or run.startswith("."):
        raise ValueError(f"run name must be a plain directory name, got {run!r}")
    return os.path.join(base, run)


def snapshot_path(root: str, version: int) -> str:
    return os.path.join(root, f"v{int(version)}")


# ----------------------------------------------------------------------------- tree signature


def tree_signature(tree: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """(key path, shape, dtype name) of every leaf, in flatten order; works on abstract trees."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [
        (jax.tree_util.keystr(path), tuple(int(d) for d in np.shape(x)), np.dtype(x.dtype).name)
        for path, x in leaves
    ]


def tree_hash(tree: Any) -> str:
    """A hash of the tree's structure, leaf shapes and dtypes (not the values)."""
    return _signature_hash(tree_signature(tree))


def _signature_hash(signature: Iterable[tuple[str, tuple[int, ...], str]]) -> str:
    blob = json.dumps([[p, list(s), d] for p, s, d in signature], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- orbax


@functools.lru_cache(maxsize=1)
def _checkpointer():
    import orbax.checkpoint as ocp

    # Orbax logs one warning per save about skipped OCDBT merges (we do not use OCDBT).
    logging.getLogger("absl").setLevel(logging.ERROR)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=True, use_compression=False)
    return ocp.Checkpointer(handler)


def _save_buffers(path: str, buffers: dict[str, np.ndarray]) -> None:
    import orbax.checkpoint as ocp

    save_args = {k: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES) for k in buffers}
    _checkpointer().save(path, args=ocp.args.PyTreeSave(buffers, save_args=save_args))


def _restore_buffers(path: str, names: Iterable[str]) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    restore_args = {k: ocp.RestoreArgs(restore_type=np.ndarray) for k in names}
    return _checkpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


# ----------------------------------------------------------------------------- publish


def _fsync_tree(path: str) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_sizes(path: str) -> dict[str, int]:
    sizes = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            sizes[os.path.relpath(full, path)] = os.path.getsize(full)
    return sizes


def publish(
    params: Any,
    version: int,
    root: str,
    *,
    kind: str = "params",
    keep: int = 2,
    checksum: bool = False,
) -> str:
    """Writes `params` (any pytree of arrays) as snapshot `version` under `root`, atomically.

    Args:
      params: the weights to publish (full params, LoRA adapters, or merged weights).
      version: the policy version; engines tag their outputs with it.
      root: the run's snapshot directory (see `default_root`).
      kind: "params", "lora_adapters" or "merged"; recorded in the manifest for the loader.
      keep: how many most recent versions to keep; older ones are removed after the rename.
      checksum: also record an Adler-32 per buffer, verified on load (costs one pass over the
        bytes on each side; sizes and structure are always checked).

    Returns:
      The snapshot directory `<root>/v<version>`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    final = snapshot_path(root, version)
    if os.path.exists(final):
        raise SnapshotError(f"snapshot version {version} already exists at {final}")
    os.makedirs(root, exist_ok=True)

    host = jax.device_get(params)
    signature = tree_signature(host)
    leaves = jax.tree_util.tree_leaves(host)
    leaf_table, by_dtype, filled = [], {}, {}
    for (path, shape, dtype), leaf in zip(signature, leaves, strict=True):
        offset = filled.get(dtype, 0)
        by_dtype.setdefault(dtype, []).append(np.asarray(leaf))
        filled[dtype] = offset + int(np.prod(shape))
        leaf_table.append({"path": path, "shape": list(shape), "dtype": dtype, "offset": offset})
    buffers = {
        dtype: np.concatenate([x.reshape(-1) for x in group]) for dtype, group in by_dtype.items()
    }

    tmp = os.path.join(root, f".tmp-v{int(version)}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(tmp)
        _save_buffers(os.path.join(tmp, ARRAYS_DIR), buffers)
        manifest = {
            "format": FORMAT,
            "version": int(version),
            "kind": kind,
            "tree_hash": _signature_hash(signature),
            "param_count": int(sum(int(np.prod(s)) for _, s, _ in signature)),
            "num_bytes": int(sum(b.nbytes for b in buffers.values())),
            "buffers": {d: int(b.size) for d, b in buffers.items()},
            "checksums": {d: zlib.adler32(b.data) for d, b in buffers.items()} if checksum else {},
            "leaves": leaf_table,
            "files": _file_sizes(os.path.join(tmp, ARRAYS_DIR)),
            "complete": True,
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep=keep)
    return final


def list_versions(root: str) -> list[int]:
    """Published versions under `root`, ascending (temp directories are not versions)."""
    if not os.path.isdir(root):
        return []
    found = (_VERSION_DIR.match(name) for name in os.listdir(root))
    return sorted(int(m.group(1)) for m in found if m)


def prune(root: str, keep: int = 2) -> list[int]:
    """Removes all but the `keep` newest versions; returns the removed versions."""
    removed = list_versions(root)[:-keep] if keep > 0 else list_versions(root)
    for v in removed:
        shutil.rmtree(snapshot_path(root, v), ignore_errors=True)
    return removed


# ----------------------------------------------------------------------------- load


def read_manifest(path: str) -> dict:
    """The manifest of the snapshot at `path`; SnapshotError if missing, torn or incomplete."""
    file = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise SnapshotError(f"no snapshot at {path}")
    if not os.path.isfile(file):
        raise SnapshotError(f"torn snapshot at {path}: no {MANIFEST} (write did not finish)")
    try:
        with open(file) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SnapshotError(f"corrupt manifest {file}: {e}") from e
    if manifest.get("format") != FORMAT:
        raise SnapshotError(f"{file}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("complete") is not True:
        raise SnapshotError(f"torn snapshot at {path}: manifest has no completeness marker")
    return manifest


def _check_files(path: str, manifest: dict) -> None:
    arrays = os.path.join(path, ARRAYS_DIR)
    for rel, size in manifest["files"].items():
        full = os.path.join(arrays, rel)
        if not os.path.isfile(full):
            raise SnapshotError(f"torn snapshot at {path}: missing file {ARRAYS_DIR}/{rel}")
        actual = os.path.getsize(full)
        if actual != size:
            raise SnapshotError(
                f"corrupt snapshot at {path}: {ARRAYS_DIR}/{rel} has {actual} bytes, "
                f"the manifest recorded {size}"
            )


def _check_structure(manifest: dict, like: Any, path: str) -> None:
    expected = tree_signature(like)
    if _signature_hash(expected) == manifest["tree_hash"]:
        return
    stored = [(e["path"], tuple(e["shape"]), e["dtype"]) for e in manifest["leaves"]]
    detail = f"{len(stored)} leaves stored, {len(expected)} expected"
    for got, want in zip(stored, expected, strict=False):
        if got != want:
            detail = f"first difference: stored {got}, expected {want}"
            break
    raise SnapshotError(
        f"snapshot {path} (kind {manifest['kind']!r}) holds a different parameter tree than the "
        f"loader's: {detail}"
    )


def load(path: str, expected_version: int | None = None, like: Any = None) -> Any:
    """Loads a published snapshot as numpy arrays.

    Args:
      path: a snapshot directory returned by `publish`.
      expected_version: if given, the manifest's version must equal it.
      like: a pytree (arrays or jax.ShapeDtypeStruct) with the structure to restore into; the
        snapshot's structure, shapes and dtypes must match it exactly. If None, returns a flat
        dict {key path: array}.

    Returns:
      The parameters (numpy arrays, views into one buffer per dtype).

    Raises:
      SnapshotError: on a missing/torn/corrupt snapshot, a version mismatch or a tree mismatch.
    """
    manifest = read_manifest(path)
    if expected_version is not None and manifest["version"] != int(expected_version):
        raise SnapshotError(
            f"snapshot {path} holds version {manifest['version']}, expected {expected_version}"
        )
    if like is not None:
        _check_structure(manifest, like, path)
    _check_files(path, manifest)
    try:
        buffers = _restore_buffers(os.path.join(path, ARRAYS_DIR), manifest["buffers"])
    except Exception as e:  # TensorStore/Orbax raise many types for damaged data
        raise SnapshotError(f"corrupt snapshot at {path}: Orbax restore failed: {e}") from e
    for dtype, size in manifest["buffers"].items():
        buf = buffers.get(dtype)
        if buf is None or buf.size != size:
            raise SnapshotError(f"corrupt snapshot at {path}: buffer {dtype} has wrong size")
        want = manifest["checksums"].get(dtype)
        if want is not None and zlib.adler32(np.ascontiguousarray(buf).data) != want:
            raise SnapshotError(f"corrupt snapshot at {path}: checksum mismatch in {dtype} buffer")
    leaves = []
    for entry in manifest["leaves"]:
        n = int(np.prod(entry["shape"]))
        flat = buffers[entry["dtype"]][entry["offset"] : entry["offset"] + n]
        leaves.append(flat.reshape(entry["shape"]))
    if like is None:
        return {e["path"]: x for e, x in zip(manifest["leaves"], leaves, strict=True)}
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
