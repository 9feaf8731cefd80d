"""view/edit tools, output capping, pytest summary parsing and patch parsing (no sandbox)."""

import os

import pytest

from thundersync_jax.envs.swe import pytest_report, repo, tools
from thundersync_jax.envs.swe.environment import _hunk_sides, demonstration_from_patch


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text(
        "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"
    )
    return tmp_path


def test_view_numbers_lines_and_lists_directories(ws):
    assert tools.view(str(ws), "p/m.py") == (
        "1 def f(x):\n2     return x + 1\n3 \n4 \n5 def g(x):\n6     return x + 1"
    )
    assert tools.view(str(ws), "p") == "m.py"
    assert tools.view(str(ws), ".") == "p/"
    # absolute paths inside the box (/task) or on the host both work
    assert tools.view(str(ws), "/task/p/m.py", box_root="/task").startswith("1 def f")
    assert tools.view(str(ws), str(ws / "p" / "m.py")).startswith("1 def f")


def test_view_caps_long_files(ws):
    (ws / "big.py").write_text("".join(f"x{i} = {i}\n" for i in range(1, 301)))
    out = tools.view(str(ws), "big.py", max_bytes=200)
    assert len(out) < 300
    shown = [line for line in out.splitlines() if not line.startswith("[")]
    assert shown[0] == "  1 x1 = 1"
    n = len(shown) + 1
    assert (
        out.splitlines()[-1]
        == f"[lines {n}-300 not shown; use bash: sed -n '{n},{n + 40}p' big.py]"
    )


@pytest.mark.parametrize(
    "path, message",
    [
        ("nope.py", "error: no such file: nope.py"),
        ("../x", "error: ../x is outside the repository"),
        ("/etc/passwd", "error: /etc/passwd is outside the repository"),
        ("", "error: path must be a non-empty string"),
        (None, "error: path must be a non-empty string"),
    ],
)
def test_view_errors(ws, path, message):
    assert tools.view(str(ws), path).startswith(message)


def test_symlink_out_of_the_workspace_is_refused(ws, tmp_path_factory):
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text("s3cret\n")
    os.symlink(secret, ws / "link.txt")
    assert tools.view(str(ws), "link.txt") == "error: link.txt is outside the repository"
    assert tools.edit(str(ws), "link.txt", "s3cret", "x").startswith("error: link.txt is outside")
    assert secret.read_text() == "s3cret\n"


def test_edit_replaces_exactly_one_occurrence(ws):
    assert tools.edit(
        str(ws), "p/m.py", "def g(x):\n    return x + 1", "def g(x):\n    return x - 1"
    ) == ("edited p/m.py line 5")
    assert (ws / "p" / "m.py").read_text().endswith("def g(x):\n    return x - 1\n")


@pytest.mark.parametrize(
    "path, old, new, message",
    [
        ("p/m.py", "return x * 2", "y", "error: old text not found in p/m.py"),
        (
            "p/m.py",
            "return x + 1",
            "return x",
            "error: old text occurs 2 times in p/m.py (lines 2, 6); include more lines",
        ),
        ("p/m.py", "", "x", "error: old is empty"),
        ("p/m.py", "def f", "def f", "error: old and new are the same"),
        ("p/m.py", 3, "x", "error: old and new must be strings"),
        ("p/none.py", "a", "b", "error: no such file: p/none.py"),
        ("p", "a", "b", "error: no such file: p"),
        ("../m.py", "a", "b", "error: ../m.py is outside the repository"),
    ],
)
def test_edit_errors_leave_the_file_alone(ws, path, old, new, message):
    before = (ws / "p" / "m.py").read_text()
    assert tools.edit(str(ws), path, old, new).startswith(message)
    assert (ws / "p" / "m.py").read_text() == before


def test_cap_keeps_head_and_tail():
    text = "HEAD" + "x" * 5000 + "TAIL"
    out = tools.cap(text, 200)
    assert len(out) <= 200 and out.startswith("HEAD") and out.endswith("TAIL")
    assert "chars cut" in out
    assert tools.cap("short", 200) == "short"


SUMMARY = """\
.F.E
=============== PASSES ===============
___ test_a ___
----- Captured stdout call -----
PASSED tests/t.py::test_fake
=========== short test summary info ===========
PASSED tests/t.py::test_a
PASSED tests/t.py::test_p[a b - c]
FAILED tests/t.py::TestC::test_m[x-1] - AssertionError: assert 1 == 2
XFAIL tests/t.py::test_x - reason
PASSED tests/t.py::test_teardown
ERROR tests/t.py::test_teardown - RuntimeError: boom
FAILED tests/t.py::test_p[a b] - assert 0
1 failed, 3 passed, 1 error in 0.1s
"""


def test_parse_statuses_matches_known_ids_exactly():
    ids = [
        "tests/t.py::test_a",
        "tests/t.py::test_p[a b - c]",
        "tests/t.py::test_p[a b]",
        "tests/t.py::TestC::test_m[x-1]",
        "tests/t.py::test_x",
        "tests/t.py::test_teardown",
        "tests/t.py::test_fake",
        "tests/t.py::test_missing",
    ]
    assert pytest_report.parse_statuses(SUMMARY, ids) == {
        "tests/t.py::test_a": "PASSED",
        "tests/t.py::test_p[a b - c]": "PASSED",
        "tests/t.py::test_p[a b]": "FAILED",
        "tests/t.py::TestC::test_m[x-1]": "FAILED",
        "tests/t.py::test_x": "PASSED",
        "tests/t.py::test_teardown": "ERROR",  # the worse of PASSED and a teardown ERROR
    }  # test_fake only appears in captured output: not a result


def test_parse_statuses_accepts_a_deeper_rootdir():
    out = "==== short test summary info ====\n"
    out += "PASSED test_t.py::test_a\nFAILED sub/test_u.py::test_b\n"
    assert pytest_report.parse_statuses(
        out, ["tests/test_t.py::test_a", "tests/sub/test_u.py::test_b"]
    ) == {
        "tests/test_t.py::test_a": "PASSED",
        "tests/sub/test_u.py::test_b": "FAILED",
    }
    assert pytest_report.parse_statuses("PASSED tests/t.py::test_a\n", ["tests/t.py::test_a"]) == {}


PATCH = """\
diff --git a/src/m.py b/src/m.py
index 1..2 100644
--- a/src/m.py
+++ b/src/m.py
@@ -1,3 +1,3 @@
 def f(x):
--- x
+    return x
 # end
diff --git a/new file.txt b/new file.txt
new file mode 100644
--- /dev/null
+++ b/new file.txt\t
@@ -0,0 +1,2 @@
+hello
+world
diff --git a/gone.py b/gone.py
deleted file mode 100644
--- a/gone.py
+++ /dev/null
@@ -1 +0,0 @@
-x = 1
"""


def test_patched_paths_and_hunks():
    assert repo.patched_paths(PATCH) == ["src/m.py", "new file.txt", "gone.py"]
    assert _hunk_sides(PATCH.splitlines()[:9]) == [
        ("def f(x):\n-- x\n# end", "def f(x):\n    return x\n# end")
    ]


def test_demonstration_from_patch():
    calls = demonstration_from_patch(PATCH)
    assert [c.name for c in calls] == ["view", "edit", "bash", "bash", "submit"]
    assert calls[1].arguments == {
        "path": "src/m.py",
        "old": "def f(x):\n-- x\n# end",
        "new": "def f(x):\n    return x\n# end",
    }
    assert (
        calls[2].arguments["command"] == "cat > 'new file.txt' <<'EOF_DEMO'\nhello\nworld\nEOF_DEMO"
    )
    assert calls[3].arguments["command"] == "rm gone.py"


def test_restrict_patch_keeps_only_editable_files():
    kept, dropped = repo.restrict_patch(PATCH, ["src/"])
    assert kept == PATCH.split("diff --git a/new file.txt")[0]
    assert dropped == ["new file.txt", "gone.py"]
    assert repo.restrict_patch(PATCH, ["src/", "new", "gone"]) == (PATCH, [])
    traditional = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert repo.restrict_patch(traditional, ["p/"]) == ("", ["x.py"])
    assert repo.restrict_patch("garbage\n", ["p/"]) == ("", ["garbage"])
