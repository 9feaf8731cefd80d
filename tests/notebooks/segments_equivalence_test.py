"""Executes notebooks/segments_equivalence.ipynb and checks the errors it reports."""

import re

import pytest


@pytest.mark.slow
def test_segments_notebook_equals_one_shot(run_notebook):
    outputs, text = run_notebook("segments_equivalence.ipynb", timeout=600)
    assert "OPD, 64 turns" in text and "GRPO batch" in text
    worst = float(re.search(r"MAX_RELATIVE_ERROR=(\S+)", text).group(1))
    assert worst <= 1e-5
    assert any("image/png" in o.get("data", {}) for o in outputs), "the error plot is missing"
