"""What a benchmark script shows: its markdown table on stdout, its result as JSON on request."""

from __future__ import annotations

import json
import os
from typing import Any


def show(table: str, result: Any, out: str = "") -> None:
    """Prints `table`; with `out`, also writes `result` there as JSON (its folder made)."""
    print(table)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
