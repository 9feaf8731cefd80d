"""Executes notebooks/speedup_model.ipynb end to end (its cells assert the ceiling)."""

import pytest


@pytest.mark.slow  # a notebook kernel
def test_speedup_notebook_runs(run_notebook):
    outputs, text = run_notebook("speedup_model.ipynb", timeout=120)
    assert "stream" in text and "open peak" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # the speedup plot and three timelines
