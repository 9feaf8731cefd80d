"""Transcript: token layout of prompt, sampled turns and tool results; middle truncation."""

import numpy as np
import pytest

from thundersync_jax.envs import chat
from thundersync_jax.envs.base import ToolSpec
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.envs.transcript import Transcript, truncate_text
from thundersync_jax.models import tokenizer

TOOLS = (ToolSpec("add", "adds to the counter", {"amount": "how much"}),)


def test_truncate_text_keeps_head_and_tail_within_the_budget():
    tok = tokenizer.ByteTokenizer()
    text = "HEAD" + "x" * 997 + "TAIL"  # 1005 bytes: one token each
    out = truncate_text(tok, text, 100)
    assert len(tok.encode(out)) <= 100
    assert out.startswith("HEAD") and out.endswith("TAIL")
    cut = int(out.split("[... ")[1].split(" chars")[0])
    assert len(out) - len(f"\n[... {cut} chars truncated ...]\n") == len(text) - cut
    assert truncate_text(tok, "short", 100) == "short"
    assert truncate_text(tok, text, 0) == ""


def test_layout_masks_only_sampled_tokens():
    tok = tokenizer.ByteTokenizer()
    limits = LoopLimits(max_traj_tokens=400)
    tr = Transcript(tok, chat.get_format(tok), limits)
    tr.start(None, "make it 2", TOOLS)
    prompt = len(tr.tokens)
    sampled = tok.encode("hello")  # no stop token: close_turn appends the end marker
    tr.add_model(sampled, [-0.5] * len(sampled))
    tr.close_turn(sampled)
    assert tr.add_tool_results(["counter=2"])
    tokens, mask, logprobs = tr.arrays()
    assert tokens.dtype == np.int32 and mask.dtype == bool and logprobs.dtype == np.float32
    assert np.flatnonzero(mask).tolist() == list(range(prompt, prompt + len(sampled)))
    np.testing.assert_array_equal(logprobs[mask], np.float32(-0.5))
    assert not logprobs[~mask].any()
    fmt = chat.get_format(tok)
    expected = (
        fmt.prompt_text(None, "make it 2", TOOLS)
        + "hello"
        + fmt.end_of_turn
        + fmt.tool_results_text(["counter=2"])
    )
    assert tok.decode(tokens) == expected


def test_tool_results_leave_room_for_the_next_turn_or_are_refused():
    tok = tokenizer.ByteTokenizer()
    limits = LoopLimits(max_traj_tokens=300, min_turn_tokens=8)
    tr = Transcript(tok, chat.get_format(tok), limits)
    tr.start(None, "task", TOOLS)
    assert tr.add_tool_results(["y" * 5000])
    assert tr.room >= limits.min_turn_tokens + 1
    before = list(tr.tokens)
    tr.add_context([0] * (tr.room - 3))  # almost full: not even empty results fit
    filled = list(tr.tokens)
    assert not tr.add_tool_results(["z"])
    assert tr.tokens == filled and filled[: len(before)] == before  # nothing appended


def test_prompt_scaffold_larger_than_the_budget_is_a_clear_error():
    tok = tokenizer.ByteTokenizer()
    tr = Transcript(tok, chat.get_format(tok), LoopLimits(max_traj_tokens=20))
    with pytest.raises(ValueError, match="cannot hold the prompt scaffold"):
        tr.start("a long system message " * 3, "task", TOOLS)


def test_demonstration_tokens_need_matching_logprobs():
    tok = tokenizer.ByteTokenizer()
    tr = Transcript(tok, chat.get_format(tok), LoopLimits())
    with pytest.raises(ValueError, match="3 tokens but 2 logprobs"):
        tr.add_model([1, 2, 3], [0.0, 0.0])
