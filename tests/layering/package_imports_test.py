"""The package's walls, read from its source with `ast` (docs/design.md, "Layers").

import-linter (`make lint`, and `test_import_linter_contracts_hold` below) checks the layer
order in pyproject.toml; it cannot say "no import cycle between modules", "no other
package's `_private` module or name" or "no `jax._src`", so those are checked here, together
with the length of every function.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import thundersync_jax

PACKAGE = pathlib.Path(thundersync_jax.__file__).parent
ROOT = PACKAGE.parent
MAX_FUNCTION_LINES = 80  # a function of this many lines or more is split (STYLE)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, tree: ast.Module):
    """(imported module, imported name or None, line, at module level) for every import."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    top_level = {id(n) for n in _module_level_nodes(tree.body)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                yield base, alias.name, node.lineno, id(node) in top_level


def _module_level_nodes(body):
    """Statements that run on import (not inside a function; `if TYPE_CHECKING` excluded)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            children = node.orelse
        else:
            fields = ("body", "orelse", "finalbody", "handlers")
            children = [c for f in fields for c in getattr(node, f, None) or []]
        yield from _module_level_nodes(children)


def _graph_and_findings():
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    anywhere: dict[str, set[str]] = {m: set() for m in modules}  # imports inside functions too
    private, internals = [], []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, imported, line, top in _imports(name, path, tree):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target == "jax._src" or target.startswith("jax._src."):
                internals.append(where)
            if not target.startswith("thundersync_jax"):
                continue
            full = f"{target}.{imported}" if f"{target}.{imported}" in modules else target
            if full in modules and full != name:
                anywhere[name].add(full)
                if top:
                    edges[name].add(full)
            source_pkg, target_parts = name.split(".")[:2], full.split(".")
            if target_parts[:2] == source_pkg or len(target_parts) < 2:
                continue
            named_private = full == target and imported and imported.startswith("_")
            if any(p.startswith("_") for p in target_parts[2:]) or named_private:
                private.append(f"{where} imports {full}{'.' + imported if named_private else ''}")
    return edges, anywhere, private, internals


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    edges, anywhere, _, _ = _graph_and_findings()
    assert sum(len(e) for e in edges.values()) > 100  # the walk really saw the imports
    assert _cycles(edges) == []
    # Lazy imports inside functions do not hide a cycle either.
    assert _cycles(anywhere) == []


def test_the_cycle_check_finds_a_cycle():
    # Guards the test above against a graph walk that could never report one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_package_imports_another_packages_private_modules_or_names():
    _, _, private, _ = _graph_and_findings()
    assert private == []


def test_no_jax_internals():
    _, _, _, internals = _graph_and_findings()
    assert internals == []


def test_no_function_over_the_limit():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == []


def test_import_linter_contracts_hold():
    """The layer contracts of pyproject.toml (about a second)."""
    exe = shutil.which("lint-imports") or os.path.join(
        os.path.dirname(sys.executable), "lint-imports"
    )
    if not os.path.exists(exe):
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout
