"""Chat templates: Qwen3 rendering equals transformers + jinja, incremental pieces equal the full
render (the tool-call parser is tested in tool_calls_test.py)."""

import pytest

from thundersync_jax.envs import chat
from thundersync_jax.envs.base import ToolCall, ToolSpec
from thundersync_jax.models import tokenizer

TOOLS = (
    ToolSpec("bash", "Run a shell command.", {"command": "the command line"}),
    ToolSpec("edit", "Replace text in a file.", {"path": "file", "old": "text", "new": "text"}),
    ToolSpec("submit", "Finish the episode.", {}),
)

CONVERSATION = [
    chat.Message("system", "You fix bugs."),
    chat.Message("user", "Tests fail in calc.py — fix add()."),
    chat.Message("assistant", "", (ToolCall("bash", {"command": "cat calc.py"}),)),
    chat.Message("tool", "def add(a, b):\n    return a - b"),
    chat.Message(
        "assistant",
        "Found it.",
        (
            ToolCall("edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}),
            ToolCall("bash", {"command": 'pytest -q "tests/x y.py"'}),
        ),
    ),
    chat.Message("tool", "ok"),
    chat.Message("tool", "1 passed ✓"),
    chat.Message("assistant", "", (ToolCall("submit", {}),)),
]


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bpe"))
    corpus = [chat.Qwen3Format().render(CONVERSATION, TOOLS)] * 4
    return tokenizer.train_bpe(corpus, out, vocab_size=353, chat_template=chat.QWEN3_CHAT_TEMPLATE)


def _hf_render(hf_tok, messages, tools, add_generation_prompt, **kw):
    return hf_tok.hf.apply_chat_template(
        [m.to_hf() for m in messages],
        tools=[chat.tool_schema(t) for t in tools] or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kw,
    )


@pytest.mark.parametrize(
    "messages,tools,gen",
    [
        (CONVERSATION, TOOLS, False),
        (CONVERSATION, TOOLS, True),
        (CONVERSATION[1:], TOOLS, True),  # tools without a system message
        (CONVERSATION[:2], (), True),  # system, no tools
        (CONVERSATION[1:4], (), False),  # no system, no tools
        ([chat.Message("user", "hi"), chat.Message("system", "late system")], (), True),
    ],
)
def test_qwen3_render_matches_transformers_jinja(hf_tok, messages, tools, gen):
    ours = chat.Qwen3Format().render(messages, tools, add_generation_prompt=gen)
    assert ours == _hf_render(hf_tok, messages, tools, gen)


def test_qwen3_no_thinking_prompt_matches_transformers(hf_tok):
    ours = chat.Qwen3Format(enable_thinking=False).render(CONVERSATION[:2], TOOLS, True)
    assert ours == _hf_render(hf_tok, CONVERSATION[:2], TOOLS, True, enable_thinking=False)
    assert ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_known_layout():
    """Hand-checked pieces of Qwen3's layout, independent of our jinja string."""
    text = chat.Qwen3Format().render(CONVERSATION[:4], TOOLS)
    assert text.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools\n\nYou may call")
    assert '\n{"type": "function", "function": {"name": "bash", ' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": '
        '{"command": "cat calc.py"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\ndef add(a, b):\n    return a - b\n"
        "</tool_response><|im_end|>\n"
    )


@pytest.mark.parametrize("fmt", [chat.Qwen3Format(), chat.CompactFormat()], ids=lambda f: f.name)
def test_incremental_pieces_equal_full_render(fmt):
    """The agent loop's prompt + sampled turn + end + tool results equals render()."""
    text = fmt.prompt_text("You fix bugs.", CONVERSATION[1].content, TOOLS)
    history = CONVERSATION[:2]
    i = 2
    while i < len(CONVERSATION):
        turn = CONVERSATION[i]
        text += fmt.assistant_text(turn.content, turn.tool_calls) + fmt.end_of_turn
        history = history + [turn]
        i += 1
        results = []
        while i < len(CONVERSATION) and CONVERSATION[i].role == "tool":
            results.append(CONVERSATION[i].content)
            history = history + [CONVERSATION[i]]
            i += 1
        if results:
            text += fmt.tool_results_text(results)
            assert text == fmt.render(history, TOOLS, add_generation_prompt=True)
    # The trajectory ends at the last end-of-turn; render() adds only the trailing newline.
    assert text + fmt.after_turn == fmt.render(history, TOOLS)


def test_compact_is_short_and_uses_role_ids():
    tok = tokenizer.ByteTokenizer()
    compact = tok.encode(chat.CompactFormat().render(CONVERSATION, TOOLS))
    qwen = tok.encode(chat.Qwen3Format().render(CONVERSATION, TOOLS))
    assert len(compact) < len(qwen) // 2
    text = chat.CompactFormat().render(CONVERSATION[:2], TOOLS, add_generation_prompt=True)
    assert text == (
        "<|system|>You fix bugs.\ntools: bash(command) edit(path,old,new) submit()<|im_end|>"
        "<|user|>Tests fail in calc.py — fix add().<|im_end|><|assistant|>"
    )
    assert chat.apply_chat_template(tok, CONVERSATION[:2], TOOLS) == tok.encode(text)


def test_apply_chat_template_hf_matches_transformers_ids(hf_tok):
    ours = chat.apply_chat_template(hf_tok, CONVERSATION, TOOLS, add_generation_prompt=True)
    theirs = hf_tok.hf.apply_chat_template(
        [m.to_hf() for m in CONVERSATION],
        tools=[chat.tool_schema(t) for t in TOOLS],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    assert ours == list(theirs)
