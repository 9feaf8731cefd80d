"""The tool-call parser turns any input into calls or error observations, and never raises."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_jax.envs import chat, tool_calls
from thundersync_jax.envs.base import ToolCall, ToolSpec

TOOLS = (
    ToolSpec("bash", "Run a shell command.", {"command": "the command line"}),
    ToolSpec("edit", "Replace text in a file.", {"path": "file", "old": "text", "new": "text"}),
    ToolSpec("submit", "Finish the episode.", {}),
)


_json_scalars = st.one_of(st.text(max_size=30), st.integers(), st.booleans(), st.none())
_args = st.fixed_dictionaries({"path": _json_scalars, "old": st.text(), "new": st.text()})


@settings(max_examples=100, deadline=None)
@given(args=_args, content=st.text(max_size=40).filter(lambda s: "<tool_call>" not in s))
def test_parse_roundtrips_formatted_calls(args, content):
    call = ToolCall("edit", args)
    for fmt in (chat.Qwen3Format(), chat.CompactFormat()):
        parsed = tool_calls.parse_tool_calls(fmt.assistant_text(content, [call, call]), TOOLS)
        assert parsed.valid_calls == (call, call)
        assert parsed.content == content.strip()


def _error(text):
    parsed = tool_calls.parse_tool_calls(text, TOOLS)
    assert len(parsed.calls) == 1 and parsed.calls[0].call is None
    return parsed.calls[0].error


def test_parse_errors_are_observations():
    assert "not valid JSON" in _error('<tool_call>{"name": "bash", </tool_call>')
    assert "unknown tool 'rm'; tools: bash, edit, submit" in _error(
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    )
    err = _error('<tool_call>{"name": "edit", "arguments": {"path": "a", "x": 1}}</tool_call>')
    assert err == "error: bad arguments for edit(path, old, new): missing old, new; unexpected x"
    assert '"name"' in _error("<tool_call>[1, 2]</tool_call>")
    assert "must be a JSON object" in _error(
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>'
    )
    assert "unterminated" in _error('<tool_call>{"name": "bash", "arguments": {"comm')
    assert tool_calls.parse_tool_calls("I will just talk.", TOOLS).calls == ()
    assert "no tool call found" in tool_calls.no_call_error(TOOLS)


def test_parse_accepts_arguments_as_json_string():
    text = '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert tool_calls.parse_tool_calls(text, TOOLS).valid_calls == (
        ToolCall("bash", {"command": "ls"}),
    )


def test_parse_hostile_inputs():
    deep = "<tool_call>" + "[" * 60_000 + "</tool_call>"
    assert "not valid JSON" in _error(deep)
    huge = '<tool_call>{"name": "bash", "arguments": {"command": "' + "x" * 100_000 + '"}}'
    assert "exceeds" in _error(huge + "</tool_call>")
    assert "not valid JSON" in _error(
        '<tool_call>{"name": "bash", "a": 1' + "9" * 5000 + "}</tool_call>"
    )
    many = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>' * 20
    parsed = tool_calls.parse_tool_calls(many, TOOLS, max_calls=3)
    assert len(parsed.valid_calls) == 3
    assert parsed.calls[-1].error.startswith("error: 17 tool call(s) beyond the limit of 3")
    # A long run of markers stays linear time and never raises.
    tool_calls.parse_tool_calls("<tool_call></tool_call>" * 50_000 + "<tool_call" * 50_000, TOOLS)


_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", "[", '"name"', ":", '"bash"', '"arguments"',
     '{"command": "ls"}', ",", "\\", '"', "null", "1e999", "\n", "<|im_end|>"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_fragments, st.text(max_size=5)), max_size=40))
def test_parse_fuzz_never_raises(pieces):
    parsed = tool_calls.parse_tool_calls("".join(pieces), TOOLS)
    for p in parsed.calls:
        assert (p.call is None) != (p.error is None)
        if p.call is not None:
            assert p.call.name in {t.name for t in TOOLS}
            assert set(p.call.arguments) == set(
                next(t for t in TOOLS if t.name == p.call.name).parameters
            )
            json.dumps(p.call.arguments)
