"""Executes notebooks/opd_equivalence.ipynb end to end (its cells assert the equivalence)."""

import pytest


@pytest.mark.slow  # a notebook kernel
def test_opd_notebook_runs(run_notebook):
    outputs, text = run_notebook("opd_equivalence.ipynb", timeout=60)
    assert "batch: streamed OPD accumulator vs full-batch grad" in text
    assert "worst parameter leaf" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
