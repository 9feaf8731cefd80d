"""The file tools of SWE tasks: view(path) and edit(path, old, new), plus output capping.

They run on the host but only ever touch files inside the workspace: every
path is resolved (symlinks included) and refused when it leaves the root.
Errors come back as observation text starting with "error:", never as
exceptions, so a model's bad call costs one turn and nothing else.
"""

from __future__ import annotations

import os
import re

from thundersync_jax.envs.base import ToolSpec

TOOL_SPECS = (
    ToolSpec("bash", "Run a shell command in the repository.", {"command": "the command"}),
    ToolSpec("view", "Show a file with line numbers.", {"path": "file path"}),
    ToolSpec(
        "edit",
        "Replace the exact text old with new in a file (old must occur once).",
        {"path": "file path", "old": "text to replace", "new": "replacement text"},
    ),
    ToolSpec("submit", "Finish; your changes are tested.", {}),
)


class ToolError(ValueError):
    """A tool call the agent got wrong; the message is shown to the agent."""


def resolve(root: str, path: object, box_root: str = "") -> tuple[str, str]:
    """(host path, path relative to root) of `path`, refused if it is outside `root`.

    Args:
      root: the workspace directory on the host.
      path: relative to root, or absolute inside the box (under `box_root`) or the host root.
      box_root: where the workspace appears inside the sandbox, if different.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError(f"path must be a non-empty string, got {path!r}")
    path = path.strip()
    real_root = os.path.realpath(root)
    if os.path.isabs(path):
        for prefix in (box_root, root, real_root):
            if prefix and (path == prefix or path.startswith(prefix.rstrip("/") + "/")):
                path = os.path.relpath(path, prefix)
                break
        else:
            raise ToolError(f"{path} is outside the repository; use a path relative to it")
    full = os.path.realpath(os.path.join(real_root, path))
    if full != real_root and not full.startswith(real_root + "/"):
        raise ToolError(f"{path} is outside the repository")
    return full, os.path.relpath(full, real_root)


def view(root: str, path: object, max_bytes: int = 4000, box_root: str = "") -> str:
    """A file's text with line numbers (capped at max_bytes), or a directory listing."""
    try:
        full, rel = resolve(root, path, box_root)
        if os.path.isdir(full):
            names = sorted(os.listdir(full))
            entries = [n + "/" if os.path.isdir(os.path.join(full, n)) else n for n in names]
            return cap("\n".join(entries) or "(empty directory)", max_bytes)
        if not os.path.isfile(full):
            raise ToolError(f"no such file: {rel}")
        with open(full, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except (ToolError, OSError) as e:
        return f"error: {e}"
    if not lines:
        return f"({rel} is empty)"
    width = len(str(len(lines)))
    out, size = [], 0
    for n, line in enumerate(lines, 1):
        numbered = f"{n:>{width}} {line}"
        if size + len(numbered) + 1 > max_bytes and out:
            out.append(
                f"[lines {n}-{len(lines)} not shown; use bash: sed -n '{n},{n + 40}p' {rel}]"
            )
            break
        out.append(numbered)
        size += len(numbered) + 1
    return "\n".join(out)


def edit(root: str, path: object, old: object, new: object, box_root: str = "") -> str:
    """Replaces the one occurrence of `old` with `new`; an error text when there is not one."""
    try:
        full, rel = resolve(root, path, box_root)
        if not isinstance(old, str) or not isinstance(new, str):
            raise ToolError("old and new must be strings")
        if not old:
            raise ToolError("old is empty; give the exact text to replace")
        if old == new:
            raise ToolError("old and new are the same; nothing to change")
        if not os.path.isfile(full):
            raise ToolError(f"no such file: {rel}")
        with open(full, encoding="utf-8", newline="") as f:
            text = f.read()
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old text not found in {rel}")
        if count > 1:
            lines = _lines_of(text, old)
            raise ToolError(
                f"old text occurs {count} times in {rel} (lines {lines}); "
                "include more lines to make it unique"
            )
        start_line = text[: text.index(old)].count("\n") + 1
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(text.replace(old, new, 1))
    except UnicodeDecodeError:
        return f"error: {path} is not a UTF-8 text file"
    except (ToolError, OSError) as e:
        return f"error: {e}"
    return f"edited {rel} line {start_line}"


def _lines_of(text: str, needle: str) -> str:
    """Comma-separated 1-based line numbers where `needle` starts."""
    lines, i = [], text.find(needle)
    while i >= 0:
        lines.append(str(text[:i].count("\n") + 1))
        i = text.find(needle, i + 1)
    return ", ".join(lines)


def cap(text: str, max_bytes: int) -> str:
    """`text` cut to about max_bytes, keeping its head and tail (test summaries end there)."""
    if len(text) <= max_bytes:
        return text
    marker = f"\n[... {len(text) - max_bytes} chars cut ...]\n"
    head = max(0, (max_bytes - len(marker)) // 3)
    tail = max(0, max_bytes - len(marker) - head)
    return text[:head] + marker + (text[-tail:] if tail else "")


# pytest ends with "4 passed in 0.03s" (and "(0:01:02)" past a minute): wall times that
# differ between runs of the same command. Keyed sampling promises the same trajectory
# for the same (seed, step, prompt, member), and the warm start caches on its
# transcripts' bytes, so observations must not carry timings.
_PYTEST_DURATION = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?")


def without_durations(text: str) -> str:
    """Drops pytest's run durations from command output (they would make it nondeterministic)."""
    return _PYTEST_DURATION.sub("", text)
