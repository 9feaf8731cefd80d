"""Workspace git plumbing: checkout, diff, apply, reset of test files (no sandbox)."""

import subprocess

import pytest

from thundersync_jax.envs.swe import repo


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "tests" / "test_[x].py").write_text("A = 1\n")
    (src / "tests" / "test_x.py").write_text("B = 1\n")
    (src / "latin.txt").write_bytes(b"caf\xe9\n")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for cmd in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *cmd], cwd=src, env=env, check=True)
    return src


def test_diff_apply_and_reset(source, tmp_path):
    ws = repo.checkout(str(source), "HEAD", str(tmp_path / "ws"), str(tmp_path / "git"))
    root = tmp_path / "ws"
    assert (root / "tests" / "test_[x].py").read_text() == "A = 1\n"
    assert not (root / ".git").exists()  # git metadata stays outside the workspace
    (root / "tests" / "test_[x].py").write_text("A = 2\n")
    (root / "tests" / "test_x.py").write_text("B = 2\n")
    (root / "tests" / "new.py").write_text("C = 1\n")
    (root / "latin.txt").write_bytes(b"caf\xe9!\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    patch = ws.diff()
    assert repo.patched_paths(patch) == [
        "latin.txt",
        "tests/new.py",
        "tests/test_[x].py",
        "tests/test_x.py",
    ]  # no __pycache__

    ws.reset_files(["tests/test_[x].py", "tests/new.py"])
    assert (root / "tests" / "test_[x].py").read_text() == "A = 1\n"  # a name, not a glob
    assert (root / "tests" / "test_x.py").read_text() == "B = 2\n"
    assert not (root / "tests" / "new.py").exists()

    fresh = repo.checkout(str(source), "HEAD", str(tmp_path / "ws2"), str(tmp_path / "git2"))
    fresh.apply(patch)
    assert (tmp_path / "ws2" / "latin.txt").read_bytes() == b"caf\xe9!\n"
    assert (tmp_path / "ws2" / "tests" / "new.py").read_text() == "C = 1\n"
    with pytest.raises(repo.GitError, match="tests/test_x.py"):
        fresh.apply(patch)  # already applied: the context no longer matches
    escape = "--- a/../evil\n+++ b/../evil\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(repo.GitError):
        fresh.apply(escape)
    assert not (tmp_path / "evil").exists()
