"""The chat-format interface every format implements (`chat.Qwen3Format`, `chat.CompactFormat`,
`hf_chat.TemplateFormat`): messages, tool schemas, and the pieces the agent loop appends."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.base import ToolCall, ToolSpec
from thundersync_jax.models import tokenizer as tokenizer_lib

IM_END = tokenizer_lib.IM_END
ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class Message:
    """One chat message; `tool_calls` only on assistant messages, `tool` = one tool result."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {self.role!r}")

    def to_hf(self) -> dict[str, Any]:
        """The OpenAI/HF dict form that `apply_chat_template` takes."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return d


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    """OpenAI-style function schema of a tool; every listed argument is a required string."""
    properties = {
        arg: {"type": "string", "description": desc} for arg, desc in spec.parameters.items()
    }
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(spec.parameters),
            },
        },
    }


class ChatFormat(abc.ABC):
    """Renders conversations to text; subclasses fix the markers and the tool listing.

    Attributes:
      name: the format's name (a tokenizer's `chat_format`).
      end_of_turn: the marker that closes every turn (a stop token of the sampler).
      after_turn: text `render()` writes after each end-of-turn marker.
    """

    name: str
    end_of_turn: str = IM_END
    after_turn: str = ""

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        add_generation_prompt: bool = False,
    ) -> str:
        """The whole conversation as text (a leading system message merges with the tools)."""
        messages = list(messages)
        system = None
        if messages and messages[0].role == "system":
            system, messages = messages[0].content, messages[1:]
        out = [self.system_text(system, tools)]
        for i, m in enumerate(messages):
            if m.role == "tool":
                if i == 0 or messages[i - 1].role != "tool":
                    out.append(self._tool_turn_open())
                out.append(self._tool_result(m.content))
                if i == len(messages) - 1 or messages[i + 1].role != "tool":
                    out.append(self._turn_close())
            elif m.role == "assistant":
                out.append(self._turn_open("assistant"))
                out.append(self.assistant_text(m.content, m.tool_calls))
                out.append(self._turn_close())
            else:
                out.append(self._turn_open(m.role) + m.content + self._turn_close())
        if add_generation_prompt:
            out.append(self.generation_prompt())
        return "".join(out)

    def prompt_text(self, system: str | None, user: str, tools: Sequence[ToolSpec]) -> str:
        """The first prompt of an episode: system + tools, the task statement, then the
        assistant header the model continues from."""
        messages = ([Message("system", system)] if system is not None else []) + [
            Message("user", user)
        ]
        return self.render(messages, tools, add_generation_prompt=True)

    def assistant_text(self, content: str, calls: Sequence[ToolCall]) -> str:
        """An assistant turn's body (content then calls), without the end-of-turn marker."""
        out = [content]
        for i, call in enumerate(calls):
            if content or i > 0:
                out.append(self._call_separator)
            out.append(self.format_call(call))
        return "".join(out)

    def tool_results_text(self, observations: Sequence[str]) -> str:
        """What follows an assistant turn's end-of-turn marker: the tool results turn and the
        next assistant header. Equal to the matching slice of `render()`."""
        body = "".join(self._tool_result(o) for o in observations)
        return (
            self.after_turn
            + self._tool_turn_open()
            + body
            + self._turn_close()
            + self.generation_prompt()
        )

    # Format-specific pieces.
    _call_separator = "\n"

    @abc.abstractmethod
    def system_text(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        """The system turn: the system message and the tool listing ('' when both absent)."""

    @abc.abstractmethod
    def generation_prompt(self) -> str:
        """The assistant header the model continues from."""

    @abc.abstractmethod
    def format_call(self, call: ToolCall) -> str:
        """One tool call as the model writes it."""

    @abc.abstractmethod
    def _turn_open(self, role: str) -> str: ...

    def _turn_close(self) -> str:
        return self.end_of_turn + self.after_turn

    def _tool_turn_open(self) -> str:
        return self._turn_open("user")

    @abc.abstractmethod
    def _tool_result(self, content: str) -> str: ...
