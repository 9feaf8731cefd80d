"""Per-test statuses from pytest's `-rA` short summary.

Only the lines after the last "short test summary info" banner are read, so a
test that prints "PASSED x" to its captured output cannot fake a result. The
ids we look for are known in advance, which makes matching exact even for
parametrized ids holding spaces, brackets or " - ".
"""

from __future__ import annotations

from collections.abc import Iterable

PASSED, FAILED, ERROR = "PASSED", "FAILED", "ERROR"

# Summary words and the status each maps to (xfail counts as passing, as in SWE-bench).
_WORDS = {
    "PASSED": PASSED,
    "XFAIL": PASSED,
    "XPASS": PASSED,
    "FAILED": FAILED,
    "ERROR": ERROR,
}
# When one test reports twice (a teardown error after a pass), the worse wins.
_RANK = {PASSED: 0, FAILED: 1, ERROR: 2}
_BANNER = "short test summary info"


def summary_lines(output: str) -> list[str]:
    """The lines after the last short-test-summary banner (empty if there is none)."""
    lines = output.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith("=") and _BANNER in line:
            start = i + 1
    return [] if start is None else lines[start:]


def parse_statuses(output: str, test_ids: Iterable[str]) -> dict[str, str]:
    """Maps each of `test_ids` that pytest reported to PASSED, FAILED or ERROR.

    Ids absent from the report are absent from the result. A reported id that
    is a path-suffix of a wanted id also matches (pytest picked a deeper rootdir).

    Args:
      output: the combined stdout of a pytest run with `-rA`.
      test_ids: the node ids we want, e.g. "tests/test_x.py::TestC::test_m[a b]".
    """
    wanted = list(dict.fromkeys(test_ids))
    with_space = [t for t in wanted if " " in t]
    exact = set(wanted)
    statuses: dict[str, str] = {}
    for line in summary_lines(output):
        word, _, rest = line.partition(" ")
        status = _WORDS.get(word)
        if status is None or not rest:
            continue
        test_id = _match(rest, exact, with_space) or _match_suffix(rest, wanted)
        if test_id is None:
            continue
        old = statuses.get(test_id)
        if old is None or _RANK[status] > _RANK[old]:
            statuses[test_id] = status
    return statuses


def _match(rest: str, exact: set[str], with_space: list[str]) -> str | None:
    """The wanted id that `rest` (a summary line minus its status word) starts with."""
    head = rest.split(" ", 1)[0]
    if head in exact:
        return head
    for t in with_space:
        if rest == t or rest.startswith(t + " "):
            return t
    return None


def _match_suffix(rest: str, wanted: list[str]) -> str | None:
    """The wanted id whose path, minus leading directories, is the reported id."""
    for t in wanted:
        path, sep, name = t.partition("::")
        parts = path.split("/")
        for k in range(1, len(parts)):
            tail = "/".join(parts[k:]) + sep + name
            if rest == tail or rest.startswith(tail + " "):
                return t
    return None
