"""Snapshot publication: round trip, atomicity, retention, and clear failures."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.rollout import snapshot_spares, snapshots
from thundersync_jax.rollout.snapshots import SnapshotError


def _tree(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.standard_normal((7, 5)).astype(np.float32),
        "layers": [
            {
                "w": rng.standard_normal((5, 3)).astype(np.float32),
                "b": np.arange(3, dtype=np.int32),
            },
            {
                "w": jnp.asarray(rng.standard_normal((5, 3)), jnp.bfloat16),
                "b": np.ones(3, np.int32),
            },
        ],
        "scale": np.float32(rng.standard_normal()),
    }


def _assert_same(a, b):
    fa, fb = jax_leaves(a), jax_leaves(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb, strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def jax_leaves(t):
    import jax

    return jax.tree_util.tree_leaves(t)


def test_round_trip_restores_values_dtypes_and_structure(tmp_path):
    tree = _tree()
    path = snapshots.publish(tree, 3, str(tmp_path), kind="params")
    assert path == os.path.join(tmp_path, "v3")
    out = snapshots.load(path, expected_version=3, like=tree)
    _assert_same(out, tree)
    manifest = snapshots.read_manifest(path)
    assert manifest["version"] == 3 and manifest["kind"] == "params"
    assert manifest["param_count"] == 7 * 5 + 2 * (5 * 3 + 3) + 1
    assert manifest["tree_hash"] == snapshots.tree_hash(tree)
    flat = snapshots.load(path)  # no `like`: {key path: array}
    assert set(flat) == {p for p, _, _ in snapshots.tree_signature(tree)}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_nnx_model_params_round_trip(tmp_path):
    from flax import nnx

    from thundersync_jax.models import qwen3

    cfg = qwen3.Qwen3Config(
        vocab_size=31,
        hidden_size=16,
        intermediate_size=22,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    _, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(1)), nnx.Param)
    path = snapshots.publish(params, 0, str(tmp_path))
    _assert_same(snapshots.load(path, 0, like=params), params)


def test_lora_adapters_kind_is_recorded(tmp_path):
    adapters = {"q_proj": {"a": np.ones((5, 2), np.float32), "b": np.zeros((2, 5), np.float32)}}
    path = snapshots.publish(adapters, 1, str(tmp_path), kind="lora_adapters")
    assert snapshots.read_manifest(path)["kind"] == "lora_adapters"
    with pytest.raises(ValueError, match="kind must be one of"):
        snapshots.publish(adapters, 2, str(tmp_path), kind="adapters")


def test_version_mismatch_fails_clearly(tmp_path):
    path = snapshots.publish(_tree(), 4, str(tmp_path))
    with pytest.raises(SnapshotError, match="holds version 4, expected 5"):
        snapshots.load(path, expected_version=5, like=_tree())


def test_tree_mismatch_names_the_first_difference(tmp_path):
    path = snapshots.publish(_tree(), 1, str(tmp_path))
    other = _tree()
    other["embed"] = np.zeros((7, 6), np.float32)
    with pytest.raises(SnapshotError, match=r"first difference.*\['embed'\]"):
        snapshots.load(path, 1, like=other)
    missing = _tree()
    del missing["scale"]
    with pytest.raises(SnapshotError, match="different parameter tree"):
        snapshots.load(path, 1, like=missing)


def _data_file(path):
    return os.path.join(path, snapshots.DATA_FILE)


def test_torn_snapshots_fail_clearly(tmp_path):
    tree = _tree()
    path = snapshots.publish(tree, 1, str(tmp_path))
    victim = _data_file(path)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    with pytest.raises(SnapshotError, match="corrupt snapshot.*manifest recorded"):
        snapshots.load(path, 1, like=tree)
    os.remove(victim)
    with pytest.raises(SnapshotError, match="missing file"):
        snapshots.load(path, 1, like=tree)
    os.remove(os.path.join(path, snapshots.MANIFEST))
    with pytest.raises(SnapshotError, match="torn snapshot.*no manifest.json"):
        snapshots.load(path, 1, like=tree)
    with pytest.raises(SnapshotError, match="no snapshot at"):
        snapshots.load(os.path.join(tmp_path, "v9"), 9, like=tree)


def test_incomplete_marker_is_rejected(tmp_path):
    path = snapshots.publish(_tree(), 1, str(tmp_path))
    file = os.path.join(path, snapshots.MANIFEST)
    manifest = json.load(open(file))
    manifest["complete"] = False
    json.dump(manifest, open(file, "w"))
    with pytest.raises(SnapshotError, match="completeness marker"):
        snapshots.load(path, 1)


def test_checksum_catches_flipped_bytes(tmp_path):
    tree = {"w": np.arange(100_000, dtype=np.float32)}
    path = snapshots.publish(tree, 1, str(tmp_path), checksum=True)
    victim = _data_file(path)
    with open(victim, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        snapshots.load(path, 1, like=tree)


def test_keeps_the_last_two_versions_and_refuses_rewrites(tmp_path):
    root = str(tmp_path / "run")
    for v in range(1, 5):
        snapshots.publish(_tree(v), v, root)
    assert snapshots.list_versions(root) == [3, 4]
    _assert_same(snapshots.load(snapshots.snapshot_path(root, 3), 3, like=_tree()), _tree(3))
    with pytest.raises(SnapshotError, match="already exists"):
        snapshots.publish(_tree(), 4, root)
    names = sorted(os.listdir(root))
    spares = [n for n in names if n.startswith(snapshot_spares.SPARE_PREFIX)]
    assert len(spares) <= 1  # and maybe .pruned-* directories still being deleted:
    assert [n for n in names if not n.startswith(".")] == ["v3", "v4"]
    snapshot_spares.discard(root)
    snapshot_spares.drain()  # pruned versions are deleted in the background
    assert sorted(os.listdir(root)) == ["v3", "v4"]


def test_orbax_commits_an_aligned_read_only_snapshot(tmp_path):
    tree = _tree()
    path = snapshots.publish(tree, 1, str(tmp_path), prepare_next=False)
    assert {"_CHECKPOINT_METADATA", "commit_success.txt"} <= set(os.listdir(path))  # Orbax's
    assert not [n for n in os.listdir(tmp_path) if "orbax-checkpoint-tmp" in n]
    manifest = snapshots.read_manifest(path)
    assert all(e["offset"] % 64 == 0 for e in manifest["leaves"])
    out = snapshots.load(path, 1, like=tree)
    assert not out["embed"].flags.writeable  # a read-only mapping of the file
    # Orbax's own Checkpointer restores the same arrays through the registered handler.
    from thundersync_jax.rollout import snapshot_handler

    leaves = snapshots._checkpointer().restore(
        path, args=snapshot_handler.SnapshotRestore(manifest)
    )
    _assert_same(leaves, jax_leaves(tree))
    assert out["embed"].ctypes.data % 64 == 0


def test_next_publication_fills_the_prepared_spare(tmp_path):
    root = str(tmp_path)
    snapshots.publish(_tree(1), 1, root)
    snapshot_spares.wait(root)
    (spare,) = [n for n in os.listdir(root) if n.startswith(snapshot_spares.SPARE_PREFIX)]
    inode = os.stat(os.path.join(root, spare)).st_ino
    path = snapshots.publish(_tree(2), 2, root, prepare_next=False)
    assert os.stat(os.path.join(path, snapshots.DATA_FILE)).st_ino == inode
    _assert_same(snapshots.load(path, 2, like=_tree()), _tree(2))
    # A spare of another size is not used (and not left behind).
    snapshots.publish(_tree(3), 3, root)
    snapshot_spares.wait(root)
    small = {"w": np.arange(5, dtype=np.float32)}
    path = snapshots.publish(small, 4, root, prepare_next=False)
    _assert_same(snapshots.load(path, 4, like=small), small)
    assert not [n for n in os.listdir(root) if n.startswith(snapshot_spares.SPARE_PREFIX)]


def test_loaded_weights_outlive_pruning_of_their_snapshot(tmp_path):
    import jax

    root = str(tmp_path)
    tree = {"w": np.random.default_rng(0).standard_normal((257, 64)).astype(np.float32)}
    path = snapshots.publish(tree, 1, root, prepare_next=False)
    host = snapshots.load(path, 1, like=tree)
    served = jax.device_put(host)  # on CPU aliases the mapping
    for v in (2, 3):
        snapshots.publish({"w": np.zeros((257, 64), np.float32)}, v, root, prepare_next=False)
    assert snapshots.list_versions(root) == [2, 3]  # v1's file is unlinked
    del host
    np.testing.assert_array_equal(np.asarray(served["w"]), tree["w"])


def test_default_root_rejects_paths():
    assert snapshots.default_root("exp1") == "/dev/shm/thundersync/exp1"
    with pytest.raises(ValueError, match="plain directory name"):
        snapshots.default_root("../x")


def test_a_crashed_save_neither_counts_nor_blocks_its_version(tmp_path):
    root = str(tmp_path)
    leftover = os.path.join(root, "v5.orbax-checkpoint-tmp")
    os.makedirs(leftover)
    open(os.path.join(leftover, snapshots.DATA_FILE), "wb").write(b"half")
    assert snapshots.list_versions(root) == []
    with pytest.raises(SnapshotError, match="no manifest.json"):
        snapshots.load(leftover)
    os.makedirs(os.path.join(root, "v6.orbax-checkpoint-tmp"))
    path6 = snapshots.publish(_tree(), 6, os.path.join(root, "elsewhere"), prepare_next=False)
    for name in os.listdir(path6):  # a complete-looking but uncommitted directory
        os.link(os.path.join(path6, name), os.path.join(root, "v6.orbax-checkpoint-tmp", name))
    with pytest.raises(SnapshotError, match="uncommitted Orbax temporary directory"):
        snapshots.load(os.path.join(root, "v6.orbax-checkpoint-tmp"))
    shutil.rmtree(os.path.join(root, "v6.orbax-checkpoint-tmp"))
    shutil.rmtree(os.path.join(root, "elsewhere"))
    path = snapshots.publish(_tree(), 5, root, prepare_next=False)
    _assert_same(snapshots.load(path, 5, like=_tree()), _tree())
    assert sorted(os.listdir(root)) == ["v5"]


def test_a_failing_save_cleans_up_and_the_next_one_works(tmp_path):
    root = str(tmp_path)
    snapshots.publish(_tree(1), 1, root)  # leaves a spare for the next publication
    snapshot_spares.wait(root)
    with pytest.raises(TypeError):  # object arrays have no bytes to publish
        snapshots.publish({"w": np.array([object()] * 3)}, 2, root)
    assert snapshots.list_versions(root) == [1]
    assert not [n for n in os.listdir(root) if "orbax-checkpoint-tmp" in n]
    path = snapshots.publish(_tree(3), 3, root, prepare_next=False)
    _assert_same(snapshots.load(path, 3, like=_tree()), _tree(3))
