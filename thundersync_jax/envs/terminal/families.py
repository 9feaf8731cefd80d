"""Task generators: each family builds a `TerminalTask` from a seeded RNG and a difficulty.

Everything is generated here (pseudo-words from syllables, synthetic logs and CSVs), so
no download is ever needed. Expected answers are computed in Python from the same data
the setup script writes, independently of the shell pipeline in the demonstration.
Difficulty grows the workspace (setup size) and adds distractors and conditions, so
episode lengths and command counts vary across tasks.
"""

from __future__ import annotations

import collections
import random

from thundersync_jax.envs.terminal.task import (
    CheckerScript,
    TerminalTask,
    bash,
    submit,
    write_files_script,
)

_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "zu", "pel", "dor", "fin", "gra", "hul", "sen")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))


def _words(rng: random.Random, n: int) -> list[str]:
    seen: list[str] = []
    while len(seen) < n:
        w = _word(rng)
        if w not in seen:
            seen.append(w)
    return seen


def _text(rng: random.Random, lines: int, vocab: list[str]) -> str:
    return "".join(" ".join(rng.choices(vocab, k=rng.randint(4, 9))) + "\n" for _ in range(lines))


def find_by_name(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """List the files with one extension in a nested tree (distractors at higher levels)."""
    ext = rng.choice(["cfg", "yaml", "ini", "conf"])
    others = ["txt", "log", "md", "py", "json"]
    n_files, depth = {1: (8, 1), 2: (25, 3), 3: (70, 4)}[difficulty]
    dirs = ["project"]
    for _ in range(depth * 3):
        dirs.append(rng.choice(dirs) + "/" + _word(rng))
    files: dict[str, str] = {}
    while len(files) < n_files:
        e = ext if rng.random() < 0.3 else rng.choice(others)
        files[f"{rng.choice(dirs)}/{_word(rng)}.{e}"] = f"{_word(rng)}\n"
    target = f"{dirs[-1]}/main.{ext}"
    files[target] = "main\n"
    if difficulty >= 2:  # names that contain the extension without ending in it
        files[f"{rng.choice(dirs)}/{_word(rng)}.{ext}.bak"] = "old\n"
        files[f"{rng.choice(dirs)}/{ext}_{_word(rng)}.txt"] = "notes\n"
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
    vocab = _words(rng, 30)
    token = f"{_word(rng).upper()}{rng.randint(10, 99)}"
    n_files = {1: 6, 2: 20, 3: 45}[difficulty]
    files = {
        f"docs/{_word(rng)}_{i}.txt": _text(rng, rng.randint(3, 12), vocab) for i in range(n_files)
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


def count_matching(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Count log lines by level and component, in one file or across several."""
    levels = ["DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"]
    components = ["db", "dbproxy", "api", "auth", "cache"]
    n_files, n_lines = {1: (1, 40), 2: (1, 200), 3: (3, 280)}[difficulty]
    component = rng.choice(["db", "api", "auth"])
    wanted_levels = {1: {"ERROR"}, 2: {"ERROR"}, 3: {"ERROR", "CRITICAL"}}[difficulty]
    files = {}
    count = 0
    for f in range(n_files):
        lines = []
        for i in range(n_lines):
            level = rng.choices(levels, weights=[3, 6, 2, 2, 1])[0]
            comp = rng.choice(components)
            lines.append(
                f"2024-03-{f + 1:02d} 10:{i // 60:02d}:{i % 60:02d} {level} {comp}: {_word(rng)}"
            )
            if level in wanted_levels and (difficulty == 1 or comp == component):
                count += 1
        files[f"logs/app{f}.log" if n_files > 1 else "logs/app.log"] = "\n".join(lines) + "\n"
    if difficulty == 1:
        what, pattern, source = "ERROR lines", "' ERROR '", "logs/app.log"
    elif difficulty == 2:
        what, pattern = f"ERROR lines from component {component}", f"' ERROR {component}: '"
        source = "logs/app.log"
    else:
        what = f"ERROR or CRITICAL lines from component {component}, over all logs/*.log files"
        pattern, source = f"-E ' (ERROR|CRITICAL) {component}: '", "logs/*.log"
    instruction = (
        f"Log lines look like '2024-03-01 10:00:00 LEVEL component: message'. Count the {what} "
        f"in {source} and write just the number to answer.txt."
    )
    demo = [bash(f"head -n 5 {source}")]
    if difficulty == 3:
        demo.append(bash("ls logs"))
    demo += [
        bash(f"cat {source} | grep -c {pattern} > answer.txt"),
        bash("cat answer.txt"),
        submit(),
    ]
    checker = CheckerScript().answer_number(count)
    return TerminalTask(
        task_id=task_id,
        family="count_matching",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=tuple(demo),
    )


def top_words(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Report the k most frequent words with their counts (sort | uniq -c)."""
    k = {1: 1, 2: 3, 3: 5}[difficulty]
    vocab = _words(rng, 12 + 4 * difficulty)
    top = vocab[:k]
    # Distinct counts for the top k, all others strictly below, so the answer is unique.
    counts = {w: 40 + 7 * (k - i) + rng.randint(0, 3) for i, w in enumerate(top)}
    for w in vocab[k:]:
        counts[w] = rng.randint(3, 36)
    tokens = [w for w, c in counts.items() for _ in range(c)]
    rng.shuffle(tokens)
    if difficulty == 3:  # mixed case, to be folded
        tokens = [w.capitalize() if rng.random() < 0.3 else w for w in tokens]
    lines = [" ".join(tokens[i : i + 10]) for i in range(0, len(tokens), 10)]
    files = {"data/words.txt": "\n".join(lines) + "\n"}
    folded = collections.Counter(t.lower() for t in tokens)
    expected = [f"{w} {c}" for w, c in folded.most_common(k)]
    case = (
        " Treat words case-insensitively and report them in lowercase." if difficulty == 3 else ""
    )
    instruction = (
        f"data/words.txt holds words separated by spaces and newlines. Write the {k} most "
        f"frequent word(s) to answer.txt, one per line as 'word count', most frequent first.{case}"
    )
    lower = "tr 'A-Z' 'a-z' < data/words.txt" if difficulty == 3 else "cat data/words.txt"
    demo = (
        bash("head -n 3 data/words.txt; wc -w data/words.txt"),
        bash(
            f"{lower} | tr -s ' ' '\\n' | grep -v '^$' | sort | uniq -c | sort -k1,1nr "
            f"| head -n {k} | awk '{{print $2, $1}}' > answer.txt"
        ),
        bash("cat answer.txt"),
        submit(),
    )
    checker = CheckerScript().answer_lines_in_order(expected)
    return TerminalTask(
        task_id=task_id,
        family="top_words",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )


def replace_in_files(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Rename an identifier in the .py files only (whole words only at level 3)."""
    vocab = _words(rng, 20)
    old, new = f"{_word(rng)}_v1", f"{_word(rng)}_v2"
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
        files[f"src/{'pkg/' if i % 2 else ''}{_word(rng)}{i}.{ext}"] = "\n".join(body) + "\n"
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
        name = f"{_word(rng)}{i}" + ("" if difficulty == 3 and i % 9 == 5 else f".{ext}")
        files[f"inbox/{name}"] = f"{_word(rng)} {i}\n"
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


def csv_sum(rng: random.Random, difficulty: int, task_id: str) -> TerminalTask:
    """Sum a CSV column under filters (cents and several files at level 3)."""
    regions, products = ["north", "south", "east", "west"], ["tea", "coffee", "cocoa"]
    region, product = rng.choice(regions), rng.choice(products)
    n_files, n_rows = {1: (1, 30), 2: (1, 120), 3: (3, 150)}[difficulty]
    total_cents = 0
    files = {}
    for f in range(n_files):
        rows = ["date,region,product,amount"]
        for i in range(n_rows):
            r, p = rng.choice(regions), rng.choice(products)
            cents = rng.randint(100, 50_000) if difficulty == 3 else 100 * rng.randint(1, 500)
            amount = f"{cents // 100}.{cents % 100:02d}" if difficulty == 3 else str(cents // 100)
            rows.append(f"2024-0{f + 1}-{i % 28 + 1:02d},{r},{p},{amount}")
            if r == region and (difficulty == 1 or p == product):
                total_cents += cents
        files[f"data/sales{f}.csv" if n_files > 1 else "data/sales.csv"] = "\n".join(rows) + "\n"
    source = "data/*.csv" if n_files > 1 else "data/sales.csv"
    cond = f'$2=="{region}"' + (f' && $3=="{product}"' if difficulty >= 2 else "")
    what = f"region {region}" + (f" and product {product}" if difficulty >= 2 else "")
    fmt = "%.2f" if difficulty == 3 else "%d"
    instruction = (
        f"{source} ({'files each with' if n_files > 1 else 'with'} a header row) lists sales as "
        f"date,region,product,amount. Write the total amount of the rows with {what} to "
        f"answer.txt{' with two decimals' if difficulty == 3 else ''}."
    )
    demo = (
        bash(f"head -n 4 {source}"),
        bash(
            f"awk -F, 'FNR > 1 && {cond} {{ s += $4 }} "
            f'END {{ printf "{fmt}\\n", s }}\' {source} > answer.txt'
        ),
        bash("cat answer.txt"),
        submit(),
    )
    checker = CheckerScript().answer_number(total_cents / 100, tolerance=0.005)
    return TerminalTask(
        task_id=task_id,
        family="csv_sum",
        difficulty=difficulty,
        instruction=instruction,
        setup_script=write_files_script(files),
        checker_script=checker.script(),
        demonstration=demo,
    )


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
