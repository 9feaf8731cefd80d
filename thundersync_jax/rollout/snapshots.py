"""Versioned weight snapshots: the learner publishes, rollout engines load.

One snapshot is an Orbax checkpoint written by our SnapshotHandler (snapshot_handler.py):

    <root>/v<version>/    (default root /dev/shm/thundersync/<run>)
      params.bin          every leaf at a 64-byte aligned offset
      manifest.json       version, kind, tree hash, leaf table, sizes, "complete": true
      _CHECKPOINT_METADATA, commit_success.txt    (Orbax's)

Atomicity is Orbax's: `ocp.Checkpointer.save` writes into
`<root>/v<version>.orbax-checkpoint-tmp`, adds `commit_success.txt` and renames it to
`v<version>` in one step (snapshot_commit.py), so a reader sees either no snapshot or a
complete one. A loader still checks the completeness marker, the data size and the tree
structure, and raises SnapshotError naming what is wrong on a torn, corrupt or mismatched
snapshot.

Cost per publication (see experiments/bench_publish.py): the learner copies each leaf once into
the file (a spare file prepared in the background since the last publication, see
snapshot_spares.py), an engine maps the file read-only (no copy) and `jax.device_put` aliases it
on CPU or copies it host-to-device on GPU.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from etils import epath

from thundersync_jax.rollout import snapshot_spares
from thundersync_jax.rollout.snapshot_commit import TMP_DIR_SUFFIX, InlineRenameTemporaryPath
from thundersync_jax.rollout.snapshot_handler import (
    DATA_FILE,
    FORMAT,
    MANIFEST,
    SnapshotError,
    SnapshotHandler,
    SnapshotRestore,
    SnapshotSave,
    layout,
)

__all__ = [
    "DATA_FILE",
    "DEFAULT_BASE",
    "KINDS",
    "MANIFEST",
    "SnapshotError",
    "default_root",
    "list_versions",
    "load",
    "prepare_next",
    "prune",
    "publish",
    "read_manifest",
    "snapshot_path",
    "tree_hash",
    "tree_signature",
]

DEFAULT_BASE = "/dev/shm/thundersync"
KINDS = ("params", "lora_adapters", "merged")
_VERSION_DIR = re.compile(r"^v(\d+)$")
_PRUNED = ".pruned-"


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
        (
            jax.tree_util.keystr(path),
            tuple(int(d) for d in np.shape(x)),
            np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).name,
        )
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
    import jax
    import orbax.checkpoint as ocp

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax logs several INFO lines per save
    # Each learner process publishes to its own engines (DESIGN §7): a snapshot is this
    # process's alone, so no barrier with the others and this process creates its directory.
    me = jax.process_index()
    return ocp.Checkpointer(
        SnapshotHandler(),
        temporary_path_class=InlineRenameTemporaryPath,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}
        ),
    )


# ----------------------------------------------------------------------------- publish


def publish(
    params: Any,
    version: int,
    root: str,
    *,
    kind: str = "params",
    keep: int = 2,
    checksum: bool = False,
    prepare_next: bool = True,
) -> str:
    """Writes `params` (any pytree of arrays) as snapshot `version` under `root`, atomically.

    Args:
      params: the weights to publish (full params, LoRA adapters, or merged weights).
      version: the policy version; engines tag their outputs with it.
      root: the run's snapshot directory (see `default_root`).
      kind: "params", "lora_adapters" or "merged"; recorded in the manifest for the loader.
      keep: how many most recent versions to keep; older ones are removed after the commit.
      checksum: also record an Adler-32 of the bytes, verified on load (costs one pass over the
        bytes on each side; sizes and structure are always checked).
      prepare_next: after the commit, start the deferred cleanup and prepare the next
        snapshot's file in the background (one extra snapshot's worth of memory in `root`; see
        snapshot_spares.py). With False, call `prepare_next(path)` once engines have loaded it.

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

    # np.asarray of a CPU JAX array is a view (no copy); on an accelerator it is the one
    # device-to-host copy publication needs.
    host = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
    signature = tree_signature(params)
    table, size = layout(signature)
    header = {
        "format": FORMAT,
        "version": int(version),
        "kind": kind,
        "tree_hash": _signature_hash(signature),
        "param_count": int(sum(int(np.prod(s, dtype=np.int64)) for _, s, _ in signature)),
    }
    snapshot_spares.after_publication(root, None)  # a previous publication's leftover cleanup
    spare = snapshot_spares.take(root, size)
    try:
        _checkpointer().save(
            final, args=SnapshotSave(host, header, table, size, checksum=checksum, spare=spare)
        )
    except BaseException:
        if spare is not None:
            spare.discard()
        for tmp in glob.glob(glob.escape(final) + ".orbax-checkpoint-tmp*"):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep=keep, background=True)
    if prepare_next:
        snapshot_spares.after_publication(root, size)
    return final


def prepare_next(path: str) -> None:
    """Starts the publication's deferred cleanup and preparing the next snapshot's file.

    Both run in the background. `publish(prepare_next=True)` does this right after its commit;
    a caller that waits for engines to load the snapshot (EngineManager.publish) calls it after
    their acknowledgements instead, so the background work does not compete with the loads.
    """
    root = os.path.dirname(os.path.abspath(path))
    snapshot_spares.after_publication(root, read_manifest(path)["data_bytes"])


def list_versions(root: str) -> list[int]:
    """Published versions under `root`, ascending (temp directories are not versions)."""
    if not os.path.isdir(root):
        return []
    found = (_VERSION_DIR.match(name) for name in os.listdir(root))
    return sorted(int(m.group(1)) for m in found if m)


def prune(root: str, keep: int = 2, *, background: bool = False) -> list[int]:
    """Removes all but the `keep` newest versions; returns the removed versions.

    A removed version is first renamed out of the version namespace (one atomic step, so no
    loader finds it afterwards), then deleted; with `background`, the deletion (freeing the
    file's pages: ~half a memory copy) is deferred (see snapshot_spares.defer). An engine
    still mapping a removed snapshot keeps its pages until it unmaps them.
    """
    removed = list_versions(root)[:-keep] if keep > 0 else list_versions(root)
    trash = [n for n in os.listdir(root) if n.startswith(_PRUNED)] if removed else []
    for v in removed:
        name = f"{_PRUNED}v{v}-{uuid.uuid4().hex[:8]}"
        os.rename(snapshot_path(root, v), os.path.join(root, name))
        trash.append(name)
    for name in trash:  # including leftovers of a process that died mid-prune
        path = os.path.join(root, name)
        if background:
            snapshot_spares.defer(root, shutil.rmtree, path, True)
        else:
            shutil.rmtree(path, ignore_errors=True)
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
    """Loads a published snapshot as read-only numpy arrays mapping its file (no copy).

    The arrays keep the mapping alive; pruning the snapshot meanwhile is safe (see
    snapshot_handler.py). On CPU, `jax.device_put` of the result aliases the mapping too.

    Args:
      path: a snapshot directory returned by `publish`.
      expected_version: if given, the manifest's version must equal it.
      like: a pytree (arrays or jax.ShapeDtypeStruct) with the structure to restore into; the
        snapshot's structure, shapes and dtypes must match it exactly. If None, returns a flat
        dict {key path: array}.

    Returns:
      The parameters as read-only numpy arrays.

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
    # The handler's restore, as ocp.Checkpointer.restore would call it: the Checkpointer adds
    # only a committed-path check (the one below) and bookkeeping, ~5 ms per load on the dev
    # machine. `ocp.Checkpointer(SnapshotHandler()).restore` reads the same snapshot.
    if TMP_DIR_SUFFIX in os.path.basename(os.path.normpath(path)):
        raise SnapshotError(f"{path} is an uncommitted Orbax temporary directory")
    leaves = SnapshotHandler().restore(epath.Path(path), args=SnapshotRestore(manifest))
    if like is None:
        return {e["path"]: x for e, x in zip(manifest["leaves"], leaves, strict=True)}
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
