"""`TerminalEnv`: one episode of a terminal task, every command run in the sandbox."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from thundersync_jax.envs.base import Environment, StepResult, ToolCall, ToolSpec, VerifierResult
from thundersync_jax.envs.sandbox import RunResult, Sandbox
from thundersync_jax.envs.terminal.task import TerminalTask
from thundersync_jax.envs.verify import run_verifier

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a bash command in the task directory and return its output. "
        "Each call starts a fresh shell there (no state carries over but the files).",
        parameters={"command": "the bash command line"},
    ),
    ToolSpec(
        name="submit",
        description="End the episode; the task directory is then checked.",
        parameters={},
    ),
)
_SCORE = re.compile(r"^SCORE (\d+) (\d+)$", re.MULTILINE)


class TerminalEnv(Environment):
    """Runs a `TerminalTask`: setup on reset, bash tool calls, the checker on verify.

    Args:
      task: the task to run.
      partial_credit: reward = passed / total checks (gated by the requirements); by
        default the reward is 1 only when every check passes.
      max_observation_chars: tool output beyond this is cut (with a note).
      workspace_parent: where to create the task directory (default: system temp).
      sandbox_kwargs: extra `Sandbox` arguments (memory_mb, allow_unisolated, ...).
    """

    tools = TOOLS

    def __init__(
        self,
        task: TerminalTask,
        *,
        partial_credit: bool = False,
        max_observation_chars: int = 4000,
        workspace_parent: str | None = None,
        sandbox_kwargs: dict[str, Any] | None = None,
    ):
        self.task = task
        self.task_id = task.task_id
        self.partial_credit = partial_credit
        self.max_observation_chars = max_observation_chars
        self._workspace_parent = workspace_parent
        self._sandbox_kwargs = {"timeout_s": task.timeout_s, "memory_mb": 512}
        self._sandbox_kwargs.update(sandbox_kwargs or {})
        self._workspace: str | None = None
        self._sandbox: Sandbox | None = None
        self._done = False

    def reset(self) -> str:
        """Creates a fresh task directory, runs the setup script in the box, returns the task."""
        self.close()
        self._workspace = tempfile.mkdtemp(prefix="tsj-terminal-", dir=self._workspace_parent)
        self._sandbox = Sandbox(self._workspace, **self._sandbox_kwargs).__enter__()
        self._done = False
        setup = self._sandbox.run(self.task.setup_script)
        if setup.exit_code != 0 or setup.timed_out:
            self.close()
            raise RuntimeError(
                f"setup of {self.task_id} failed (exit {setup.exit_code}, timed out "
                f"{setup.timed_out}): {setup.stderr[-2000:]}"
            )
        return self.task.instruction

    def step(self, call: ToolCall) -> StepResult:
        """Runs `bash(command)` or `submit()`; bad calls give an error observation."""
        if self._sandbox is None:
            return StepResult("error: the episode has not started (call reset first)", done=True)
        if self._done:
            return StepResult("error: the episode is over (submit was called)", done=True)
        if call.name == "submit":
            self._done = True
            return StepResult("submitted", done=True)
        if call.name != "bash":
            valid = ", ".join(t.name for t in self.tools)
            return StepResult(f"error: unknown tool {call.name!r}; valid tools: {valid}")
        command = call.arguments.get("command") if isinstance(call.arguments, dict) else None
        if not isinstance(command, str) or not command.strip():
            return StepResult("error: bash needs a non-empty string argument 'command'")
        return StepResult(self._format(self._sandbox.run(command)))

    def verify(self) -> VerifierResult:
        """Runs the checker in the box: reward 1/0 (or passed/total with partial credit)."""
        return run_verifier(self._check, timeout_s=self.task.timeout_s + 30, name=self.task_id)

    def demonstration(self) -> list[ToolCall]:
        """The scripted solution, ending with submit()."""
        return list(self.task.demonstration)

    def close(self) -> None:
        """Removes the task directory. Safe to call twice."""
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        if self._workspace is not None:
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None

    @property
    def workspace(self) -> str | None:
        """Host path of the task directory (None before reset and after close)."""
        return self._workspace

    def _check(self) -> VerifierResult:
        if self._sandbox is None or self._workspace is None or not os.path.isdir(self._workspace):
            raise RuntimeError("no workspace to check (call reset first)")
        res = self._sandbox.run(self.task.checker_script)
        scores = _SCORE.findall(res.stdout)
        if res.timed_out or not scores:
            raise RuntimeError(
                f"checker printed no SCORE line (exit {res.exit_code}, timed out "
                f"{res.timed_out}): {res.stdout[-500:]} {res.stderr[-500:]}"
            )
        passed, total = (int(x) for x in scores[-1])
        failures = [line for line in res.stdout.splitlines() if line.startswith("FAILED")]
        if self.partial_credit:
            reward = passed / total if total else 0.0
        else:
            reward = 1.0 if passed == total and not failures else 0.0
        return VerifierResult(
            reward=reward,
            reason=f"passed {passed}/{total} checks",
            details={"passed": passed, "total": total, "failures": failures[:20]},
        )

    def _format(self, res: RunResult) -> str:
        text = res.stdout + res.stderr
        notes = []
        if len(text) > self.max_observation_chars or res.stdout_truncated or res.stderr_truncated:
            text = text[: self.max_observation_chars]
            notes.append("[output truncated]")
        if res.timed_out:
            notes.append(f"[timed out after {self.task.timeout_s:g} s; the command was killed]")
        elif res.exit_code != 0:
            notes.append(f"[exit code {res.exit_code}]")
        return "\n".join(part for part in [text.rstrip("\n"), *notes] if part) or "[no output]"
