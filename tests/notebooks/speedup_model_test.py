"""Executes notebooks/speedup_model.ipynb end to end (its cells assert the ceiling)."""

import pathlib

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "speedup_model.ipynb"


def test_speedup_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent.parent)}},
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "stream" in text and "open peak" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # the speedup plot and three timelines
