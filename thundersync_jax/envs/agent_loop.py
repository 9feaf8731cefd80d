"""The multi-turn agent loop: sample a turn, run its tool calls, append the results, repeat.

    sampler = agent_samplers.GenerateSampler(model, sp, pad_id=tok.pad_id)
    traj = agent_loop.run_episode(env, sampler, tok, ids=EpisodeIds(seed, step, k, i))
    for traj in agent_loop.run_episodes(episodes, sampler, tok, max_concurrency=16): ...

A trajectory is one token sequence: the prompt, then per turn the sampled tokens
(loss-masked, with their sampling log-probs) followed by context tokens the model did not
sample (an end-of-turn marker when the turn hit the length limit, the tool results turn and
the next assistant header). Tool results are truncated to fit the trajectory budget so the
next turn always has room. The reward comes from `env.verify()` once the episode ends.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator

from thundersync_jax.envs import chat, tool_calls
from thundersync_jax.envs.base import Environment, StepResult, ToolCall, ToolSpec, VerifierResult
from thundersync_jax.envs.trajectory import (
    EpisodeIds,
    LoopLimits,
    Sample,
    Sampler,
    Trajectory,
    Turn,
    TurnKey,
    route_array,
)
from thundersync_jax.envs.transcript import Transcript
from thundersync_jax.models.tokenizer import Tokenizer

ERROR_PREFIX = "error:"  # how environments and the call parser mark a failed call's observation


def _safe_step(env: Environment, call: ToolCall) -> StepResult:
    """env.step, with an environment bug turned into an observation instead of a crash."""
    try:
        result = env.step(call)
    except Exception as e:  # the Environment contract says step never raises; defend anyway
        return StepResult(f"error: tool {call.name} failed: {type(e).__name__}: {e}")
    if not isinstance(result, StepResult):
        return StepResult(f"error: tool {call.name} returned {type(result).__name__}")
    return result


def _safe_verify(env: Environment) -> VerifierResult:
    try:
        return env.verify()
    except Exception as e:  # the contract says verify never raises; a bug must not kill a batch
        return VerifierResult(0.0, "verifier raised", error=f"{type(e).__name__}: {e}")


def _check_sample(sample: Sample, max_new_tokens: int, key: TurnKey) -> None:
    if len(sample.tokens) != len(sample.logprobs):
        raise ValueError(
            f"sampler returned {len(sample.tokens)} tokens but {len(sample.logprobs)} logprobs "
            f"for {key}"
        )
    if len(sample.tokens) > max_new_tokens:
        raise ValueError(
            f"sampler returned {len(sample.tokens)} tokens for {key}, over max_new_tokens="
            f"{max_new_tokens}"
        )


OnTurn = Callable[[Trajectory, Turn], None]


@dataclasses.dataclass(frozen=True)
class _EpisodeStart:
    """What every snapshot of one episode shares."""

    ids: EpisodeIds
    task_id: str
    prompt_len: int
    start_time: float


def _snapshot(
    start: _EpisodeStart, transcript: Transcript, turns: list[Turn], stop_reason: str = ""
) -> Trajectory:
    """The trajectory so far (a copy of the turn list; the token arrays are fresh)."""
    tokens, mask, logprobs = transcript.arrays()
    return Trajectory(
        ids=start.ids,
        task_id=start.task_id,
        tokens=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_len=start.prompt_len,
        turns=list(turns),
        stop_reason=stop_reason,
        start_time=start.start_time,
        routes=route_array(turns, len(tokens)),
    )


def _sample_turn(
    sampler: Sampler,
    tok: Tokenizer,
    transcript: Transcript,
    tools: tuple[ToolSpec, ...],
    key: TurnKey,
    max_new: int,
) -> Turn:
    """Samples turn `key.turn`, appends it (and its end marker) and parses its tool calls."""
    sample_start = time.monotonic()
    sample = sampler.sample(list(transcript.tokens), key, max_new)
    sample_end = time.monotonic()
    _check_sample(sample, max_new, key)
    turn_start = len(transcript.tokens)
    transcript.add_model(sample.tokens, sample.logprobs)
    transcript.close_turn(sample.tokens)
    body = sample.tokens
    if body and int(body[-1]) in tok.stop_ids:
        body = body[:-1]
    text = tok.decode(body)
    parsed = tool_calls.parse_tool_calls(text, tools, transcript.limits.max_calls_per_turn)
    return Turn(
        index=key.turn,
        start=turn_start,
        tokens=list(sample.tokens),
        logprobs=list(sample.logprobs),
        finish_reason=sample.finish_reason,
        policy_version=sample.policy_version,
        text=text,
        calls=parsed.calls,
        sample_start=sample_start,
        sample_end=sample_end,
        context_len=len(transcript.tokens) - turn_start - len(sample.tokens),
        routes=sample.routes,
    )


def _run_calls(env: Environment, turn: Turn, tools: tuple[ToolSpec, ...]) -> bool:
    """Runs the turn's calls in order, recording observations; True if one ended the episode."""
    turn.tool_start = time.monotonic()
    done = False
    if not turn.calls:
        turn.observations.append(tool_calls.no_call_error(tools))
    for parsed_call in turn.calls:
        if parsed_call.call is None:
            turn.observations.append(parsed_call.error)
            continue
        result = _safe_step(env, parsed_call.call)
        turn.observations.append(result.observation)
        if result.done:
            done = True
            break  # calls after the one that ended the episode are not run
    turn.tool_end = time.monotonic()
    return done


def _is_error_turn(turn: Turn) -> bool:
    """Every observation is an error (unparsable or no call, unknown tool, bad arguments, a
    tool that refused, e.g. an edit whose old text is not there)."""
    return all(o.startswith(ERROR_PREFIX) for o in turn.observations)


def run_episode(
    env: Environment,
    sampler: Sampler,
    tok: Tokenizer,
    ids: EpisodeIds,
    limits: LoopLimits = LoopLimits(),
    system: str | None = None,
    on_turn: OnTurn | None = None,
    fmt: chat.ChatFormat | None = None,
) -> Trajectory:
    """Runs one episode to the end and scores it.

    Args:
      env: the environment (reset here; the caller closes it).
      sampler: where assistant turns come from.
      tok: tokenizer; its `chat_format` picks the template unless `fmt` is given.
      ids: (seed, step, prompt, member) of the episode; turn j samples with ids.turn_key(j).
      limits: turn and token budgets.
      system: optional system message placed before the tool listing.
      on_turn: called as on_turn(trajectory_so_far, turn) right after each turn is sampled,
        before its tools run (so a teacher can score it meanwhile). Runs on the episode's
        thread: enqueue work rather than doing it inline.
      fmt: chat format override.

    Returns:
      The finished Trajectory with reward from env.verify().
    """
    fmt = fmt or chat.get_format(tok)
    start_time = time.monotonic()
    statement = env.reset()
    tools = tuple(env.tools)
    transcript = Transcript(tok, fmt, limits)
    transcript.start(system, statement, tools)
    start = _EpisodeStart(ids, env.task_id, len(transcript.tokens), start_time)
    turns: list[Turn] = []

    stop_reason = "max_turns"
    error_run = 0  # consecutive error turns (see LoopLimits.max_error_turns)
    for j in range(limits.max_turns):
        # One token stays free for the end-of-turn marker a length-limited turn needs.
        max_new = min(limits.max_new_tokens_per_turn, transcript.room - 1)
        if max_new < limits.min_turn_tokens:
            stop_reason = "max_tokens"
            break
        turn = _sample_turn(sampler, tok, transcript, tools, ids.turn_key(j), max_new)
        turns.append(turn)
        if on_turn is not None:  # the snapshot ends with this turn (and a closing marker)
            on_turn(_snapshot(start, transcript, turns), turn)
        if _run_calls(env, turn, tools):
            stop_reason = "done"
            break
        error_run = error_run + 1 if _is_error_turn(turn) else 0
        if limits.max_error_turns and error_run >= limits.max_error_turns:
            stop_reason = "errors"
            break
        if j == limits.max_turns - 1:
            break  # the last turn's results would never be read
        if not transcript.add_tool_results(turn.observations):
            stop_reason = "max_tokens"
            break
        turn.context_len = len(transcript.tokens) - turn.end

    traj = _snapshot(start, transcript, turns, stop_reason)
    traj.verify_start = time.monotonic()
    traj.verifier = _safe_verify(env)
    traj.verify_end = time.monotonic()
    traj.reward = float(traj.verifier.reward)
    traj.end_time = traj.verify_end
    return traj


@dataclasses.dataclass(frozen=True)
class Episode:
    """One episode to run: how to build its environment, and its ids."""

    make_env: Callable[[], Environment]
    ids: EpisodeIds


def run_episodes(
    episodes: Iterable[Episode],
    sampler: Sampler,
    tok: Tokenizer,
    limits: LoopLimits = LoopLimits(),
    system: str | None = None,
    on_turn: OnTurn | None = None,
    max_concurrency: int = 8,
) -> Iterator[Trajectory]:
    """Runs episodes concurrently (one thread each) and yields trajectories as they finish.

    Each environment is built, run and closed on its own thread. Keyed sampling makes the
    trajectories independent of `max_concurrency` and of completion order. An exception in
    one episode (a sampler or reset failure) is raised when that episode would be yielded.
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")

    def run(ep: Episode) -> Trajectory:
        with ep.make_env() as env:
            return run_episode(env, sampler, tok, ep.ids, limits, system, on_turn)

    with concurrent.futures.ThreadPoolExecutor(max_concurrency, "episode") as pool:
        futures = [pool.submit(run, ep) for ep in episodes]
        try:
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
        finally:
            for f in futures:
                f.cancel()
