"""Chat templates with tool calls, and a tool-call parser that never raises.

Two formats render the same conversation:

* `Qwen3Format` — Qwen3's template: a system turn listing the tools as JSON schemas inside
  `<tools></tools>`, assistant tool calls as `<tool_call>\\n{"name": ..., "arguments": {...}}
  \\n</tool_call>`, and tool results as `<tool_response>` blocks inside one user turn.
  `QWEN3_CHAT_TEMPLATE` is the same format as a jinja string for HF tokenizer directories;
  the tests check that transformers' `apply_chat_template` renders it identically.
* `CompactFormat` — the same structure with one-token role markers (`<|user|>`), one line
  of tool signatures and compact JSON, so tiny byte-level models get short contexts.

Tool calls are parsed by `tool_calls.parse_tool_calls`.

The agent loop never re-renders sampled tokens: it appends `generation_prompt()` pieces and
`tool_results_text(...)` after each sampled turn, and the tests check that this incremental
text equals `render()` of the whole conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.base import ToolCall, ToolSpec
from thundersync_jax.envs.chat_format import ChatFormat, Message, tool_schema
from thundersync_jax.models import tokenizer as tokenizer_lib

IM_START = tokenizer_lib.IM_START
IM_END = tokenizer_lib.IM_END
TOOL_CALL = tokenizer_lib.TOOL_CALL
TOOL_CALL_END = tokenizer_lib.TOOL_CALL_END
TOOL_RESPONSE = tokenizer_lib.TOOL_RESPONSE
TOOL_RESPONSE_END = tokenizer_lib.TOOL_RESPONSE_END


class Qwen3Format(ChatFormat):
    """Qwen3's chat template (non-thinking rendering of assistant content, kept verbatim)."""

    name = "qwen3"
    after_turn = "\n"
    _TOOLS_HEADER = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    )
    _TOOLS_FOOTER = (
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )

    def __init__(self, enable_thinking: bool = True):
        """enable_thinking=False pre-fills an empty think block, as Qwen3's template does."""
        self.enable_thinking = enable_thinking

    def system_text(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        if tools:
            head = system + "\n\n" if system is not None else ""
            listing = "".join("\n" + json.dumps(tool_schema(t), ensure_ascii=False) for t in tools)
            body = head + self._TOOLS_HEADER + listing + self._TOOLS_FOOTER
            return f"{IM_START}system\n{body}{IM_END}\n"
        if system is not None:
            return f"{IM_START}system\n{system}{IM_END}\n"
        return ""

    def generation_prompt(self) -> str:
        prompt = f"{IM_START}assistant\n"
        if not self.enable_thinking:
            prompt += "<think>\n\n</think>\n\n"
        return prompt

    def format_call(self, call: ToolCall) -> str:
        args = json.dumps(call.arguments, ensure_ascii=False)
        return f'{TOOL_CALL}\n{{"name": "{call.name}", "arguments": {args}}}\n{TOOL_CALL_END}'

    def _turn_open(self, role: str) -> str:
        return f"{IM_START}{role}\n"

    def _tool_turn_open(self) -> str:
        # Qwen3 puts the newline before each <tool_response>, not after the role.
        return f"{IM_START}user"

    def _tool_result(self, content: str) -> str:
        return f"\n{TOOL_RESPONSE}\n{content}\n{TOOL_RESPONSE_END}"


class CompactFormat(ChatFormat):
    """Qwen3's structure with one-token role markers and compact JSON, for tiny models."""

    name = "compact"
    _call_separator = ""
    _ROLE_MARKERS = {
        "system": tokenizer_lib.ByteTokenizer.SYSTEM,
        "user": tokenizer_lib.ByteTokenizer.USER,
        "assistant": tokenizer_lib.ByteTokenizer.ASSISTANT,
    }

    def system_text(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        lines = [system] if system else []
        if tools:
            lines.append("tools: " + " ".join(f"{t.name}({','.join(t.parameters)})" for t in tools))
        if not lines:
            return ""
        return self._turn_open("system") + "\n".join(lines) + self._turn_close()

    def generation_prompt(self) -> str:
        return self._ROLE_MARKERS["assistant"]

    def format_call(self, call: ToolCall) -> str:
        payload = json.dumps(
            {"name": call.name, "arguments": call.arguments},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return f"{TOOL_CALL}{payload}{TOOL_CALL_END}"

    def _turn_open(self, role: str) -> str:
        return self._ROLE_MARKERS[role]

    def _tool_result(self, content: str) -> str:
        return f"{TOOL_RESPONSE}{content}{TOOL_RESPONSE_END}"


def get_format(tok_or_name: Any, enable_thinking: bool = True) -> ChatFormat:
    """The chat format for a tokenizer (its `chat_format`) or a format name."""
    name = tok_or_name if isinstance(tok_or_name, str) else tok_or_name.chat_format
    if name == "qwen3":
        return Qwen3Format(enable_thinking=enable_thinking)
    if name == "compact":
        return CompactFormat()
    if name == "template" and not isinstance(tok_or_name, str):  # the tokenizer's own jinja
        from thundersync_jax.envs.hf_chat import TemplateFormat

        return TemplateFormat(tok_or_name.hf)
    raise ValueError(f"unknown chat format {name!r}; valid: 'qwen3', 'compact', 'template'")


def apply_chat_template(
    tok: tokenizer_lib.Tokenizer,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a conversation in the tokenizer's chat format (same call for both kinds)."""
    return tok.encode(get_format(tok).render(messages, tools, add_generation_prompt))


# ----------------------------------------------------------------------------------------
# The Qwen3 format as a jinja template, for HF tokenizer directories we write
# (tokenizer_config.json "chat_template"). Written from the format described above; the
# tests render conversations with transformers and compare against `Qwen3Format.render`.

QWEN3_CHAT_TEMPLATE = """\
{%- set msgs = messages -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if msgs and msgs[0].role == 'system' -%}{{- msgs[0].content + '\\n\\n' -}}{%- endif -%}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' -}}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif msgs and msgs[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + msgs[0].content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in msgs -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' + (m.content or '') -}}
{%- for tc in (m.tool_calls or []) -%}
{%- set call = tc.function if tc.function is defined else tc -%}
{%- if m.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}
{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or msgs[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}
{%- if loop.last or msgs[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""
