"""Task families that change the workspace: rename an identifier, sort files into folders."""

from __future__ import annotations

import random

from thundersync_jax.envs.terminal.task import (
    CheckerScript,
    TerminalTask,
    bash,
    submit,
    write_files_script,
)
from thundersync_jax.envs.terminal.words import word, words


def replace_in_files(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Rename an identifier in the .py files only (whole words only at level 3)."""
    vocab = words(rng, 20)
    old, new = f"{word(rng)}_v1", f"{word(rng)}_v2"
    n_files = {1: 4, 2: 12, 3: 24}[difficulty]
    files: dict[str, str] = {}
    for i in range(n_files):
        ext = "py" if i % 3 != 2 else "txt"
        body = [
            f"{rng.choice(vocab)} = {rng.choice(vocab)}({old})"
            if rng.random() < 0.4
            else f"{rng.choice(vocab)} = {rng.randint(0, 99)}"
            for _ in range(rng.randint(3, 8))
        ]
        if difficulty >= 3 and ext == "py":
            body.append(f"{old}x = {old}_extra + 1  # longer names stay")
        files[f"src/{'pkg/' if i % 2 else ''}{word(rng)}{i}.{ext}"] = "\n".join(body) + "\n"
    first_py = next(p for p in files if p.endswith(".py"))
    files[first_py] += f"print({old})\n"  # at least one file needs a change
    expected = {}
    for path, text in files.items():
        if path.endswith(".py"):
            if difficulty >= 3:
                text = text.replace(f"{old}x", "\0").replace(f"{old}_extra", "\1")
                text = text.replace(old, new).replace("\0", f"{old}x").replace("\1", f"{old}_extra")
            else:
                text = text.replace(old, new)
        expected[path] = text
    whole = (
        " Replace whole identifiers only: longer names that contain it stay."
        if difficulty >= 3
        else ""
    )
    instruction = (
        f"Rename the identifier {old} to {new} in every .py file under src/ (recursively). "
        f"Files that do not end in .py must stay unchanged.{whole}"
    )
    pattern = f"\\b{old}\\b" if difficulty >= 3 else old
    demo = (
        bash(f"grep -rn {old} src | head -n 20"),
        bash(f"find src -name '*.py' -exec sed -i 's/{pattern}/{new}/g' {{}} +"),
        bash(f"grep -rn {new} src | head -n 20"),
        submit(),
    )
    checker = CheckerScript()
    for path, text in expected.items():
        changed = text != files[path]
        checker.file_has_text(path, text, required=not changed)
    return TerminalTask(
        task_id=task_id,
        family="replace_in_files",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )


def organize_by_extension(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Move inbox files into sorted/<extension>/ (case folding, no-extension at level 3)."""
    exts = {
        1: ["txt", "csv"],
        2: ["txt", "csv", "png", "md"],
        3: ["txt", "csv", "png", "md", "log"],
    }
    n_files = {1: 6, 2: 15, 3: 30}[difficulty]
    files: dict[str, str] = {}
    targets: dict[str, str] = {}
    for i in range(n_files):
        ext = rng.choice(exts[difficulty])
        if difficulty == 3 and i % 7 == 3:
            ext = ext.upper()
        name = f"{word(rng)}{i}" + ("" if difficulty == 3 and i % 9 == 5 else f".{ext}")
        files[f"inbox/{name}"] = f"{word(rng)} {i}\n"
        folder = name.rsplit(".", 1)[1].lower() if "." in name else "none"
        targets[f"sorted/{folder}/{name}"] = files[f"inbox/{name}"]
    extra = ""
    if difficulty == 3:
        extra = (
            " Use the extension in lowercase for the directory name (a.TXT goes to "
            "sorted/txt/); files without an extension go to sorted/none/."
        )
    instruction = (
        "Move every file in inbox/ into sorted/<extension>/, keeping its name (inbox/a.csv "
        f"becomes sorted/csv/a.csv). Leave inbox/ empty but in place.{extra}"
    )
    if difficulty == 3:
        loop = (
            'for f in inbox/*; do n=$(basename "$f"); case "$n" in *.*) '
            "e=$(echo \"${n##*.}\" | tr 'A-Z' 'a-z');; *) e=none;; esac; "
            'mkdir -p "sorted/$e"; mv "$f" "sorted/$e/"; done'
        )
    else:
        loop = 'for f in inbox/*; do e="${f##*.}"; mkdir -p "sorted/$e"; mv "$f" "sorted/$e/"; done'
    demo = (bash("ls inbox"), bash(loop), bash("ls -R sorted; ls -A inbox"), submit())
    checker = CheckerScript().require(
        "inbox/ is an empty directory", '[ -d inbox ] && [ -z "$(ls -A inbox)" ]'
    )
    for path, text in targets.items():
        checker.file_has_text(path, text)
    return TerminalTask(
        task_id=task_id,
        family="organize_by_extension",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )
