"""Task families that search a workspace: files by name, files by content."""

from __future__ import annotations

import random

from thundersync_jax.envs.terminal.task import (
    CheckerScript,
    TerminalTask,
    bash,
    submit,
    write_files_script,
)
from thundersync_jax.envs.terminal.words import text_lines, word, words


def find_by_name(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """List the files with one extension in a nested tree (distractors at higher levels)."""
    ext = rng.choice(["cfg", "yaml", "ini", "conf"])
    others = ["txt", "log", "md", "py", "json"]
    n_files, depth = {1: (8, 1), 2: (25, 3), 3: (70, 4)}[difficulty]
    dirs = ["project"]
    for _ in range(depth * 3):
        dirs.append(rng.choice(dirs) + "/" + word(rng))
    files: dict[str, str] = {}
    while len(files) < n_files:
        e = ext if rng.random() < 0.3 else rng.choice(others)
        files[f"{rng.choice(dirs)}/{word(rng)}.{e}"] = f"{word(rng)}\n"
    target = f"{dirs[-1]}/main.{ext}"
    files[target] = "main\n"
    if difficulty >= 2:  # names that contain the extension without ending in it
        files[f"{rng.choice(dirs)}/{word(rng)}.{ext}.bak"] = "old\n"
        files[f"{rng.choice(dirs)}/{ext}_{word(rng)}.txt"] = "notes\n"
    if difficulty >= 3:  # a directory whose name ends in the extension is not a file
        files[f"{rng.choice(dirs)}/legacy.{ext}/readme.md"] = "moved\n"
    expected = sorted(p for p in files if p.endswith("." + ext))
    instruction = (
        f"Find every regular file under project/ whose name ends in .{ext}. Write their paths "
        f"relative to the current directory (like {target}), one per line, in any order, "
        "to answer.txt."
    )
    demo = (
        bash("ls -R project | head -n 40"),
        bash(f"find project -type f -name '*.{ext}' | sort > answer.txt"),
        bash("cat answer.txt"),
        submit(),
    )
    checker = CheckerScript().answer_line_set(expected)
    return TerminalTask(
        task_id=task_id,
        family="find_by_name",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )


def find_by_content(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """List the files that contain an exact word (case and substring distractors)."""
    vocab = words(rng, 30)
    token = f"{word(rng).upper()}{rng.randint(10, 99)}"
    n_files = {1: 6, 2: 20, 3: 45}[difficulty]
    files = {
        f"docs/{word(rng)}_{i}.txt": text_lines(rng, rng.randint(3, 12), vocab)
        for i in range(n_files)
    }
    paths = list(files)
    hits = rng.sample(paths, k=max(1, n_files // 4))
    for p in hits:
        lines = files[p].splitlines()
        i = rng.randrange(len(lines))
        lines[i] = f"{lines[i]} {token} {rng.choice(vocab)}"
        files[p] = "\n".join(lines) + "\n"
    misses = [p for p in paths if p not in hits]
    if difficulty >= 2 and misses:  # other case: not the word asked for
        files[misses[0]] += f"{token.lower()} {rng.choice(vocab)}\n"
    if difficulty >= 3 and len(misses) > 1:  # longer word containing it
        files[misses[1]] += f"{token}X {rng.choice(vocab)}\n"
    expected = sorted(hits)
    instruction = (
        f"Some text files under docs/ contain the exact word {token} (case-sensitive, as a "
        "whole word). Write the paths of those files (like docs/name.txt), one per line, in "
        "any order, to answer.txt."
    )
    demo = (
        bash(f"grep -rn {token} docs | head -n 20"),
        bash(f"grep -rlw -- {token} docs | sort > answer.txt"),
        bash("cat answer.txt"),
        submit(),
    )
    checker = CheckerScript().answer_line_set(expected)
    return TerminalTask(
        task_id=task_id,
        family="find_by_content",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )
