"""Runs every ```python block of docs/accumulators.md, in order, in one namespace."""

import pathlib
import re

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "accumulators.md"


def test_guide_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 6, "the guide lost its examples"
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    # Section 3 prints the open-group error it provokes.
    assert "groups [0, 1] are still open" in capsys.readouterr().out
