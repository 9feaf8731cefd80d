"""`BenchTaskEnv`: one episode of a published terminal task (bench.py), inside its image.

The image is unpacked once into the rootfs cache and held from reset() to close(); the
box sees it read-only as `/`, with the image's working directory (default /app) writable:
a fresh copy of what the image keeps there, per episode. /logs is writable too
(/logs/agent, /logs/verifier). verify() copies the task's tests to a writable /tests, runs
the test script in a fresh box on the same files, and reads /logs/verifier/reward.txt (or
reward.json); without a reward file the script's exit status decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any

from thundersync_jax.envs.base import Environment, StepResult, ToolCall, VerifierResult
from thundersync_jax.envs.images import cache as cache_lib
from thundersync_jax.envs.sandbox import Sandbox
from thundersync_jax.envs.terminal.bench import BenchTask
from thundersync_jax.envs.terminal.env import TOOLS
from thundersync_jax.envs.verify import run_verifier

_DEFAULT_WORKDIR = "/app"
_SANDBOX_OWNED_ENV = ("HOME", "USER", "LOGNAME", "HOSTNAME")


class BenchTaskEnv(Environment):
    """bash(command) and submit() on a `BenchTask`, scored by its own tests.

    Args:
      task: the task (its `image` resolved).
      memory_mb: the box's address-space limit when the task names none.
      max_observation_chars: tool output beyond this is cut.
      workspace_parent: where episode directories go (default: system temp).
      image_cache: where the image is unpacked (default: the images' default cache).
    """

    tools = TOOLS

    def __init__(
        self,
        task: BenchTask,
        *,
        memory_mb: int = 2048,
        max_observation_chars: int = 4000,
        workspace_parent: str | None = None,
        image_cache: cache_lib.ImageCache | None = None,
    ):
        if not task.image:
            raise ValueError(f"terminal task {task.task_id}: its image is not resolved")
        self.task, self.task_id = task, task.task_id
        self.memory_mb = int(task.memory_mb or memory_mb)
        self.max_observation_chars = max_observation_chars
        self._parent = workspace_parent
        self._cache = image_cache
        self._held = contextlib.ExitStack()
        self._dir: str | None = None
        self._box: Sandbox | None = None
        self._image: cache_lib.UnpackedImage | None = None
        self._done = False

    def reset(self) -> str:
        """A fresh copy of the image's working directory; returns the instruction."""
        self.close()
        cache = self._cache if self._cache is not None else cache_lib.default_cache()
        self._image = self._held.enter_context(cache.lease(self.task.image))
        if self._parent:
            os.makedirs(self._parent, exist_ok=True)
        self._dir = tempfile.mkdtemp(prefix=f"tsj-bench-{self.task_id[:40]}-", dir=self._parent)
        shipped = os.path.join(self._image.rootfs, self.workdir.lstrip("/"))
        work = os.path.join(self._dir, "work")
        if os.path.isdir(shipped) and not os.path.islink(shipped):
            shutil.copytree(shipped, work, symlinks=True)
        else:
            os.makedirs(work)
        for sub in ("logs/agent", "logs/verifier"):
            os.makedirs(os.path.join(self._dir, sub))
        self._box = Sandbox(work, **self._box_config(self.task.agent_timeout_s)).__enter__()
        self._done = False
        return self.task.instruction

    @property
    def workdir(self) -> str:
        """The image's working directory (the box's writable task directory)."""
        wd = self._image.working_dir if self._image is not None else ""
        wd = os.path.normpath(wd) if wd else _DEFAULT_WORKDIR
        return wd if wd != "/" else _DEFAULT_WORKDIR

    def _box_config(self, timeout_s: float, tests: str = "") -> dict[str, Any]:
        image = self._image
        env = {k: v for k, v in image.env.items() if k not in _SANDBOX_OWNED_ENV}
        binds = [(os.path.join(self._dir, "logs"), "/logs")]
        if tests:
            binds.append((tests, "/tests"))
            env["TEST_DIR"] = "/tests"  # Terminal-Bench 1's run-tests.sh reads it
        return dict(
            timeout_s=timeout_s,
            memory_mb=self.memory_mb,
            rootfs=image.rootfs,
            root_at=self.workdir,
            cwd=self.workdir,
            env=env,
            rw_binds=binds,
        )

    def step(self, call: ToolCall) -> StepResult:
        """Runs `bash(command)` or `submit()`; bad calls give an error observation."""
        if self._box is None:
            return StepResult("error: the episode has not started (call reset first)", done=True)
        if self._done:
            return StepResult("error: the episode is over (submit was called)", done=True)
        if call.name == "submit":
            self._done = True
            return StepResult("submitted", done=True)
        command = call.arguments.get("command") if isinstance(call.arguments, dict) else None
        if call.name != "bash" or not isinstance(command, str) or not command.strip():
            return StepResult("error: call bash with a non-empty 'command', or submit")
        res = self._box.run(command)
        text = (res.stdout + res.stderr)[: self.max_observation_chars].rstrip("\n")
        if res.timed_out:
            text += f"\n[timed out after {self.task.agent_timeout_s:g} s]"
        elif res.exit_code:
            text += f"\n[exit code {res.exit_code}]"
        return StepResult(text.strip("\n") or "[no output]")

    def verify(self) -> VerifierResult:
        """Runs the task's tests on the episode's files; never raises."""
        return run_verifier(
            self._check, timeout_s=self.task.verifier_timeout_s + 60, name=self.task_id
        )

    def _check(self) -> VerifierResult:
        if self._box is None or self._dir is None:
            raise RuntimeError("no episode to check (call reset first)")
        self._box.close()  # the agent's processes end before the tests look
        tests = os.path.join(self._dir, "tests")
        if self.task.tests_dir:
            shutil.copytree(self.task.tests_dir, tests, symlinks=True)
        os.makedirs(tests, exist_ok=True)
        script = os.path.basename(self.task.test_script)
        shutil.copy(self.task.test_script, os.path.join(tests, script))
        config = self._box_config(self.task.verifier_timeout_s, tests)
        with Sandbox(os.path.join(self._dir, "work"), **config) as box:
            res = box.run(f"bash /tests/{script}")
        reward, source = _reward(os.path.join(self._dir, "logs", "verifier"), res.exit_code)
        if res.timed_out:
            reward, source = 0.0, "the tests timed out"
        return VerifierResult(
            reward=reward,
            reason=f"reward {reward:g} ({source})",
            details={"exit_code": res.exit_code, "output_tail": (res.stdout + res.stderr)[-2000:]},
        )

    def demonstration(self) -> list[ToolCall]:
        """The reference solution run as one bash call, then submit (none: just submit)."""
        calls = [ToolCall("bash", {"command": self.task.solution})] if self.task.solution else []
        return [*calls, ToolCall("submit", {})]

    def close(self) -> None:
        """Ends the box, removes the episode's files, releases the image. Safe to call twice."""
        if self._box is not None:
            self._box.close()
            self._box = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._held.close()
        self._image = None


def _reward(verifier_dir: str, exit_code: int) -> tuple[float, str]:
    """(reward, where it came from): reward.txt, reward.json, else the exit status."""
    txt, js = os.path.join(verifier_dir, "reward.txt"), os.path.join(verifier_dir, "reward.json")
    if os.path.isfile(txt):
        with open(txt) as f:
            text = f.read().strip()
        try:
            return min(max(float(text), 0.0), 1.0), "reward.txt"
        except ValueError:
            return 0.0, f"reward.txt is not a number: {text[:40]!r}"
    if os.path.isfile(js):
        with open(js) as f:
            value = json.load(f)
        value = value.get("reward", 0.0) if isinstance(value, dict) else value
        return min(max(float(value), 0.0), 1.0), "reward.json"
    return (1.0 if exit_code == 0 else 0.0), f"exit status {exit_code}"
