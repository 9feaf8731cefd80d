"""mini-SWE: small generated Python packages with an injected bug, in SWE-bench format.

Each task is a package `p/` of two or three short modules (string utils,
arithmetic, list processing, parsing; see mini_swe_library/) with tests,
committed to a local git repository at the buggy state. The gold patch undoes
the bug; the test patch adds a second, hidden test of each buggy function.
Everything is deterministic from (seed, index, difficulty) and kept short for
a byte-level model with a ~1.5 kB context: terse statements, files of a few
hundred bytes, and pytest configured (pytest.ini, COLUMNS=40) for compact output.

Difficulty:
  easy    one one-token bug; the statement names its file.
  medium  one one-token bug; the statement names only the failing call.
  hard    two bugs in two functions (a two-line fix in one file, or two files).

Some suites also sleep in an extra test, and harder tasks need more turns, so
episode durations are naturally uneven, as in real agentic RL.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.base import ToolCall
from thundersync_jax.envs.swe.instance import SweInstance
from thundersync_jax.envs.swe.mini_swe_library import MODULES, Bug, Func

DIFFICULTIES = ("easy", "medium", "hard")
PACKAGE = "p"
TEST_CMD = "python -m pytest"
# Compact pytest output; the verifier's own flags (-rA, ids) are appended after these.
PYTEST_INI = (
    "[pytest]\naddopts = -q --tb=line -rN -p no:cacheprovider\nconsole_output_style = classic\n"
)
# pytest's multi-line assertion diffs ("Use -v to get more diff") cost a tiny model's
# context more than they tell it: one line per failing comparison instead.
CONFTEST = (
    'def pytest_assertrepr_compare(op, left, right):\n    return [f"{left!r} {op} {right!r}"]\n'
)
# Plugin autoloading would import every plugin of the host interpreter (seconds);
# COLUMNS keeps pytest's banners short.
TASK_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "40"}
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "mini-swe",
    "GIT_AUTHOR_EMAIL": "mini-swe@localhost",
    "GIT_COMMITTER_NAME": "mini-swe",
    "GIT_COMMITTER_EMAIL": "mini-swe@localhost",
    # Fixed dates make base_commit a function of the content only.
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
_CHECKS_PER_TEST = 3
# Two functions per module keeps a file view near 250 bytes: a hard task's whole
# demonstration (two views, two test runs) then fits a 1.5 kB context.
_FUNCS_PER_MODULE = 2
# Any change to the generator or its library changes the cache key, so stale cached
# tasks (older statements, demonstrations) are regenerated rather than reused. The library
# enters by value (its records' repr), whatever files it is split into.
_FORMAT_VERSION = hashlib.sha256(
    pathlib.Path(__file__).read_bytes() + repr(sorted(MODULES.items())).encode()
).hexdigest()


def failing_checks(func: Func, bug: Bug | None) -> list[tuple[str, str]]:
    """The checks of `func` that fail once `bug` is injected (None: the correct code).

    Runs our own library code in-process; a check fails when its call raises or
    returns something unequal to the expected value.
    """
    source = func.source if bug is None else inject(func, bug)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{func.name}>", "exec"), namespace)
    failing = []
    for call, expected in func.checks:
        try:
            ok = eval(call, namespace) == eval(expected, {})
        except Exception:
            ok = False
        if not ok:
            failing.append((call, expected))
    return failing


def inject(func: Func, bug: Bug) -> str:
    """`func`'s source with `bug` injected; the fixed text must occur exactly once."""
    count = func.source.count(bug.fixed)
    if count != 1:
        raise ValueError(f"bug {bug.fixed!r} occurs {count} times in {func.name}; must be once")
    return func.source.replace(bug.fixed, bug.buggy)


def generate(
    num_tasks: int,
    seed: int,
    cache_dir: str,
    difficulty: str | Sequence[str] = "easy",
    max_sleep_s: float = 0.5,
) -> list[SweInstance]:
    """`num_tasks` instances; task i has difficulty `difficulty[i % len]` (a name = all alike).

    Args:
      num_tasks: how many tasks.
      seed: the task set's seed; (seed, i, difficulty) fixes task i completely.
      cache_dir: where the per-task git repositories are kept (reused when present).
      difficulty: "easy", "medium", "hard", or a sequence of them to cycle through.
      max_sleep_s: the longest sleep a suite's extra slow test may add (0 = none).
    """
    levels = (difficulty,) if isinstance(difficulty, str) else tuple(difficulty)
    return [
        make_instance(seed, i, levels[i % len(levels)], cache_dir, max_sleep_s)
        for i in range(num_tasks)
    ]


def make_instance(
    seed: int, index: int, difficulty: str, cache_dir: str, max_sleep_s: float = 0.5
) -> SweInstance:
    """Task `index` of the set `seed` at `difficulty`, with its git repository under cache_dir."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    instance_id = f"mini-{difficulty}-{seed}-{index}"
    record_path = os.path.join(cache_dir, instance_id + ".json")
    spec = _design(random.Random(f"mini-swe/{seed}/{index}/{difficulty}"), difficulty, max_sleep_s)
    # The library and file formats are part of the key: editing them regenerates the cache.
    spec_key = json.dumps([spec, _FORMAT_VERSION], sort_keys=True)
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
        if record.get("mini_swe_spec") == spec_key and os.path.isdir(record["repo_path"]):
            return SweInstance.from_dict(record)
    record = _build(instance_id, spec, os.path.join(cache_dir, instance_id))
    record["mini_swe_spec"] = spec_key
    tmp = record_path + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, record_path)
    return SweInstance.from_dict(record)


def _design(rng: random.Random, difficulty: str, max_sleep_s: float) -> dict[str, Any]:
    """Chooses modules, functions, bugs and the visible/hidden split of failing checks."""
    modules = rng.sample(sorted(MODULES), rng.choice([2, 3]))
    chosen = {m: rng.sample(range(len(MODULES[m])), _FUNCS_PER_MODULE) for m in modules}
    candidates = [(m, f) for m in modules for f in chosen[m]]
    num_bugs = 2 if difficulty == "hard" else 1
    targets = rng.sample(candidates, num_bugs)
    bugs = []
    for module, fidx in targets:
        func = MODULES[module][fidx]
        bidx = rng.randrange(len(func.bugs))
        failing = failing_checks(func, func.bugs[bidx])
        shown = rng.randrange(len(failing))
        bugs.append({"module": module, "func": fidx, "bug": bidx, "shown": shown})
    sleep_s = 0.0
    if max_sleep_s > 0 and rng.random() < 0.5:
        sleep_s = round(rng.uniform(0.05, max_sleep_s), 2)
    return {"difficulty": difficulty, "modules": chosen, "bugs": bugs, "sleep_s": sleep_s}


def _assert_line(call: str, expected: str) -> str:
    return f"    assert {call} == {expected}\n"


def _build(instance_id: str, spec: dict[str, Any], repo_dir: str) -> dict[str, Any]:
    """Writes the repository (one commit = the buggy state) and returns the SWE-bench record."""
    bugs_by_func = {(b["module"], b["func"]): b for b in spec["bugs"]}
    buggy_files, fixed_files, hidden_tests = {}, {}, {}
    problems, f2p, p2p, demo_edits = [], [], [], []
    for module, fidxs in spec["modules"].items():
        path, test_path = f"{PACKAGE}/{module}.py", f"tests/test_{module}.py"
        funcs = [MODULES[module][i] for i in fidxs]
        names = sorted(f.name for f in funcs)
        tests = f"from {PACKAGE}.{module} import {', '.join(names)}\n"
        fixed_src, buggy_src, hidden = [], [], ""
        for fidx, func in zip(fidxs, funcs, strict=True):
            fixed_src.append(func.source)
            test = f"\n\ndef test_{func.name}():\n"
            b = bugs_by_func.get((module, fidx))
            if b is None:
                buggy_src.append(func.source)
                test += "".join(_assert_line(*c) for c in func.checks[:_CHECKS_PER_TEST])
                p2p.append(f"{test_path}::test_{func.name}")
            else:
                bug = func.bugs[b["bug"]]
                buggy_src.append(inject(func, bug))
                failing = failing_checks(func, bug)
                shown = failing[b["shown"]]
                rest = [c for c in failing if c != shown]
                passing = [c for c in func.checks if c not in failing]
                test += "".join(_assert_line(*c) for c in [shown, *passing[:1]])
                hidden += f"\n\ndef test_{func.name}_2():\n"
                hidden += "".join(_assert_line(*c) for c in [*rest[:2], *passing[1:2]])
                f2p += [f"{test_path}::test_{func.name}", f"{test_path}::test_{func.name}_2"]
                problems.append((path, shown))
                demo_edits.append((path, func, bug))
            tests += test
        fixed_files[path] = "\n\n".join(fixed_src)
        buggy_files[path] = "\n\n".join(buggy_src)
        buggy_files[test_path] = tests
        if hidden:
            hidden_tests[test_path] = tests + hidden
    buggy_files[f"{PACKAGE}/__init__.py"] = ""
    buggy_files["pytest.ini"] = PYTEST_INI
    buggy_files["conftest.py"] = CONFTEST
    if spec["sleep_s"]:
        buggy_files["tests/test_slow.py"] = (
            f"import time\n\n\ndef test_wait():\n    time.sleep({spec['sleep_s']})\n"
        )
        p2p.append("tests/test_slow.py::test_wait")

    base_commit, patch, test_patch = _commit_and_diff(
        repo_dir, buggy_files, fixed_files, hidden_tests
    )
    demo = _demonstration(buggy_files, demo_edits)
    return {
        "instance_id": instance_id,
        "repo": f"mini-swe/{instance_id}",
        "base_commit": base_commit,
        "problem_statement": _statement(spec["difficulty"], problems),
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "repo_path": repo_dir,
        "env": dict(TASK_ENV),
        "test_cmd": TEST_CMD,
        "difficulty": spec["difficulty"],
        # The verifier scores only changes to the package, never to tests or pytest config.
        "editable_paths": [f"{PACKAGE}/"],
        "demonstration": [{"name": c.name, "arguments": c.arguments} for c in demo],
    }


def _statement(difficulty: str, problems: list[tuple[str, tuple[str, str]]]) -> str:
    if difficulty == "easy":
        path, (call, expected) = problems[0]
        return f"Fix {path}: {call} should be {expected}."
    if difficulty == "medium":
        _, (call, expected) = problems[0]
        return f"{call} should be {expected}. Fix the bug."
    wants = "; ".join(f"{call} should be {expected}" for _, (call, expected) in problems)
    return f"Two bugs: {wants}."


def _demonstration(files: dict[str, str], edits: list[tuple[str, Func, Bug]]) -> list[ToolCall]:
    """Run tests, view each buggy file, edit the gold fix in, re-run, submit.

    The file to open is named by the statement (easy) or, through the failing test's
    file tests/test_M.py, by the test output (medium, hard): p/M.py.
    """
    calls = [ToolCall("bash", {"command": TEST_CMD})]
    viewed = set()
    text = dict(files)
    for path, func, bug in edits:
        if path not in viewed:
            calls.append(ToolCall("view", {"path": path}))
            viewed.add(path)
        old, new = _unique_edit(text[path], func, bug)
        text[path] = text[path].replace(old, new, 1)
        calls.append(ToolCall("edit", {"path": path, "old": old, "new": new}))
    calls += [ToolCall("bash", {"command": TEST_CMD}), ToolCall("submit", {})]
    return calls


def _unique_edit(text: str, func: Func, bug: Bug) -> tuple[str, str]:
    """The shortest (old, new) around the bug whose `old` occurs once in `text`: the
    mutated fragment itself, else its whole line, else that line with the lines above."""
    if text.count(bug.buggy) == 1:
        return bug.buggy, bug.fixed
    buggy_func = inject(func, bug)
    fixed_lines, buggy_lines = func.source.splitlines(), buggy_func.splitlines()
    line = next(i for i, (a, b) in enumerate(zip(fixed_lines, buggy_lines, strict=True)) if a != b)
    for lo in range(line, -1, -1):
        for old, new in (
            (buggy_lines[line].strip(), fixed_lines[line].strip()),
            ("\n".join(buggy_lines[lo : line + 1]), "\n".join(fixed_lines[lo : line + 1])),
        ):
            if text.count(old) == 1:
                return old, new
    raise ValueError(f"no unique edit for the bug in {func.name}")


def _git(repo_dir: str, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", *args],
        cwd=repo_dir,
        capture_output=True,
        text=True,
        env={**os.environ, **_GIT_ENV},
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo_dir}: {proc.stderr.strip()}")
    return proc.stdout


def _write(root: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def _commit_and_diff(
    repo_dir: str, buggy: dict[str, str], fixed: dict[str, str], tests: dict[str, str]
) -> tuple[str, str, str]:
    """Commits `buggy` as the only commit; returns (base_commit, gold patch, test patch)."""
    parent = os.path.dirname(repo_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
    try:
        _git(tmp, "init", "-q", "-b", "main")
        _write(tmp, buggy)
        _git(tmp, "add", "-A")
        _git(tmp, "commit", "-q", "-m", "mini-swe task")
        base_commit = _git(tmp, "rev-parse", "HEAD").strip()
        diffs = []
        for changes in (fixed, tests):
            _write(tmp, changes)
            diffs.append(_git(tmp, "diff", "--no-color", "--no-ext-diff"))
            _git(tmp, "checkout", "-q", "--", ".")
        if os.path.isdir(repo_dir):
            shutil.rmtree(repo_dir)
        os.replace(tmp, repo_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base_commit, diffs[0], diffs[1]


def demonstration(instance: SweInstance) -> list[ToolCall]:
    """The scripted solution stored with a mini-SWE instance."""
    return [ToolCall(c["name"], dict(c["arguments"])) for c in instance.extra["demonstration"]]
