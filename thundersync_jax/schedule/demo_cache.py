"""Rendered demonstrations kept between runs of one code version (opt-in, by directory).

A warm start's cache key is its demonstrations' tokens, so every run renders them, even when
the warm start itself is a cache hit: for `configs/cpu.py:smoke` that is 12 sandboxed tool
calls and verifiers, ~14 s of wall and ~9 CPU-s per launch (a 2-process launch renders once
per process). A test suite starts dozens of such runs. With $THUNDERSYNC_DEMO_CACHE_DIR set,
a run whose demonstration inputs were rendered before reads them back instead.

The key is the inputs only: the task family, its tasks and `config.env` (their paths under
the workdir normalized: renders do not depend on the workdir), the episode limits, the decoys
switch and the tokenizer. It does not cover the code that renders them or the host's tools (python,
pytest, git, bubblewrap): point the variable at a directory made for one code version (the
test suite makes a fresh one per run, tests/conftest.py). Runs with a tokenizer from a
directory (whose files could change under the same path) always render.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import numpy as np

from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.learner.sft import SFTExample
from thundersync_jax.models import tokenizer

DEMO_CACHE_ENV = "THUNDERSYNC_DEMO_CACHE_DIR"


def cached_demonstrations(config, family, tasks: list, tok, workdir: str) -> list[SFTExample]:
    """`family.demonstrations(config, tasks, tok, workdir)` (an `envs.task_families.TaskFamily`),
    or the examples a run with the same inputs rendered into $THUNDERSYNC_DEMO_CACHE_DIR (unset,
    or a non-byte tokenizer: always rendered)."""
    root = os.environ.get(DEMO_CACHE_ENV, "")
    if not root or not isinstance(tok, tokenizer.ByteTokenizer):
        return family.demonstrations(config, tasks, tok, workdir)
    path = os.path.join(root, f"demos-{_key(config, family.name, tasks, tok, workdir)}.npz")
    if os.path.exists(path):
        return _load(path)
    examples = family.demonstrations(config, tasks, tok, workdir)
    _save(examples, path)
    return examples


def _key(config, family_name: str, tasks: list, tok, workdir: str) -> str:
    here = os.path.abspath(workdir)
    inputs = [
        family_name,
        repr(tasks).replace(here, "<workdir>"),
        config.env.to_json(sort_keys=True).replace(here, "<workdir>"),
        repr(LoopLimits.from_config(config.rollout)),
        bool(config.sft.decoys),
        repr(tok),
    ]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:24]


def _save(examples: list[SFTExample], path: str) -> None:
    """Writes next to `path` and renames: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrays = {
        "task_id": np.array([e.task_id for e in examples], dtype=str),
        "reward": np.array([e.reward for e in examples], np.float64),
        "complete": np.array([e.complete for e in examples], bool),
    }
    for i, e in enumerate(examples):
        arrays[f"tokens_{i}"], arrays[f"loss_mask_{i}"] = e.tokens, e.loss_mask
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _load(path: str) -> list[SFTExample]:
    with np.load(path, allow_pickle=False) as z:
        return [
            SFTExample(
                task_id=str(task_id),
                tokens=z[f"tokens_{i}"],
                loss_mask=z[f"loss_mask_{i}"],
                reward=float(z["reward"][i]),
                complete=bool(z["complete"][i]),
            )
            for i, task_id in enumerate(z["task_id"])
        ]
