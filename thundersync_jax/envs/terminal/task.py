"""A terminal task in a SETA-like format: instruction, setup script, checker script.

Both scripts are bash and run inside the sandbox with the task directory as the working
directory. They are passed on the command line, never written into the workspace, so
the agent cannot read the checker's expected answers.

Checker protocol: the script prints `SCORE <passed> <total>` as its last such line.
`CheckerScript` builds scripts that follow it: *requirements* gate the score (any
failure gives 0) and *checks* are counted (partial credit = passed / total).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex

from thundersync_jax.envs.base import ToolCall

ANSWER = "answer.txt"
# answer.txt with runs of blanks collapsed, edge blanks and empty lines dropped.
NORMALIZED_ANSWER = (
    f"sed -e 's/[[:space:]]\\+/ /g' -e 's/^ //' -e 's/ $//' -e '/^$/d' {ANSWER} 2>/dev/null"
)
# Bash command lines longer than this no longer fit one execve argument (MAX_ARG_STRLEN).
MAX_SCRIPT_CHARS = 100_000


@dataclasses.dataclass(frozen=True)
class TerminalTask:
    """One generated task.

    Attributes:
      task_id: unique and stable, e.g. "terminal/count_matching/d2/0-9".
      family: generator name; difficulty: 1 (easiest) to 3.
      instruction: the statement shown to the agent.
      setup_script: bash that creates the workspace from an empty directory.
      checker_script: bash that prints `SCORE passed total`.
      demonstration: tool calls that solve the task, ending with submit.
      timeout_s: wall-clock limit of each command (setup, tool call, checker).
    """

    task_id: str
    family: str
    difficulty: int
    instruction: str
    setup_script: str
    checker_script: str
    demonstration: tuple[ToolCall, ...]
    timeout_s: float = 10.0

    def __post_init__(self):
        for name in ("setup_script", "checker_script"):
            size = len(getattr(self, name))
            if size > MAX_SCRIPT_CHARS:
                raise ValueError(
                    f"{self.task_id}: {name} has {size} chars; at most {MAX_SCRIPT_CHARS} fit "
                    "one bash -c argument. Generate less data."
                )
        if not self.demonstration or self.demonstration[-1].name != "submit":
            raise ValueError(f"{self.task_id}: the demonstration must end with submit()")


def bash(command: str) -> ToolCall:
    """A bash tool call."""
    return ToolCall(name="bash", arguments={"command": command})


def submit() -> ToolCall:
    """The submit tool call."""
    return ToolCall(name="submit", arguments={})


def write_files_script(files: dict[str, str]) -> str:
    """Bash that creates `files` (relative path -> exact text) and their directories."""
    dirs = sorted({path.rsplit("/", 1)[0] for path in files if "/" in path})
    lines = ["set -e", "umask 022"]
    if dirs:
        lines.append("mkdir -p " + " ".join(shlex.quote(d) for d in dirs))
    for path, text in files.items():
        lines.append(f"printf '%s' {shlex.quote(text)} > {shlex.quote(path)}")
    return "\n".join(lines) + "\n"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class CheckerScript:
    """Builds a checker script from shell conditions (each must exit 0 to pass)."""

    def __init__(self):
        self._lines: list[str] = []

    def require(self, description: str, condition: str) -> CheckerScript:
        """A gate: if it fails the score is 0 whatever the checks say."""
        self._lines.append(f"_require {shlex.quote(condition)} {shlex.quote(description)}")
        return self

    def check(self, description: str, condition: str) -> CheckerScript:
        """A counted check (partial credit)."""
        self._lines.append(f"_check {shlex.quote(condition)} {shlex.quote(description)}")
        return self

    def file_has_text(self, path: str, text: str, *, required: bool = False) -> CheckerScript:
        """`path` exists and its bytes are exactly `text`."""
        digest = f'"$(sha256sum < {shlex.quote(path)} | cut -c1-64)"'
        cond = f"[ -f {shlex.quote(path)} ] && [ {digest} = {sha256_text(text)} ]"
        add = self.require if required else self.check
        return add(f"{path} has the expected content", cond)

    def answer_number(self, expected: float, tolerance: float = 0.0) -> CheckerScript:
        """answer.txt holds one number within `tolerance` of `expected`."""
        awk = (
            "awk -v a=\"$(tr -d '[:space:]' < answer.txt)\" "
            f"-v e={expected!r} -v t={tolerance!r} "
            "'BEGIN { d = a - e; if (d < 0) d = -d; "
            "exit !(a ~ /^-?[0-9]+([.][0-9]+)?$/ && d <= t) }'"
        )
        return self.require("answer.txt exists", f"[ -f {ANSWER} ]").check(
            f"answer.txt is {expected}", awk
        )

    def answer_line_set(self, expected: list[str]) -> CheckerScript:
        """answer.txt lists exactly `expected` (any order); one check per expected line."""
        if not expected:
            raise ValueError("answer_line_set needs at least one expected line")
        allowed = "printf '%s\\n' " + " ".join(shlex.quote(x) for x in expected)
        self.require("answer.txt exists", f"[ -f {ANSWER} ]")
        self.require(
            "answer.txt has no unexpected lines",
            f"! {NORMALIZED_ANSWER} | grep -qvxF -f <({allowed})",
        )
        for line in expected:
            self.check(
                f"answer.txt lists {line}",
                f"{NORMALIZED_ANSWER} | grep -qxF -- {shlex.quote(line)}",
            )
        return self

    def answer_lines_in_order(self, expected: list[str]) -> CheckerScript:
        """answer.txt is exactly `expected`, line by line; one check per line."""
        count = f'"$({NORMALIZED_ANSWER} | wc -l)"'
        self.require(f"answer.txt has {len(expected)} lines", f"[ {count} -eq {len(expected)} ]")
        for i, line in enumerate(expected, start=1):
            got = f"\"$({NORMALIZED_ANSWER} | sed -n '{i}p')\""
            self.check(f"line {i} is {line!r}", f"[ {got} = {shlex.quote(line)} ]")
        return self

    def script(self) -> str:
        prelude = [
            "_fail=0; _pass=0; _total=0",
            '_require() { if ! eval "$1" >/dev/null 2>&1; then _fail=1; '
            'echo "FAILED requirement: $2"; fi; }',
            '_check() { _total=$((_total + 1)); if eval "$1" >/dev/null 2>&1; then '
            '_pass=$((_pass + 1)); else echo "FAILED check: $2"; fi; }',
        ]
        coda = ['if [ "$_fail" = 1 ]; then _pass=0; fi', 'echo "SCORE $_pass $_total"']
        return "\n".join(prelude + self._lines + coda) + "\n"
