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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from thundersync_jax.envs import chat
from thundersync_jax.envs.base import Environment, StepResult, ToolCall, ToolSpec, VerifierResult
from thundersync_jax.models.tokenizer import Tokenizer


class TurnKey(NamedTuple):
    """Identifies one assistant turn for keyed sampling."""

    seed: int
    step: int
    prompt: int
    member: int
    turn: int

    @property
    def episode_ids(self) -> tuple[int, int, int, int]:
        return (self.seed, self.step, self.prompt, self.member)


class Sample(NamedTuple):
    """One sampled assistant turn. `tokens` include the stop token when one was hit."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    policy_version: int


@runtime_checkable
class Sampler(Protocol):
    """Samples one continuation of `prompt_tokens`; safe to call from many threads at once."""

    def sample(self, prompt_tokens: Sequence[int], key_ids: TurnKey, max_new_tokens: int) -> Sample:
        """Returns at most `max_new_tokens` tokens sampled with the key of `key_ids`."""
        ...


ERROR_PREFIX = "error:"  # how environments and the call parser mark a failed call's observation


@dataclasses.dataclass(frozen=True)
class LoopLimits:
    """Budgets of one episode.

    Attributes:
      max_turns: assistant turns before the episode stops.
      max_new_tokens_per_turn: sampling budget of one turn.
      max_traj_tokens: the whole trajectory (prompt, turns, tool results).
      min_turn_tokens: a turn is only started with at least this much room; tool results
        are truncated so that this much stays free for the next turn.
      max_calls_per_turn: tool calls run per turn; more become one error observation.
      max_error_turns: the episode stops (stop reason "errors") after this many error turns
        in a row, 0 = never. An error turn is one whose every observation starts with
        "error:" (no or malformed call, unknown tool, bad arguments, a tool that refused).
        Like SWE-agent's format-error limit; for a small policy it also keeps a failed
        episode to the mistake itself instead of the noise a lost policy emits after it.
    """

    max_turns: int = 6
    max_new_tokens_per_turn: int = 96
    max_traj_tokens: int = 1536
    min_turn_tokens: int = 8
    max_calls_per_turn: int = 4
    max_error_turns: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.name == "max_error_turns":
                if self.max_error_turns < 0:
                    raise ValueError(
                        f"LoopLimits.max_error_turns must be >= 0 (0 = no limit), "
                        f"got {self.max_error_turns}"
                    )
            elif getattr(self, f.name) < 1:
                raise ValueError(f"LoopLimits.{f.name} must be >= 1, got {getattr(self, f.name)}")

    @classmethod
    def from_config(cls, rollout_cfg) -> LoopLimits:
        """From a config's `rollout` section (turn and token budgets)."""
        return cls(
            max_turns=int(rollout_cfg.max_turns),
            max_new_tokens_per_turn=int(rollout_cfg.max_new_tokens_per_turn),
            max_traj_tokens=int(rollout_cfg.max_traj_tokens),
            max_error_turns=int(rollout_cfg.get("max_error_turns", 0)),
        )


@dataclasses.dataclass(frozen=True)
class EpisodeIds:
    """(seed, step, prompt, member): fixes the sampling keys of every turn of the episode."""

    seed: int
    step: int
    prompt: int
    member: int

    def turn_key(self, turn: int) -> TurnKey:
        return TurnKey(self.seed, self.step, self.prompt, self.member, turn)


@dataclasses.dataclass
class Turn:
    """One assistant turn and what its tool calls returned.

    Attributes:
      index: turn number within the episode.
      start: position in the trajectory of the turn's first sampled token.
      tokens / logprobs: the sampled tokens (stop token included when hit) and log-probs.
      finish_reason: the sampler's: "stop" or "length".
      policy_version: version of the weights that sampled the turn.
      text: decoded turn (without the stop token); calls: its parsed tool calls.
      observations: what each call returned (before truncation); empty if not run.
      context_len: tokens appended after the turn (end marker, tool results, next header).
      sample_start / sample_end / tool_start / tool_end: `time.monotonic()` stamps; the tool
        stamps are None until the calls ran (so still None inside `on_turn`).
    """

    index: int
    start: int
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    text: str
    calls: tuple[chat.ParsedCall, ...]
    sample_start: float
    sample_end: float
    observations: list[str] = dataclasses.field(default_factory=list)
    context_len: int = 0
    tool_start: float | None = None
    tool_end: float | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def num_errors(self) -> int:
        return sum(c.error is not None for c in self.calls) + (not self.calls)


@dataclasses.dataclass
class Trajectory:
    """A finished (or, inside `on_turn`, partial) episode as one token sequence.

    Attributes:
      ids: the episode's (seed, step, prompt, member).
      task_id: the environment's task id.
      tokens: int32 [T]; loss_mask: bool [T], True on model-sampled tokens only;
        logprobs: float32 [T], the sampling log-probs where loss_mask, else 0.
      prompt_len: tokens before the first turn.
      turns: the turns, in order; turn j's tokens are tokens[turns[j].start:turns[j].end].
      stop_reason: "done" (a tool ended it), "max_turns", "max_tokens", "errors" (see
        `LoopLimits.max_error_turns`), or "" while running.
      reward / verifier: from `env.verify()`; None while running.
      start_time / end_time / verify_start / verify_end: `time.monotonic()` stamps.
    """

    ids: EpisodeIds
    task_id: str
    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    prompt_len: int
    turns: list[Turn]
    stop_reason: str = ""
    reward: float | None = None
    verifier: VerifierResult | None = None
    start_time: float = 0.0
    end_time: float | None = None
    verify_start: float | None = None
    verify_end: float | None = None

    @property
    def num_tokens(self) -> int:
        """Loss-masked (model-sampled) tokens: n_i of DESIGN §2."""
        return int(self.loss_mask.sum())

    @property
    def policy_versions(self) -> tuple[int, ...]:
        return tuple(t.policy_version for t in self.turns)

    @property
    def policy_version(self) -> int:
        """The one version that sampled every turn; raises if turns disagree (mixed policy)."""
        versions = set(self.policy_versions)
        if len(versions) != 1:
            raise ValueError(f"trajectory {self.ids} has turns from versions {sorted(versions)}")
        return versions.pop()

    def turn_mask(self, j: int) -> np.ndarray:
        """bool [T]: the loss mask restricted to turn j (per-turn OPD gradients)."""
        mask = np.zeros_like(self.loss_mask)
        mask[self.turns[j].start : self.turns[j].end] = True
        return mask


def truncate_text(tok: Tokenizer, text: str, max_tokens: int) -> str:
    """`text` cut in the middle (head and tail kept, a marker between) to encode within
    `max_tokens` tokens; returned unchanged when it already fits."""
    if max_tokens <= 0:
        return ""
    # Bound the work on huge outputs: no token covers more than this many characters here.
    cap = 64 * max_tokens
    if len(text) > cap:
        text = text[: cap // 2] + text[-(cap // 2) :]
    if len(tok.encode(text)) <= max_tokens:
        return text
    n = len(text)

    def cut(keep: int, marker: bool) -> str:
        head, tail = keep - keep // 2, keep // 2
        middle = f"\n[... {n - keep} chars truncated ...]\n" if marker else ""
        return text[:head] + middle + (text[n - tail :] if tail else "")

    for marker in (True, False):
        lo, hi, best = 0, n - 1, None  # largest keep whose cut fits
        while lo <= hi:
            mid = (lo + hi) // 2
            if len(tok.encode(cut(mid, marker))) <= max_tokens:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return cut(best, marker)
    return ""


class Transcript:
    """Builds a trajectory's token sequence; shared by the agent loop and SFT rendering."""

    def __init__(self, tok: Tokenizer, fmt: chat.ChatFormat, limits: LoopLimits):
        self.tok, self.fmt, self.limits = tok, fmt, limits
        self.tokens: list[int] = []
        self.mask: list[bool] = []
        self.logprobs: list[float] = []
        self.end_of_turn_ids = tok.encode(fmt.end_of_turn)

    @property
    def room(self) -> int:
        return self.limits.max_traj_tokens - len(self.tokens)

    def start(self, system: str | None, statement: str, tools: Sequence[ToolSpec]) -> None:
        """Appends the first prompt; the statement is truncated if it would leave no room."""
        overhead = len(self.tok.encode(self.fmt.prompt_text(system, "", tools)))
        budget = self.limits.max_traj_tokens - overhead - self.limits.min_turn_tokens - 1
        if budget < 0:
            raise ValueError(
                f"max_traj_tokens={self.limits.max_traj_tokens} cannot hold the prompt scaffold "
                f"({overhead} tokens) plus min_turn_tokens={self.limits.min_turn_tokens}"
            )
        statement = truncate_text(self.tok, statement, budget)
        self.add_context(self.tok.encode(self.fmt.prompt_text(system, statement, tools)))

    def add_context(self, ids: Sequence[int]) -> None:
        """Tokens the model did not sample (prompt, tool results, markers): mask 0."""
        self.tokens.extend(int(i) for i in ids)
        self.mask.extend([False] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_model(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Tokens the model produced: mask 1 (logprobs 0 for demonstrations)."""
        logprobs = [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs")
        self.tokens.extend(int(i) for i in ids)
        self.mask.extend([True] * len(ids))
        self.logprobs.extend(logprobs)

    def close_turn(self, sampled: Sequence[int]) -> None:
        """Appends the end-of-turn marker when the turn did not end with a stop token."""
        if not sampled or int(sampled[-1]) not in self.tok.stop_ids:
            self.add_context(self.end_of_turn_ids)

    def add_tool_results(self, observations: Sequence[str]) -> bool:
        """Appends the tool results turn and the next assistant header, truncating the
        observations so the next turn keeps `min_turn_tokens`. Returns False (nothing appended) when
        even empty results would not fit."""
        reserve = self.limits.min_turn_tokens + 1  # the next turn, plus its end-of-turn marker
        overhead = len(self.tok.encode(self.fmt.tool_results_text([""] * len(observations))))
        budget = self.room - overhead - reserve
        for _ in range(3):  # subword merges at the seams may cost a few extra tokens
            if budget < 0:
                return False
            fitted = _fit_all(self.tok, observations, budget)
            ids = self.tok.encode(self.fmt.tool_results_text(fitted))
            excess = len(ids) - (self.room - reserve)
            if excess <= 0:
                self.add_context(ids)
                return True
            budget -= excess
        return False

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.asarray(self.tokens, np.int32),
            np.asarray(self.mask, bool),
            np.asarray(self.logprobs, np.float32),
        )


def _fit_all(tok: Tokenizer, observations: Sequence[str], budget: int) -> list[str]:
    """Shares `budget` tokens among observations: short ones whole, long ones cut evenly."""
    lengths = [len(tok.encode(o[: 64 * budget + 64])) for o in observations]
    alloc = [0] * len(observations)
    remaining = budget
    order = sorted(range(len(observations)), key=lambda i: lengths[i])
    for k, i in enumerate(order):
        alloc[i] = min(lengths[i], remaining // (len(order) - k))
        remaining -= alloc[i]
    return [truncate_text(tok, o, a) for o, a in zip(observations, alloc, strict=True)]


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
    prompt_len = len(transcript.tokens)
    turns: list[Turn] = []

    def snapshot(stop_reason: str = "") -> Trajectory:
        tokens, mask, logprobs = transcript.arrays()
        return Trajectory(
            ids=ids,
            task_id=env.task_id,
            tokens=tokens,
            loss_mask=mask,
            logprobs=logprobs,
            prompt_len=prompt_len,
            turns=list(turns),
            stop_reason=stop_reason,
            start_time=start_time,
        )

    stop_reason = "max_turns"
    error_run = 0  # consecutive turns without a well-formed call
    for j in range(limits.max_turns):
        # One token stays free for the end-of-turn marker a length-limited turn needs.
        max_new = min(limits.max_new_tokens_per_turn, transcript.room - 1)
        if max_new < limits.min_turn_tokens:
            stop_reason = "max_tokens"
            break
        key = ids.turn_key(j)
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
        parsed = chat.parse_tool_calls(text, tools, limits.max_calls_per_turn)
        turn = Turn(
            index=j,
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
        )
        turns.append(turn)
        if on_turn is not None:  # the snapshot ends with this turn (and a closing marker)
            on_turn(snapshot(), turn)

        turn.tool_start = time.monotonic()
        done = False
        if not parsed.calls:
            turn.observations.append(chat.no_call_error(tools))
        for parsed_call in parsed.calls:
            if parsed_call.call is None:
                turn.observations.append(parsed_call.error)
                continue
            result = _safe_step(env, parsed_call.call)
            turn.observations.append(result.observation)
            if result.done:
                done = True
                break  # calls after the one that ended the episode are not run
        turn.tool_end = time.monotonic()

        if done:
            stop_reason = "done"
            break
        # An error turn: every observation is an error (unparsable or no call, unknown tool,
        # bad arguments, a tool that refused, e.g. an edit whose old text is not there).
        failed = all(o.startswith(ERROR_PREFIX) for o in turn.observations)
        error_run = error_run + 1 if failed else 0
        if limits.max_error_turns and error_run >= limits.max_error_turns:
            stop_reason = "errors"
            break
        if j == limits.max_turns - 1:
            break  # the last turn's results would never be read
        if not transcript.add_tool_results(turn.observations):
            stop_reason = "max_tokens"
            break
        turn.context_len = len(transcript.tokens) - turn.end

    traj = snapshot(stop_reason)
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
