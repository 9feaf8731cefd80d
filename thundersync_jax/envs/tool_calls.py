"""The tool-call parser: splits an assistant turn into text and validated calls; never raises.

Whatever the model writes, every `<tool_call>...</tool_call>` block becomes either a valid
`ToolCall` or an error string that the agent loop shows the model as that call's
observation, so a malformed turn costs the episode a turn, never a crash. The markers are
the same in both chat formats (`chat.Qwen3Format`, `chat.CompactFormat`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.base import ToolCall, ToolSpec
from thundersync_jax.models.tokenizer import TOOL_CALL, TOOL_CALL_END

MAX_CALL_CHARS = 65_536  # a single call's JSON; longer is an error, not a parse attempt
MAX_CALLS_PER_TURN = 8
_CALL_HINT = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'


@dataclasses.dataclass(frozen=True)
class ParsedCall:
    """One `<tool_call>` block: either a valid `call` or an `error` observation for the model."""

    call: ToolCall | None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn split into free text and its tool-call blocks, in order."""

    content: str
    calls: tuple[ParsedCall, ...]

    @property
    def valid_calls(self) -> tuple[ToolCall, ...]:
        return tuple(p.call for p in self.calls if p.call is not None)


def no_call_error(tools: Sequence[ToolSpec]) -> str:
    """The observation given when an assistant turn contains no tool call at all."""
    # Short on purpose: it recurs in tiny-model contexts; the format is in the system turn.
    return "error: no tool call found; tools: " + ", ".join(t.name for t in tools)


def parse_tool_calls(
    text: str, tools: Sequence[ToolSpec], max_calls: int = MAX_CALLS_PER_TURN
) -> ParsedTurn:
    """Splits assistant text into content and validated tool calls; never raises.

    Every `<tool_call>...</tool_call>` block (an unterminated last block counts too) gives one
    `ParsedCall`: bad JSON, an unknown tool, missing or unexpected arguments each become an
    `error` string that the agent loop shows the model as that call's observation. Blocks
    past `max_calls` collapse into one error.
    """
    specs = {t.name: t for t in tools}
    content: list[str] = []
    parsed: list[ParsedCall] = []
    pos = 0
    skipped = 0
    while True:
        start = text.find(TOOL_CALL, pos)
        if start == -1:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        body_start = start + len(TOOL_CALL)
        end = text.find(TOOL_CALL_END, body_start)
        body = text[body_start:] if end == -1 else text[body_start:end]
        if len(parsed) >= max_calls:
            skipped += 1
        elif end == -1:
            parsed.append(ParsedCall(None, f"error: unterminated tool call. Use {_CALL_HINT}"))
        else:
            parsed.append(_parse_one(body, specs))
        if end == -1:
            break
        pos = end + len(TOOL_CALL_END)
    if skipped:
        parsed.append(
            ParsedCall(
                None,
                f"error: {skipped} tool call(s) beyond the limit of {max_calls} "
                "per turn were not run",
            )
        )
    return ParsedTurn(content="".join(content).strip(), calls=tuple(parsed))


def _parse_one(body: str, specs: dict[str, ToolSpec]) -> ParsedCall:
    if len(body) > MAX_CALL_CHARS:
        return ParsedCall(None, f"error: tool call of {len(body)} chars exceeds {MAX_CALL_CHARS}")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        # RecursionError: deeply nested junk such as '[[[[...' exhausts the JSON decoder.
        return ParsedCall(
            None, f"error: tool call is not valid JSON ({_short(e)}). Use {_CALL_HINT}"
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(None, f'error: tool call needs a string "name". Use {_CALL_HINT}')
    name = obj["name"]
    spec = specs.get(name)
    if spec is None:
        valid = ", ".join(specs) or "(none)"
        return ParsedCall(None, f"error: unknown tool {_short(name)!r}; tools: {valid}")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        # Some models emit the arguments object as a JSON string; accept it when it is one.
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            pass
    if not isinstance(args, dict):
        return ParsedCall(None, f'error: "arguments" of {name} must be a JSON object')
    expected = list(spec.parameters)
    missing = [a for a in expected if a not in args]
    unexpected = [a for a in args if a not in spec.parameters]
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if unexpected:
            problems.append(f"unexpected {', '.join(_short(str(a)) for a in unexpected[:5])}")
        signature = f"{name}({', '.join(expected)})"
        return ParsedCall(None, f"error: bad arguments for {signature}: {'; '.join(problems)}")
    return ParsedCall(ToolCall(name=name, arguments=args))


def _short(x: Any, limit: int = 80) -> str:
    s = str(x)
    return s if len(s) <= limit else s[:limit] + "..."
