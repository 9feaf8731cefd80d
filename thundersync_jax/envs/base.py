"""The contract between task environments and the agent loop.

An environment owns one episode's workspace (a sandboxed directory), exposes
tools the agent may call, and scores the final state with a verifier. The agent
loop never touches the filesystem itself: every effect goes through `step`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool the agent may call: name, one-line description, JSON-schema-like params."""

    name: str
    description: str
    parameters: dict[str, str]  # argument name -> description


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed tool call from the model."""

    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What a tool call returned: the observation text and whether the episode ended."""

    observation: str
    done: bool = False


@dataclasses.dataclass(frozen=True)
class VerifierResult:
    """Reward in [0, 1] and why; `error` is set when the verifier itself failed."""

    reward: float
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


class Environment(abc.ABC):
    """One episode of one task. Use as a context manager so the workspace is removed."""

    task_id: str
    tools: tuple[ToolSpec, ...]

    @abc.abstractmethod
    def reset(self) -> str:
        """Prepares the workspace and returns the task statement shown to the agent."""

    @abc.abstractmethod
    def step(self, call: ToolCall) -> StepResult:
        """Runs one tool call. Bad arguments give an error observation (text starting with
        "error:", which the agent loop counts as a failed call), never an exception."""

    @abc.abstractmethod
    def verify(self) -> VerifierResult:
        """Scores the workspace. Never raises: failures give reward 0 with `error` set."""

    @abc.abstractmethod
    def demonstration(self) -> list[ToolCall]:
        """A scripted sequence of tool calls that solves the task (supervised warm start)."""

    def close(self) -> None:  # noqa: B027 (optional hook: environments without a workspace)
        """Removes the workspace. Safe to call twice."""

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
