"""The learner mesh from `config.mesh` and the row sharding of chunks (8 fake CPU devices)."""

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from thundersync_jax.learner import chunks, mesh


def _mesh_config(fsdp, tp):
    return ml_collections.ConfigDict(dict(fsdp=fsdp, tp=tp, rules=()))


def test_mesh_takes_its_sizes_from_the_config():
    m = mesh.learner_mesh(_mesh_config(4, 2))
    assert dict(m.shape) == {"fsdp": 4, "tp": 2}
    assert list(m.devices.flat) == jax.devices()[:8]
    single = mesh.learner_mesh(_mesh_config(1, 1))  # fewer than the devices: the first ones
    assert dict(single.shape) == {"fsdp": 1, "tp": 1} and single.devices.flat[0] == jax.devices()[0]


def test_too_many_devices_names_sizes_count_and_valid_choices():
    with pytest.raises(ValueError) as e:
        mesh.learner_mesh(_mesh_config(4, 4))
    text = str(e.value)
    assert "fsdp=4 x tp=4 needs 16 devices" in text and "has 8" in text
    for f, t in [(1, 8), (2, 4), (4, 2), (8, 1)]:
        assert f"fsdp={f} tp={t}" in text
    with pytest.raises(ValueError, match=r"config.mesh.tp=0 must be an int >= 1"):
        mesh.learner_mesh(_mesh_config(2, 0))
    with pytest.raises(ValueError, match=r"config.mesh.fsdp=2.5"):
        mesh.learner_mesh(_mesh_config(2.5, 1))


def test_valid_mesh_sizes_are_the_factor_pairs():
    assert mesh.valid_mesh_sizes(6) == [(1, 6), (2, 3), (3, 2), (6, 1)]
    assert mesh.valid_mesh_sizes(5) == [(1, 5), (5, 1)]


def test_chunk_rows_split_over_fsdp_with_zero_padding_rows():
    m = mesh.learner_mesh(_mesh_config(4, 2))
    rows = mesh.batch_sharding(m)
    assert rows.spec == P("fsdp", None)
    tokens = np.arange(2 * 7, dtype=np.int32).reshape(2, 7) + 1
    mask = np.ones((2, 7), np.float32)
    placed = chunks.place_rows((tokens, mask), rows)
    assert [a.shape for a in placed] == [(4, 7), (4, 7)]  # 2 real rows + 2 zero rows
    assert placed[0].sharding == rows
    np.testing.assert_array_equal(np.asarray(placed[0])[:2], tokens)
    np.testing.assert_array_equal(np.asarray(placed[1])[2:], 0)  # padding is never scored
    # one device's shard holds one row
    assert {s.data.shape for s in placed[0].addressable_shards} == {(1, 7)}
