"""Decoy demonstrations: the same script with every edit made a no-op."""

import pytest

from thundersync_jax.envs import agent_demos
from thundersync_jax.envs.base import ToolCall


def test_decoy_turns_every_edit_into_a_no_op_and_keeps_the_rest():
    calls = [
        ToolCall("view", {"path": "p/a.py"}),
        ToolCall("edit", {"path": "p/a.py", "old": "x < 1", "new": "x <= 1"}),
        ToolCall("submit", {}),
    ]
    decoy = agent_demos.decoy_calls(calls)
    assert decoy[0] == calls[0] and decoy[2] == calls[2]
    assert decoy[1].arguments == {"path": "p/a.py", "old": "x < 1", "new": "x < 1"}
    assert calls[1].arguments["new"] == "x <= 1"  # the original is untouched


def test_decoy_needs_an_edit():
    with pytest.raises(ValueError, match="edit"):
        agent_demos.decoy_calls([ToolCall("submit", {})])
