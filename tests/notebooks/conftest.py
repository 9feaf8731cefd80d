"""Runs a notebook of notebooks/ in a fresh kernel and hands back what it printed and showed."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture(scope="session")
def run_notebook():
    """Factory: `run(name, timeout, cwd=repo root)` -> (outputs, stdout text) after executing.

    Fails on any error output, so each test only checks what its notebook reports.
    """

    def run(name: str, timeout: int, cwd: pathlib.Path = NOTEBOOKS.parent):
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        ).execute()
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
        errors = [o for o in outputs if o.output_type == "error"]
        assert not errors, errors
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        return outputs, text

    return run
