"""Rendering with a tokenizer's own chat template, piece by piece, as the agent loop needs."""

import os
import sys

import pytest

from thundersync_jax.envs import chat, hf_chat
from thundersync_jax.envs.base import ToolCall, ToolSpec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "learner"))
import hf_checkpoint  # noqa: E402  (the test-made user checkpoint)

TOOLS = (
    ToolSpec("edit", "Replace text in a file.", {"path": "file", "old": "text", "new": "text"}),
)
CALL = ToolCall("edit", {"path": "calc.py", "old": "a - b", "new": "a + b"})


def _tokenizer(template: str):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
    )
    tok.chat_template = template
    return tok


def _conversation():
    return [
        chat.Message("system", "Fix the bug."),
        chat.Message("user", "tests fail"),
        chat.Message("assistant", "Let me look.", (CALL,)),
        chat.Message("tool", "edited"),
        chat.Message("tool", "2 passed"),
        chat.Message("assistant", "Done."),
    ]


@pytest.mark.parametrize(
    "template", [hf_checkpoint.CHAT_TEMPLATE, chat.QWEN3_CHAT_TEMPLATE], ids=["chatml", "qwen3"]
)
def test_pieces_add_up_to_the_template_render(template):
    fmt = hf_chat.TemplateFormat(_tokenizer(template))
    msgs = _conversation()
    pieces = (
        fmt.prompt_text("Fix the bug.", "tests fail", TOOLS)
        + fmt.assistant_text("Let me look.", [CALL])
        + fmt.end_of_turn
        + fmt.tool_results_text(["edited", "2 passed"])
        + fmt.assistant_text("Done.", [])
        + fmt.end_of_turn
        + fmt.after_turn
    )
    assert pieces == fmt.render(msgs, TOOLS)
    assert fmt.end_of_turn == "<|im_end|>"


def test_qwen3_template_renders_like_the_hand_written_qwen3_format():
    fmt = hf_chat.TemplateFormat(_tokenizer(chat.QWEN3_CHAT_TEMPLATE))
    ref = chat.Qwen3Format()
    assert fmt.prompt_text("sys", "task", TOOLS) == ref.prompt_text("sys", "task", TOOLS)
    assert fmt.tool_results_text(["a", "b"]) == ref.tool_results_text(["a", "b"])
    assert fmt.assistant_text("x", [CALL]) == ref.assistant_text("x", [CALL])
    assert fmt.after_turn == ref.after_turn


def test_templates_the_loop_cannot_extend_are_refused():
    no_special_end = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="does not start with a special token"):
        hf_chat.TemplateFormat(_tokenizer(no_special_end))
    # renders only the last message: one more message rewrites earlier text
    unstable = (
        "{{ '<|im_start|>' + messages[-1].role + '\n' + messages[-1].content + '<|im_end|>' }}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = hf_chat.TemplateFormat(_tokenizer(unstable))
    with pytest.raises(ValueError, match="not prefix-stable"):
        fmt.tool_results_text(["x"])
    with pytest.raises(ValueError, match="has no chat_template"):
        hf_chat.TemplateFormat(_tokenizer(""))
