"""A chat format that renders with an HF tokenizer's own jinja chat template.

A user's checkpoint brings its tokenizer and chat template; the agent loop must render
prompts, tool results and the next assistant header exactly as that template does, not
with this project's Qwen3 spelling. The loop never re-renders sampled tokens, so it needs
the template's pieces one at a time; each piece is cut out of two full renders that differ
by one message (the template must be prefix-stable: rendering more messages only appends,
as chat templates used for multi-turn generation are). Tool calls are parsed as
`<tool_call>` JSON blocks (`tool_calls.parse_tool_calls`), Qwen's and Hermes' convention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.base import ToolCall, ToolSpec
from thundersync_jax.envs.chat_format import ChatFormat, Message, tool_schema

_PROBE_USER = "u"
_PROBE_ASSISTANT = "a"


class TemplateFormat(ChatFormat):
    """`ChatFormat` over `hf_tokenizer.apply_chat_template` (text, not ids)."""

    name = "template"

    def __init__(self, hf_tokenizer: Any):
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ValueError(f"{hf_tokenizer!r} has no chat_template to render with")
        self.hf = hf_tokenizer
        self.end_of_turn, self.after_turn = self._turn_end()

    def _render(self, messages: Sequence[Message], tools=(), gen: bool = False) -> str:
        return self.hf.apply_chat_template(
            [m.to_hf() for m in messages],
            tools=[tool_schema(t) for t in tools] or None,
            add_generation_prompt=gen,
            tokenize=False,
        )

    def _turn_end(self) -> tuple[str, str]:
        """(end-of-turn marker, text after it): what follows an assistant turn's content."""
        convo = [Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)]
        text = self._render(convo)
        tail = text[text.rindex(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT) :]
        specials = sorted(self.hf.all_special_tokens, key=len, reverse=True)
        for marker in specials:
            if tail.startswith(marker):
                return marker, tail[len(marker) :]
        raise ValueError(
            f"the chat template ends an assistant turn with {tail!r}, which does not start "
            f"with a special token of the tokenizer ({specials}); the sampler needs one to stop"
        )

    def render(self, messages, tools=(), add_generation_prompt=False) -> str:
        return self._render(list(messages), tools, add_generation_prompt)

    def _suffix(self, longer: str, prefix: str, what: str) -> str:
        if not longer.startswith(prefix):
            raise ValueError(
                f"the chat template is not prefix-stable ({what}): rendering one more message "
                f"changed earlier text; the agent loop cannot extend a conversation with it"
            )
        return longer[len(prefix) :]

    def assistant_text(self, content: str, calls: Sequence[ToolCall]) -> str:
        user = [Message("user", _PROBE_USER)]
        head = self._render(user, gen=True)
        full = self._render(user + [Message("assistant", content, tuple(calls))])
        body = self._suffix(full, head, "assistant turn")
        end = self.end_of_turn + self.after_turn
        if not body.endswith(end):
            raise ValueError(f"assistant turn {body!r} does not end with {end!r}")
        return body[: len(body) - len(end)]

    def tool_results_text(self, observations: Sequence[str]) -> str:
        convo = [Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)]
        before = self._render(convo)
        before = before[: len(before) - len(self.after_turn)]  # up to the end-of-turn marker
        results = [Message("tool", o) for o in observations]
        return self._suffix(self._render(convo + results, gen=True), before, "tool results")

    def generation_prompt(self) -> str:
        user = [Message("user", _PROBE_USER)]
        return self._suffix(self._render(user, gen=True), self._render(user), "generation")

    def system_text(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        raise NotImplementedError("TemplateFormat renders whole conversations (see render)")

    def format_call(self, call: ToolCall) -> str:
        return self.assistant_text("", [call])

    def _turn_open(self, role: str) -> str:
        raise NotImplementedError("TemplateFormat renders whole conversations (see render)")

    def _tool_result(self, content: str) -> str:
        raise NotImplementedError("TemplateFormat renders whole conversations (see render)")
