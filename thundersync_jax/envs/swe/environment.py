"""SweEnvironment: one agent episode on one SWE-bench-format instance.

reset() checks base_commit out into a fresh workspace and opens a Sandbox on
it; the agent's bash commands run inside the sandbox (at /task), view and
edit touch only files inside the workspace; verify() takes the workspace
diff as the model patch and scores it with the SWE-bench harness order
(verifier.py), wrapped so that no verifier failure can raise. An instance with an
`image` runs in it (swe/image_sandbox.py): the image is held from reset() to close(),
and reset() costs a fresh checkout of the workspace, never a copy of the rootfs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from thundersync_jax.envs import verify as verify_lib
from thundersync_jax.envs.base import Environment, StepResult, ToolCall, VerifierResult
from thundersync_jax.envs.images import cache as image_cache_lib
from thundersync_jax.envs.sandbox import Sandbox
from thundersync_jax.envs.swe import image_sandbox, mini_swe, repo, verdicts, verifier
from thundersync_jax.envs.swe import tools as swe_tools
from thundersync_jax.envs.swe.instance import SweInstance


class SweEnvironment(Environment):
    """Tools bash(command), view(path), edit(path, old, new), submit() on one instance.

    Args:
      instance: the task.
      workdir: scratch directory; each episode gets its own subdirectory, removed by close().
      sandbox_config: keyword arguments of `Sandbox` (timeout_s, memory_mb, network, ...);
        `env` there is merged over the instance's env.
      max_observation_bytes: cap on a bash observation (head and tail kept).
      view_max_bytes: cap on a view observation.
      command_timeout_s: wall-clock limit of one bash call (default: the sandbox's).
      verify_timeout_s: wall-clock limit of one test run in verify (default: the sandbox's).
      partial_credit: reward the fraction of passing tests instead of all-or-nothing.
      cache_dir: where remote repositories are mirrored (default workdir/repos).
      image_cache: where instance images are unpacked (default images' default cache).
      verdict_dir: keep verify()'s verdicts there and reuse them for a patch already verified
        on this instance with these settings (`verdicts.py`); None verifies every time.
    """

    tools = swe_tools.TOOL_SPECS

    def __init__(
        self,
        instance: SweInstance,
        workdir: str,
        sandbox_config: Mapping[str, Any] | None = None,
        *,
        max_observation_bytes: int = 2000,
        view_max_bytes: int = 2000,
        command_timeout_s: float | None = None,
        verify_timeout_s: float | None = None,
        partial_credit: bool = False,
        cache_dir: str | None = None,
        image_cache: image_cache_lib.ImageCache | None = None,
        verdict_dir: str | None = None,
    ):
        self.instance = instance
        self.verdict_dir = verdict_dir
        self.task_id = instance.instance_id
        self.workdir = os.path.abspath(workdir)
        self.sandbox_config = {**verifier.DEFAULT_SANDBOX, **(sandbox_config or {})}
        self.max_observation_bytes = max_observation_bytes
        self.view_max_bytes = view_max_bytes
        self.command_timeout_s = command_timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.partial_credit = partial_credit
        self.cache_dir = cache_dir or os.path.join(self.workdir, "repos")
        self._episode_dir: str | None = None
        self._workspace: repo.Workspace | None = None
        self._sandbox: Sandbox | None = None
        self.image_cache = image_cache
        self._held = contextlib.ExitStack()  # the image lease, from reset() to close()
        self.submitted = False

    def reset(self) -> str:
        """Checks out base_commit into a fresh workspace and returns the problem statement."""
        self.close()
        os.makedirs(self.workdir, exist_ok=True)
        safe_id = re.sub(r"[^\w.-]", "_", self.task_id)[:80]
        self._episode_dir = tempfile.mkdtemp(prefix=f"{safe_id}-", dir=self.workdir)
        image = self._held.enter_context(image_sandbox.held_image(self.instance, self.image_cache))
        source = verifier.source_repo(self.instance, self.cache_dir, image)
        self._workspace = verifier.checkout_task(self.instance, source, self._episode_dir)
        config = image_sandbox.sandbox_config(self.instance, self.sandbox_config, image)
        self._sandbox = Sandbox(self._workspace.path, **config).__enter__()
        self.submitted = False
        return self.instance.problem_statement

    def step(self, call: ToolCall) -> StepResult:
        """Runs one tool call; mistakes come back as "error: ..." observations."""
        if self._sandbox is None or self._workspace is None:
            return StepResult("error: the episode has not started (call reset first)", done=True)
        if self.submitted:
            return StepResult("error: already submitted", done=True)
        args = call.arguments if isinstance(call.arguments, dict) else {}
        root, box_root = self._workspace.path, self._sandbox.workdir
        if call.name == "bash":
            return StepResult(self._bash(args.get("command")))
        if call.name == "view":
            return StepResult(
                swe_tools.view(root, args.get("path"), self.view_max_bytes, box_root=box_root)
            )
        if call.name == "edit":
            return StepResult(
                swe_tools.edit(root, args.get("path"), args.get("old"), args.get("new"), box_root)
            )
        if call.name == "submit":
            self.submitted = True
            return StepResult("submitted", done=True)
        names = ", ".join(t.name for t in self.tools)
        return StepResult(f"error: unknown tool {call.name!r}; tools: {names}")

    def _bash(self, command: object) -> str:
        if not isinstance(command, str) or not command.strip():
            return f"error: command must be a non-empty string, got {command!r}"
        res = self._sandbox.run(command, timeout_s=self.command_timeout_s)
        out = swe_tools.without_durations((res.stdout + res.stderr).rstrip("\n"))
        if res.timed_out:
            out += f"\n(timed out after {self.command_timeout_s or self._sandbox.timeout_s:g} s)"
        elif res.exit_code != 0:
            out += f"\n(exit {res.exit_code})"
        return swe_tools.cap(out.strip("\n") or "(no output)", self.max_observation_bytes)

    def model_patch(self) -> str:
        """The workspace's changes against base_commit (what verify() scores)."""
        if self._workspace is None:
            raise RuntimeError("the episode has not started (call reset first)")
        return self._workspace.diff()

    def verify(self) -> VerifierResult:
        """Scores the workspace diff with the instance's tests; never raises."""
        holder: dict[str, str] = {}

        def check() -> VerifierResult:
            holder["patch"] = self.model_patch()
            return self._score(holder["patch"])

        result = verify_lib.run_verifier(check, name=self.task_id)
        details = dict(result.details, model_patch=holder.get("patch", ""))
        return VerifierResult(result.reward, result.reason, details, result.error)

    def _score(self, patch: str) -> VerifierResult:
        """The verifier's verdict on `patch`: the kept one when `verdict_dir` holds it."""

        def evaluate() -> VerifierResult:
            return verifier.evaluate_patch(
                self.instance,
                patch,
                os.path.join(self.workdir, "eval"),
                self.sandbox_config,
                partial_credit=self.partial_credit,
                cache_dir=self.cache_dir,
                timeout_s=self.verify_timeout_s,
                image_cache=self.image_cache,
            )

        if self.verdict_dir is None:
            return evaluate()
        # What the verdict depends on besides the task and the patch (not where repositories
        # and images are cached).
        settings = {
            "sandbox": self.sandbox_config,
            "partial_credit": self.partial_credit,
            "timeout_s": self.verify_timeout_s,
        }
        key = verdicts.key(self.instance, patch, settings)
        return verdicts.cached(self.verdict_dir, key, evaluate)

    def demonstration(self) -> list[ToolCall]:
        """The stored scripted solution (mini-SWE), else edits that apply the gold patch."""
        if "demonstration" in self.instance.extra:
            return mini_swe.demonstration(self.instance)
        return demonstration_from_patch(self.instance.patch)

    def close(self) -> None:
        """Closes the sandbox and removes the episode's files. Safe to call twice."""
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        if self._episode_dir is not None:
            shutil.rmtree(self._episode_dir, ignore_errors=True)
            self._episode_dir = None
        self._workspace = None
        self._held.close()


def demonstration_from_patch(patch: str) -> list[ToolCall]:
    """Tool calls that reproduce a unified diff: one edit per hunk (context + old lines ->
    context + new lines), a bash heredoc per new file, `rm` per deleted file, then submit."""
    calls: list[ToolCall] = []
    for file_patch in re.split(r"(?m)^(?=diff --git )", patch):
        paths = repo.patched_paths(file_patch)
        if not paths:
            continue
        lines = file_patch.splitlines()
        if any(line == "--- /dev/null" for line in lines):
            body = _hunk_sides(lines)[0][1] if _hunk_sides(lines) else ""
            calls.append(
                ToolCall(
                    "bash",
                    {"command": f"cat > {shlex.quote(paths[-1])} <<'EOF_DEMO'\n{body}\nEOF_DEMO"},
                )
            )
            continue
        if any(line == "+++ /dev/null" for line in lines):
            calls.append(ToolCall("bash", {"command": f"rm {shlex.quote(paths[0])}"}))
            continue
        calls.append(ToolCall("view", {"path": paths[-1]}))
        for old, new in _hunk_sides(lines):
            calls.append(ToolCall("edit", {"path": paths[-1], "old": old, "new": new}))
    return [*calls, ToolCall("submit", {})]


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _hunk_sides(lines: list[str]) -> list[tuple[str, str]]:
    """(old text, new text) of each hunk of one file's diff, read by the hunk header's counts
    (so a removed line that starts with "--" is not mistaken for a file header)."""
    sides = []
    i = 0
    while i < len(lines):
        m = _HUNK.match(lines[i])
        i += 1
        if not m:
            continue
        old_left = int(m.group(1) if m.group(1) is not None else 1)
        new_left = int(m.group(2) if m.group(2) is not None else 1)
        old, new = [], []
        while i < len(lines) and (old_left > 0 or new_left > 0):
            line = lines[i]
            i += 1
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            tag, text = (line[:1], line[1:]) if line else (" ", "")
            if tag in (" ", "-"):
                old.append(text)
                old_left -= 1
            if tag in (" ", "+"):
                new.append(text)
                new_left -= 1
        sides.append(("\n".join(old), "\n".join(new)))
    return sides
