"""Git plumbing for SWE workspaces: check out base_commit, diff, apply patches.

A workspace is a plain directory (the sandbox root the agent sees) whose git
metadata lives *outside* it, in a private bare repository: the agent's
commands cannot touch the git config or hooks that these host-side git calls
read, and the workspace holds only the project's files. The private repository
shares objects with the source (`git clone --shared`), so set-up costs no copy
of the history.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

# Files that tests and interpreters leave behind; never part of a model patch.
_EXCLUDES = ("__pycache__/", "*.pyc", ".pytest_cache/", "*.egg-info/")

# Global config the user may have set must not change diff or apply output.
_GIT_CONFIG = (
    "-c",
    "core.hooksPath=/dev/null",
    # The sandbox owns the work tree (another uid); git would refuse it as "dubious".
    "-c",
    "safe.directory=*",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.external=",
    "-c",
    "color.ui=never",
    "-c",
    "core.autocrlf=false",
    "-c",
    "user.name=thundersync",
    "-c",
    "user.email=thundersync@localhost",
)


class GitError(RuntimeError):
    """A git command failed; the message holds the command and its stderr."""


def run_git(args: Sequence[str], cwd: str, stdin: str | None = None, timeout: float = 120) -> str:
    """Runs `git ARGS` and returns stdout; raises GitError with stderr on failure."""
    cmd = ["git", *_GIT_CONFIG, *args]
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        # Non-UTF-8 file content survives a diff -> apply round trip unchanged.
        encoding="utf-8",
        errors="surrogateescape",
        timeout=timeout,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"},
    )
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A checked-out tree (`path`) and its private git directory (`git_dir`) at `base_commit`."""

    path: str
    git_dir: str
    base_commit: str

    def git(self, *args: str, stdin: str | None = None) -> str:
        return run_git(
            # Literal pathspecs: a test file named "test_[x].py" is a name, not a glob.
            ["--literal-pathspecs", "--git-dir", self.git_dir, "--work-tree", self.path, *args],
            self.path,
            stdin,
        )

    def diff(self) -> str:
        """The workspace's changes against base_commit as a unified diff (new files included)."""
        self.git("add", "-A", ".")
        return self.git(
            "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", self.base_commit
        )

    def apply(self, patch: str) -> None:
        """Applies a unified diff to the tree with `git apply`; raises GitError saying why not.

        git refuses paths outside the tree or behind a symlink, so an untrusted patch
        cannot write anywhere else.
        """
        if not patch.strip():
            return
        if not patch.endswith("\n"):
            patch += "\n"
        self.git("apply", "--whitespace=nowarn", "-", stdin=patch)

    def reset_files(self, paths: Sequence[str]) -> None:
        """Restores `paths` to base_commit; removes those that do not exist there."""
        if not paths:
            return
        at_base = set(
            self.git("ls-tree", "-r", "--name-only", self.base_commit, "--", *paths).split("\n")
        )
        existing = [p for p in paths if p in at_base]
        if existing:
            self.git("checkout", self.base_commit, "--", *existing)
        for p in paths:
            if p not in at_base:
                full = os.path.join(self.path, p)
                if os.path.lexists(full) and not os.path.isdir(full):
                    os.remove(full)


def checkout(source_repo: str, base_commit: str, path: str, git_dir: str) -> Workspace:
    """Checks out `base_commit` of the local repository `source_repo` into the empty `path`.

    Args:
      source_repo: a local git repository (work tree or bare) holding base_commit.
      base_commit: a commit hash (or any rev) in source_repo.
      path: the workspace directory to fill; created if missing.
      git_dir: where the private bare repository goes (outside `path`); must not exist.
    """
    if not os.path.isdir(source_repo):
        raise GitError(f"repo_path {source_repo!r} is not a directory")
    os.makedirs(path, exist_ok=True)
    run_git(["clone", "--quiet", "--bare", "--shared", "--no-tags", source_repo, git_dir], path)
    with open(os.path.join(git_dir, "info", "exclude"), "a") as f:
        f.write("\n".join(_EXCLUDES) + "\n")
    try:
        commit = run_git(
            ["--git-dir", git_dir, "rev-parse", "--verify", base_commit + "^{commit}"], path
        )
    except GitError:
        raise GitError(f"base_commit {base_commit!r} is not a commit of {source_repo}") from None
    ws = Workspace(path=path, git_dir=git_dir, base_commit=commit.strip())
    ws.git("reset", "--quiet", "--hard", ws.base_commit)
    return ws


def mirror(repo: str, cache_dir: str, url_template: str = "https://github.com/{repo}.git") -> str:
    """A bare mirror of `repo` ("owner/name") under cache_dir, cloned once (process-safe)."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(
        re.fullmatch(r"[\w.-]+", p) and p not in (".", "..") for p in parts
    ):
        raise GitError(f"repo must look like 'owner/name', got {repo!r}")
    os.makedirs(cache_dir, exist_ok=True)
    dest = os.path.join(cache_dir, repo.replace("/", "__") + ".git")
    with open(dest + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(dest):
            url = url_template.format(repo=repo)
            shutil.rmtree(dest + ".tmp", ignore_errors=True)  # left by an interrupted clone
            run_git(["clone", "--quiet", "--mirror", url, dest + ".tmp"], cache_dir, timeout=1800)
            os.rename(dest + ".tmp", dest)
    return dest


def patched_paths(patch: str) -> list[str]:
    """Paths a unified diff touches (old and new names, not /dev/null), in first-seen order.

    A file header is a "--- " line, then a "+++ " line, then a hunk header; requiring all
    three keeps hunk lines that merely look like headers ("--- a/x" removed) out.
    """
    lines = patch.splitlines()
    paths = []
    for i in range(len(lines) - 2):
        if not (
            lines[i].startswith("--- ")
            and lines[i + 1].startswith("+++ ")
            and lines[i + 2].startswith("@@")
        ):
            continue
        for line in lines[i : i + 2]:
            name = line[4:].split("\t", 1)[0]
            if name.startswith('"') and name.endswith('"'):
                # git C-quotes unusual names; octal escapes are UTF-8 bytes.
                raw = name[1:-1].encode("utf-8").decode("unicode_escape")
                name = raw.encode("latin-1").decode("utf-8", errors="replace")
            if name.startswith(("a/", "b/")):
                paths.append(name[2:])
    return list(dict.fromkeys(paths))


def split_patch(patch: str) -> list[str]:
    """A git diff cut into one piece per file (at each "diff --git" line); a diff without
    such lines is one piece."""
    pieces = re.split(r"(?m)^(?=diff --git )", patch)
    return [p for p in pieces if p.strip()]


def restrict_patch(patch: str, prefixes: Sequence[str]) -> tuple[str, list[str]]:
    """(the part of `patch` that only touches paths under `prefixes`, the paths dropped).

    A piece whose paths cannot all be read (no file header) is dropped whole.
    """
    kept, dropped = [], []
    for piece in split_patch(patch):
        paths = patched_paths(piece)
        if paths and all(p.startswith(tuple(prefixes)) for p in paths):
            kept.append(piece)
        else:
            header = piece.splitlines()[0] if piece.strip() else ""
            dropped.extend([p for p in paths if not p.startswith(tuple(prefixes))] or [header])
    return "".join(kept), dropped


def commit_patch(ws: Workspace, patch: str, message: str) -> Workspace:
    """Applies `patch` and commits it in the workspace's private repository; returns the
    workspace based at that commit (the task's starting point: diffs and resets are
    taken against it). SWE-smith rows use it to introduce their bug into the clean tree."""
    try:
        ws.apply(patch)
    except GitError as e:
        raise GitError(f"the task's setup patch does not apply: {e}") from None
    ws.git("add", "-A", ".")
    ws.git("commit", "--quiet", "--no-verify", "--allow-empty", "-m", message)
    return dataclasses.replace(ws, base_commit=ws.git("rev-parse", "HEAD").strip())


_HUNK_HEADER = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
_SWAPPED = {
    "new file mode ": "deleted file mode ",
    "deleted file mode ": "new file mode ",
    "old mode ": "new mode ",
    "new mode ": "old mode ",
    "rename from ": "rename to ",
    "rename to ": "rename from ",
    "copy from ": "copy to ",
    "copy to ": "copy from ",
}


def reverse_patch(patch: str) -> str:
    """The unified diff that undoes `patch` (what `git apply -R` would apply).

    Hunks are read by their header counts, so a changed line that looks like a header
    stays a changed line; within each run of changes the removals come first, as git
    writes them, and a "\\ No newline" marker stays with its line. Binary diffs cannot be
    reversed from their text: ValueError.
    """
    out: list[str] = []
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _HUNK_HEADER.match(line)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
            i = _reverse_hunk(lines, i + 1, m, out)
            continue
        out.append(_reverse_header(line, lines, i))
        i += 1
    return "\n".join(out) + ("\n" if patch.endswith("\n") else "")


def _reverse_header(line: str, lines: list[str], i: int) -> str:
    if line.startswith(("GIT binary patch", "Binary files ")):
        raise ValueError("a binary diff cannot be reversed from its text")
    if line.startswith("diff --git "):
        m = re.fullmatch(r"diff --git (\S+) (\S+)", line)
        return f"diff --git a/{m.group(2)[2:]} b/{m.group(1)[2:]}" if m else line
    if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
        return "--- " + _side(lines[i + 1][4:], "a/")
    if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
        return "+++ " + _side(lines[i - 1][4:], "b/")
    if line.startswith("index "):
        m = re.fullmatch(r"index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)", line)
        return f"index {m.group(2)}..{m.group(1)}{m.group(3)}" if m else line
    for prefix, swapped in _SWAPPED.items():
        if line.startswith(prefix):
            return swapped + line[len(prefix) :]
    return line


def _side(name: str, prefix: str) -> str:
    return name if name.startswith("/dev/null") else prefix + name[2:]


def _reverse_hunk(lines: list[str], i: int, header: re.Match, out: list[str]) -> int:
    """Appends the reversed body of the hunk starting at lines[i]; returns where it ends."""
    count = lambda spec: int(spec.split(",")[1]) if "," in spec else 1  # noqa: E731
    old_left, new_left = count(header.group(1)), count(header.group(2))
    removed: list[str] = []  # the reversed hunk's removals (were additions)
    added: list[str] = []

    def flush() -> None:
        out.extend(removed)
        out.extend(added)
        removed.clear()
        added.clear()

    last: list[str] | None = None
    while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
        line = lines[i]
        i += 1
        if line.startswith("\\"):
            (last if last is not None else out).append(line)
            continue
        tag, text = (line[:1], line[1:]) if line else (" ", "")
        if tag == "-":
            added.append("+" + text)
            old_left, last = old_left - 1, added
        elif tag == "+":
            removed.append("-" + text)
            new_left, last = new_left - 1, removed
        else:
            flush()
            out.append(" " + text)
            old_left, new_left, last = old_left - 1, new_left - 1, out
    flush()
    return i


def snapshot(tree: str, dest: str) -> str:
    """A bare repository at `dest` whose one commit holds the files of `tree` (a
    repository shipped without its .git, as some images do); made once (process-safe)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(dest):
            tmp = dest + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            run_git(["init", "--quiet", "--bare", tmp], os.path.dirname(dest))
            with open(os.path.join(tmp, "info", "exclude"), "a") as f:
                f.write("\n".join(_EXCLUDES) + "\n")
            where = ["--git-dir", tmp, "--work-tree", tree]
            run_git([*where, "add", "-A", "."], tree, timeout=1800)
            run_git([*where, "commit", "--quiet", "--no-verify", "-m", "snapshot"], tree)
            os.rename(tmp, dest)
    return dest
