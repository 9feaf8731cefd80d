"""Snapshot publication: round trip, atomicity, retention, and clear failures."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.rollout import snapshots
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


def _data_files(path):
    arrays = os.path.join(path, snapshots.ARRAYS_DIR)
    manifest = snapshots.read_manifest(path)
    by_size = sorted(manifest["files"].items(), key=lambda kv: -kv[1])
    return [os.path.join(arrays, rel) for rel, _ in by_size]  # largest (array data) first


def test_torn_snapshots_fail_clearly(tmp_path):
    tree = _tree()
    path = snapshots.publish(tree, 1, str(tmp_path))
    victim = _data_files(path)[0]
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
    victim = _data_files(path)[0]
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
    assert sorted(os.listdir(root)) == ["v3", "v4"]


def test_default_root_rejects_paths():
    assert snapshots.default_root("exp1") == "/dev/shm/thundersync/exp1"
    with pytest.raises(ValueError, match="plain directory name"):
        snapshots.default_root("../x")
