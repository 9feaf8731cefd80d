"""What an episode is made of: its ids and budgets, the sampler contract, turns, trajectories.

These are the plain records the agent loop (`agent_loop.py`) produces and the learner side
consumes; beyond checking and viewing their own fields they hold no behaviour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from thundersync_jax.envs.base import VerifierResult
from thundersync_jax.envs.tool_calls import ParsedCall


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
    """One sampled assistant turn. `tokens` include the stop token when one was hit.

    `routes` (MoE policies, engines that report them): int [len(prompt) + len(tokens) - 1,
    M, K], the experts every fed token was routed to (`protocol.GenerateResult.routes`).
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    policy_version: int
    routes: np.ndarray | None = None


@runtime_checkable
class Sampler(Protocol):
    """Samples one continuation of `prompt_tokens`; safe to call from many threads at once."""

    def sample(self, prompt_tokens: Sequence[int], key_ids: TurnKey, max_new_tokens: int) -> Sample:
        """Returns at most `max_new_tokens` tokens sampled with the key of `key_ids`."""
        ...


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
            max_error_turns=int(rollout_cfg.max_error_turns),
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
    calls: tuple[ParsedCall, ...]
    sample_start: float
    sample_end: float
    observations: list[str] = dataclasses.field(default_factory=list)
    context_len: int = 0
    tool_start: float | None = None
    tool_end: float | None = None
    routes: np.ndarray | None = None  # the sample's routes (see `Sample`), None if none

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
      routes: MoE policies: int32 [T, M, K], the experts the engine routed token t to in
        each MoE layer (from the latest turn's request, which covers every earlier token);
        -1 where the engine reported none (tokens after the last sampled one). None: no
        routes at all (a dense policy or an engine that does not report them).
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
    routes: np.ndarray | None = None

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


def route_array(turns: Sequence[Turn], num_tokens: int) -> np.ndarray | None:
    """[num_tokens, M, K] int32 routes of the latest turn that has some, -1 past them."""
    latest = next((t.routes for t in reversed(turns) if t.routes is not None), None)
    if latest is None:
        return None
    latest = np.asarray(latest, np.int32)[:num_tokens]
    out = np.full((num_tokens, *latest.shape[1:]), -1, np.int32)
    out[: len(latest)] = latest
    return out
