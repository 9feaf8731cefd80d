"""Executes notebooks/grpo_equivalence.ipynb and checks the errors it reports."""

import pathlib
import re
import sys

import nbformat
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "grpo_equivalence.ipynb"


def _stdout(nb) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
    )


def test_notebook_streaming_equals_synchronous():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    text = _stdout(nb)
    # The kernel must be this interpreter (the .venv's), not some other python3 on PATH.
    kernel_python = re.search(r"kernel python: (\S+)", text).group(1)
    assert pathlib.Path(kernel_python).resolve() == pathlib.Path(sys.executable).resolve()
    worst = float(re.search(r"MAX_RELATIVE_ERROR=(\S+)", text).group(1))
    assert worst < 1e-5
    assert any(
        "image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", [])
    ), "the error plot is missing"
