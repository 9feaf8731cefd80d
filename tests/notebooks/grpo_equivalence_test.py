"""Executes notebooks/grpo_equivalence.ipynb and checks the errors it reports."""

import pathlib
import re
import sys

import pytest


@pytest.mark.slow  # a notebook kernel
def test_notebook_streaming_equals_synchronous(run_notebook):
    outputs, text = run_notebook(
        "grpo_equivalence.ipynb", timeout=300, cwd=pathlib.Path(__file__).parents[2] / "notebooks"
    )
    # The kernel must be this interpreter (the .venv's), not some other python3 on PATH.
    kernel_python = re.search(r"kernel python: (\S+)", text).group(1)
    assert pathlib.Path(kernel_python).resolve() == pathlib.Path(sys.executable).resolve()
    worst = float(re.search(r"MAX_RELATIVE_ERROR=(\S+)", text).group(1))
    assert worst < 1e-5
    assert any("image/png" in o.get("data", {}) for o in outputs), "the error plot is missing"
