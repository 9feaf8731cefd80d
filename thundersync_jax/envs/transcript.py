"""A trajectory's token sequence as it is built: prompt, sampled turns, tool results.

`Transcript` is shared by the agent loop and SFT rendering (`agent_demos.py`), so a
demonstration and a sampled episode lay out their tokens identically. Tool results and the
task statement are cut in the middle (`truncate_text`) so the trajectory budget always
leaves room for the next turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from thundersync_jax.envs import chat
from thundersync_jax.envs.base import ToolSpec
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.models.tokenizer import Tokenizer


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
