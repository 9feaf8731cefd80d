"""The docs name what really exists: files, functions and metric names of this tree.

design.md and metrics.md describe the one-loop architecture of issue 13 (`train.py`,
`algorithms/`); the checks that need those files run once they are in the tree.
"""

import ast
import pathlib
import re

import pytest

from thundersync_jax import metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout these tests belong to
DOCS = ROOT / "docs"
ONE_LOOP_TREE = (ROOT / "thundersync_jax" / "train.py").exists()
needs_one_loop = pytest.mark.skipif(
    not ONE_LOOP_TREE, reason="the docs describe train.py/algorithms (issue 13), not in this tree"
)

# `path/to/file.py` or `path/to/file.py:name` (name may be Class.method) inside backticks.
_PATH_REF = re.compile(
    r"`((?:thundersync_jax|configs|experiments|tests|notebooks|docs)/[\w./-]*)(?::([\w.]+))?`"
)
# | `metric_name` | unit | meaning |
_METRIC_ROW = re.compile(r"^\| `([a-z][a-z0-9_]*)` \| ([^|]+) \| (.+) \|$", re.M)

# The names DESIGN §6 and issue 13 promise in every run's metrics.jsonl.
PROMISED_METRICS = {
    "step", "step_time_s", "rollout_time_s", "learner_busy_s", "learner_idle_frac", "tail_s",
    "publish_s", "max_policy_lag", "mean_policy_lag", "mixed_groups", "open_groups_peak",
    "accum_bytes_peak", "reward_mean", "tokens", "compiles",
}  # fmt: skip


def _read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _path_refs(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1).rstrip("."), m.group(2)) for m in _PATH_REF.finditer(text)]


def _defines(path: pathlib.Path, dotted: str) -> bool:
    """Whether the Python file defines `dotted` (a top-level name, or Class.member)."""
    scope = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = None
        for node in scope:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == part:
                    found = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        scope = getattr(found, "body", [])
    return True


def _metric_rows() -> dict[str, tuple[str, str]]:
    rows = _METRIC_ROW.findall(_read("metrics.md"))
    names = [r[0] for r in rows]
    assert len(names) == len(set(names)), f"metrics documented twice: {names}"
    return {name: (unit.strip(), meaning.strip()) for name, unit, meaning in rows}


@pytest.mark.parametrize(
    "name,min_words", [("design.md", 1500), ("metrics.md", 700)], ids=["design", "metrics"]
)
def test_docs_exist_and_are_substantive(name, min_words):
    words = len(_read(name).split())
    assert words >= min_words, f"docs/{name} has {words} words"


def test_design_answers_a_newcomers_questions():
    headings = [h.lower() for h in re.findall(r"^#+ (.+)$", _read("design.md"), re.M)]
    for topic in ("process", "one step", "decision", "algorithm", "schedule", "task family"):
        assert any(topic in h for h in headings), f"no design.md heading about {topic!r}"


def test_the_check_below_sees_bad_references():
    # Guards the reference checks against a pattern that matches nothing.
    refs = _path_refs("see `thundersync_jax/metrics/_writer.py:MetricsWriter.write` and `x`")
    assert refs == [("thundersync_jax/metrics/_writer.py", "MetricsWriter.write")]
    assert _defines(ROOT / refs[0][0], refs[0][1])
    assert not _defines(ROOT / refs[0][0], "MetricsWriter.no_such_method")


@needs_one_loop
@pytest.mark.parametrize("name", ["design.md", "metrics.md"])
def test_every_file_and_function_a_doc_names_exists(name):
    refs = _path_refs(_read(name))
    assert len(refs) >= (25 if name == "design.md" else 5), f"docs/{name} names few files"
    missing = [p for p, _ in refs if not (ROOT / p).exists()]
    assert not missing, f"docs/{name} names files that do not exist: {missing}"
    undefined = [f"{p}:{d}" for p, d in refs if d and not _defines(ROOT / p, d)]
    assert not undefined, f"docs/{name} names functions that do not exist: {undefined}"


def test_every_metrics_row_has_a_unit_and_a_meaning():
    rows = _metric_rows()
    assert len(rows) >= len(PROMISED_METRICS)
    for name, (unit, meaning) in rows.items():
        assert unit and len(meaning.split()) >= 5, f"{name}: unit {unit!r}, meaning {meaning!r}"


def test_promised_and_timeline_metrics_are_documented():
    hand = metrics.Timeline(start_s=0.0)
    hand.record(metrics.ROLLOUT, 0.0, 2.0, group=0, member=0)
    hand.record(metrics.CHUNK, 2.0, 3.0, group=0, ids=(0,))
    hand.record(metrics.OPT, 3.0, 3.5)
    hand.record(metrics.PUBLISH, 3.5, 4.0)
    written = set(metrics.step_metrics(hand)) | PROMISED_METRICS
    assert written - set(_metric_rows()) == set()


@needs_one_loop
def test_every_documented_metric_is_written_somewhere_in_the_package():
    source = "\n".join(p.read_text(encoding="utf-8") for p in ROOT.glob("thundersync_jax/**/*.py"))
    unwritten = [
        name for name in _metric_rows() if not re.search(rf"""["']{name}["']|\b{name}=""", source)
    ]
    assert not unwritten, f"docs/metrics.md documents metrics no code writes: {unwritten}"


def _keywords_of_metric_dicts(paths) -> set[str]:
    """Keyword names of `x.update(k=...)` and `dict(k=...)` calls: how the loop and the
    algorithms assemble a step's metrics."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "update") or (
                isinstance(f, ast.Name) and f.id == "dict"
            ):
                names.update(k.arg for k in node.keywords if k.arg)
    return names


@needs_one_loop
def test_every_metric_the_loop_and_algorithms_write_is_documented():
    pkg = ROOT / "thundersync_jax"
    written = _keywords_of_metric_dicts(
        [pkg / "train.py", pkg / "schedule" / "batch_tally.py", *(pkg / "algorithms").glob("*.py")]
    )
    # Guards against a change of style that would leave nothing to compare.
    assert {"step", "reward_mean", "mixed_groups", "grad_norm"} <= written
    assert written - set(_metric_rows()) == set()


def test_readme_links_the_docs_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Docs", 1)
    assert len(section) == 2, "README has no '## Docs' section"
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", section[1].split("\n## ", 1)[0])
    assert {"docs/design.md", "docs/metrics.md", "docs/accumulators.md"} <= set(links)
    present = [link for link in links if (ROOT / link).exists()]
    assert "docs/design.md" in present and "docs/metrics.md" in present
