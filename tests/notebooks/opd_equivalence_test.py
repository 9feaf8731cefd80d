"""Executes notebooks/opd_equivalence.ipynb end to end (its cells assert the equivalence)."""

import pathlib

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "opd_equivalence.ipynb"


def test_opd_notebook_runs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent.parent)}},
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "batch: streamed OPD accumulator vs full-batch grad" in text
    assert "worst parameter leaf" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
