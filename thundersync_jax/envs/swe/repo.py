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
