"""Scripted demonstrations rendered as training transcripts for the supervised warm start.

Each environment's `demonstration()` is played through the environment itself, so the
transcript holds the real tool observations, and rendered with the agent loop's own
`Transcript` (one call per assistant turn): the assistant tokens are exactly what the model
would have to sample in the loop.

    examples = agent_demos.demonstration_examples(make_envs, tok, limits)
    result = sft.train_sft(model_cfg, examples, workdir=DIR, ...)

With `decoys=True` every task also gets a decoy transcript: the same script with each
`edit` call turned into a no-op (new text = old text), played through the environment,
so it shows the still-failing tests and earns reward 0. A warm start on both imitates a
demonstrator that fixes the bug half the time: the policy keeps a real choice at the edit,
well-formed either way, and only the verifier's reward can teach it which one is right.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from thundersync_jax.envs import chat
from thundersync_jax.envs.base import Environment, ToolCall
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.envs.transcript import Transcript
from thundersync_jax.learner.sft import SFTExample
from thundersync_jax.models.tokenizer import Tokenizer


def render_demonstration(
    env: Environment,
    tok: Tokenizer,
    limits: LoopLimits = LoopLimits(),
    system: str | None = None,
    fmt: chat.ChatFormat | None = None,
    decoy: bool = False,
) -> SFTExample:
    """Plays env.demonstration() (or its `decoy_calls` with `decoy`) through `env`, one call
    per assistant turn, and renders it."""
    fmt = fmt or chat.get_format(tok)
    statement = env.reset()
    tools = tuple(env.tools)
    transcript = Transcript(tok, fmt, limits)
    transcript.start(system, statement, tools)
    calls = list(env.demonstration())
    if decoy:
        calls = decoy_calls(calls)
    complete = True
    for j, call in enumerate(calls):
        ids = tok.encode(fmt.assistant_text("", [call]) + fmt.end_of_turn)
        if len(ids) > transcript.room:
            complete = False
            break
        transcript.add_model(ids)
        result = env.step(call)
        if result.done:
            complete = j == len(calls) - 1
            break
        if j < len(calls) - 1 and not transcript.add_tool_results([result.observation]):
            complete = False
            break
    reward = float(env.verify().reward)
    tokens, mask, _ = transcript.arrays()
    return SFTExample(env.task_id, tokens, mask, reward, complete)


def decoy_calls(calls: list[ToolCall]) -> list[ToolCall]:
    """The script with every `edit` made a no-op (new = old); raises if there is no edit."""
    out = [
        ToolCall(c.name, {**c.arguments, "new": c.arguments["old"]})
        if c.name == "edit" and "old" in c.arguments
        else c
        for c in calls
    ]
    if out == calls:
        raise ValueError("a decoy needs a demonstration with an edit(path, old, new) call")
    return out


def demonstration_examples(
    make_envs: Iterable[Callable[[], Environment]],
    tok: Tokenizer,
    limits: LoopLimits = LoopLimits(),
    system: str | None = None,
    require_solved: bool = True,
    decoys: bool = False,
) -> list[SFTExample]:
    """Renders one demonstration per environment factory (each env is closed afterwards).

    With `require_solved`, a demonstration that does not fit the budget or does not earn
    reward 1 raises: training on a broken script would teach the wrong behaviour.
    With `decoys`, each task's decoy transcript (see the module docstring) follows its
    demonstration; a decoy must fit the budget and must not earn reward 1.
    """
    make_envs = list(make_envs)
    examples = []
    for make_env in make_envs:
        with make_env() as env:
            ex = render_demonstration(env, tok, limits, system)
        if require_solved and (not ex.complete or ex.reward < 1.0):
            raise ValueError(
                f"demonstration of task {ex.task_id!r} is not a solved episode "
                f"(reward={ex.reward}, complete={ex.complete}, {len(ex.tokens)} tokens of "
                f"max_traj_tokens={limits.max_traj_tokens})"
            )
        examples.append(ex)
        if decoys:
            with make_env() as env:
                bad = render_demonstration(env, tok, limits, system, decoy=True)
            if not bad.complete or bad.reward >= 1.0:
                raise ValueError(
                    f"decoy of task {bad.task_id!r} is not a failed, complete episode "
                    f"(reward={bad.reward}, complete={bad.complete})"
                )
            examples.append(bad)
    return examples
