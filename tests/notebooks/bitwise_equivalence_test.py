"""Executes notebooks/bitwise_equivalence.ipynb: every schedule ends at the same bits."""

import re

import pytest


@pytest.mark.slow  # a notebook kernel
def test_notebook_schedules_are_bitwise_equal(run_notebook):
    outputs, text = run_notebook("bitwise_equivalence.ipynb", timeout=600)
    assert int(re.search(r"BITWISE_EQUAL_SCHEDULES=(\d+)", text).group(1)) == 8
    assert float(re.search(r"MAX_RELATIVE_ERROR=(\S+)", text).group(1)) <= 1e-6
    assert "x64: False" in text  # exact without jax_enable_x64
    assert any("image/png" in o.get("data", {}) for o in outputs), "the figure is missing"
