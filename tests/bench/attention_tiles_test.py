"""The attention tile bench times every (length, largest tile) cell and reports the tile each
length is cut into (experiments.bench_attention's table)."""

import ml_collections

from thundersync_jax.bench import attention_tiles


def test_every_cell_is_timed_with_its_balanced_tile():
    heads = ml_collections.ConfigDict(
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    )
    result = attention_tiles.run(heads, lengths=(37, 64), tiles=(16, 32), rows=1, repeats=1)
    cells = {(r["tokens"], r["largest_tile"]): r for r in result["results"]}
    assert sorted(cells) == [(37, 16), (37, 32), (64, 16), (64, 32)]
    # 37 tokens: three tiles of 16 (13 rounded up to 8s), or two of 24 under a largest of 32
    assert [cells[37, 16]["tile"], cells[37, 32]["tile"], cells[64, 32]["tile"]] == [16, 24, 32]
    assert all(r["forward_s"] > 0 and r["gradient_s"] > 0 for r in cells.values())
    table = attention_tiles.markdown(result).splitlines()
    assert table[2] == "| tokens | tile 16 | tile 32 |"
    assert table[4].startswith("| 37 | ") and table[4].endswith("(24) |")
