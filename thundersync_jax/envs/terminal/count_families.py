"""Task families that count or sum: log lines by level, word frequencies, CSV totals."""

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
from thundersync_jax.envs.terminal.words import word, words


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
                f"2024-03-{f + 1:02d} 10:{i // 60:02d}:{i % 60:02d} {level} {comp}: {word(rng)}"
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
    vocab = words(rng, 12 + 4 * difficulty)
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
