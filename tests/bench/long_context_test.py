"""The long-context probe: compiled temp memory linear in length, the naive path quadratic."""

import json

import pytest

from thundersync_jax.bench import long_context

TINY = ["--hidden=32", "--layers=1", "--heads=4", "--kv_heads=2", "--head_dim=16", "--vocab=512"]


def _rows(capsys, *flags):
    assert long_context.main(["--tokens=512,2048", "--block=128", "--tile=256", *TINY, *flags]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# in make test, not test-quick: one of the unit tier's slowest (a benchmark's probe)
@pytest.mark.slow
def test_probe_prints_one_line_per_length_and_new_paths_grow_linearly(capsys):
    new = _rows(capsys)
    naive = _rows(capsys, "--naive")
    keys = {"tokens", "temp_bytes", "argument_bytes", "output_bytes", "segment_temp_bytes"}
    assert [r["tokens"] for r in new] == [512, 2048] and keys <= set(new[0])
    assert new[1]["temp_bytes"] <= 4.5 * new[0]["temp_bytes"]  # 4x tokens
    assert naive[1]["temp_bytes"] >= 8 * naive[0]["temp_bytes"]  # [T, T] scores: ~16x
    assert new[1]["temp_bytes"] < naive[1]["temp_bytes"] / 4
    # The segment (1,024 tokens) against a 4x longer cache: the new path stays ~flat.
    assert new[1]["segment_temp_bytes"] <= 2 * new[0]["segment_temp_bytes"]
    assert naive[1]["segment_temp_bytes"] > new[1]["segment_temp_bytes"]
