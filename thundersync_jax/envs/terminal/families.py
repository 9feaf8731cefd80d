"""Task generators: each family builds a `TerminalTask` from a seeded RNG and a difficulty.

Everything is generated here (pseudo-words from syllables, synthetic logs and CSVs), so
no download is ever needed. Expected answers are computed in Python from the same data
the setup script writes, independently of the shell pipeline in the demonstration.
Difficulty grows the workspace (setup size) and adds distractors and conditions, so
episode lengths and command counts vary across tasks.

The generators live in search_families.py, count_families.py and edit_families.py (their
shared pseudo-word helpers in words.py); this module names them and deals out tasks.
"""

from __future__ import annotations

import random

from thundersync_jax.envs.terminal.count_families import count_matching, csv_sum, top_words
from thundersync_jax.envs.terminal.edit_families import organize_by_extension, replace_in_files
from thundersync_jax.envs.terminal.search_families import find_by_content, find_by_name
from thundersync_jax.envs.terminal.task import TerminalTask

FAMILIES = {
    "find_by_name": find_by_name,
    "find_by_content": find_by_content,
    "count_matching": count_matching,
    "top_words": top_words,
    "replace_in_files": replace_in_files,
    "organize_by_extension": organize_by_extension,
    "csv_sum": csv_sum,
}


def generate_tasks(
    num_tasks: int,
    seed: int = 0,
    families: tuple[str, ...] | None = None,
    difficulties: tuple[int, ...] = (1, 2, 3),
) -> list[TerminalTask]:
    """Deterministic tasks: task i uses family i mod F and difficulty i mod D.

    With the default 7 families and 3 levels (coprime), 21 consecutive tasks cover every
    (family, difficulty) pair once.
    """
    names = tuple(FAMILIES) if families is None else families
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"unknown terminal task families {unknown}; valid: {sorted(FAMILIES)}")
    bad = [d for d in difficulties if d not in (1, 2, 3)]
    if bad or not difficulties:
        raise ValueError(
            f"difficulties must be a non-empty subset of (1, 2, 3), got {difficulties}"
        )
    tasks = []
    for i in range(num_tasks):
        name, difficulty = names[i % len(names)], difficulties[i % len(difficulties)]
        rng = random.Random(f"terminal-{seed}-{i}")  # str seeds hash stably across runs
        tasks.append(FAMILIES[name](rng, difficulty, f"terminal/{name}/d{difficulty}/{seed}-{i}"))
    return tasks
