"""Multi-turn OPD traces: when each turn of each trajectory was scored, and how long it is.

An OPD trajectory is a chain of turns; each turn's segment is the tool output it follows
plus the student's response (the scored tokens). A turn is ready for the learner once the
teacher scored it, which happens while its tool call runs: turn j of a trajectory arrives
at d_0 + ... + d_j, each d a lognormal turn duration (generation + tool). Turn counts are
heavy-tailed (lognormal of spread `turns_sigma`): a few long episodes set the rollout span,
the case streaming per turn is for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class OpdTurn(NamedTuple):
    """One scored turn as the learner sees it.

    Attributes:
      traj_id: the trajectory's id within its step.
      group: prompt group index.
      member: index of the trajectory within its group.
      turn: the turn's index in its trajectory.
      arrival_s: seconds from batch start until the teacher's score of the turn was known.
      start: tokens of the trajectory before this turn's segment.
      tokens: tokens of the segment (observation + response; the first turn holds the prompt).
      scored: response tokens of the segment (its last `scored` tokens), the loss-masked ones.
      last: whether the trajectory ends with this turn.
      step: optimizer step the trajectory belongs to.
    """

    traj_id: int
    group: int
    member: int
    turn: int
    arrival_s: float
    start: int
    tokens: int
    scored: int
    last: bool
    step: int = 0


def validate_opd_trace(trace: Sequence[OpdTurn]) -> None:
    """Raises ValueError naming the first bad turn of a one-step OPD trace."""
    if not trace:
        raise ValueError("OPD trace is empty: a batch needs at least one turn")
    by_traj: dict[int, list[OpdTurn]] = {}
    for t in trace:
        if not (math.isfinite(t.arrival_s) and t.arrival_s >= 0):
            raise ValueError(f"traj {t.traj_id} turn {t.turn}: arrival_s={t.arrival_s} bad")
        if not 1 <= t.scored < t.tokens:
            raise ValueError(
                f"traj {t.traj_id} turn {t.turn}: scored={t.scored} must be in [1, tokens="
                f"{t.tokens}) (a segment needs an observation token before its response)"
            )
        by_traj.setdefault(t.traj_id, []).append(t)
    for tid, turns in by_traj.items():
        turns.sort(key=lambda t: t.turn)
        if [t.turn for t in turns] != list(range(len(turns))) or not turns[-1].last:
            raise ValueError(f"traj {tid}: turns {[t.turn for t in turns]} must be 0..n-1, last")
        if sum(t.last for t in turns) != 1 or len({(t.group, t.member) for t in turns}) != 1:
            raise ValueError(f"traj {tid}: one last turn and one (group, member) expected")
        pos = 0
        for t in turns:
            if t.start != pos or (t.turn and t.arrival_s < turns[t.turn - 1].arrival_s):
                raise ValueError(f"traj {tid} turn {t.turn}: start {t.start} != {pos} or early")
            pos += t.tokens


def trajectories(trace: Sequence[OpdTurn]) -> dict[int, list[OpdTurn]]:
    """Turns by trajectory id, each list in turn order."""
    out: dict[int, list[OpdTurn]] = {}
    for t in sorted(trace, key=lambda t: (t.traj_id, t.turn)):
        out.setdefault(t.traj_id, []).append(t)
    return out


def opd_trace(
    num_groups: int,
    group_size: int,
    sigma: float,
    group_icc: float,
    turns_sigma: float,
    mean_turns: float,
    mean_tokens: int,
    max_tokens: int,
    seed: int,
    *,
    max_segment: int | None = None,
    mean_s: float = 1.0,
    step: int = 0,
) -> list[OpdTurn]:
    """A synthetic multi-turn OPD batch (see the module docstring).

    log d = mu + g_k + e_ij: g_k ~ N(0, icc·sigma²) per group, e_ij ~ N(0, (1 − icc)·sigma²)
    per turn, mu making the mean turn duration `mean_s`. Turn counts: round(lognormal of
    median `mean_turns`·exp(−turns_sigma²/2), spread `turns_sigma`), at least 1. Segment
    tokens: lognormal around `mean_tokens` (spread 0.35), at least 4 and at most
    `max_segment`, half of them scored; a trajectory that would pass `max_tokens` ends at
    the turn before (a truncated episode).
    """
    if num_groups < 1 or group_size < 1 or mean_turns < 1 or mean_tokens < 4:
        raise ValueError(
            f"num_groups={num_groups}, group_size={group_size} must be >= 1, mean_turns="
            f"{mean_turns} >= 1 and mean_tokens={mean_tokens} >= 4"
        )
    if sigma < 0 or turns_sigma < 0 or not 0.0 <= group_icc <= 1.0:
        raise ValueError(f"sigma={sigma}, turns_sigma={turns_sigma} >= 0; icc={group_icc} in [0,1]")
    max_segment = int(max_segment or max_tokens)
    if max_tokens < 8 or max_segment < 4:
        raise ValueError(f"max_tokens={max_tokens} must be >= 8, max_segment={max_segment} >= 4")
    rng = np.random.default_rng(seed)
    group_effect = rng.normal(0.0, sigma * math.sqrt(group_icc), size=num_groups)
    out: list[OpdTurn] = []
    for k in range(num_groups):
        for m in range(group_size):
            mu_n = math.log(mean_turns) - 0.5 * turns_sigma**2
            n = max(1, int(round(math.exp(rng.normal(mu_n, turns_sigma)))))
            own = rng.normal(0.0, sigma * math.sqrt(1.0 - group_icc), size=n)
            durations = mean_s * np.exp(group_effect[k] + own - 0.5 * sigma**2)
            seg = np.rint(mean_tokens * np.exp(rng.normal(-0.06, 0.35, size=n)))
            seg = np.clip(seg, 4, max_segment).astype(int)
            tid, pos, t = k * group_size + m, 0, 0.0
            for j in range(n):
                if j and pos + seg[j] > max_tokens:
                    break
                t += float(durations[j])
                out.append(
                    OpdTurn(tid, k, m, j, t, pos, int(seg[j]), int(seg[j]) // 2, False, step)
                )
                pos += int(seg[j])
            out[-1] = out[-1]._replace(last=True)
    return out
