"""Arrival traces: when each trajectory of a batch finished, how long it is, what it scored.

A trace is a list of `Arrival` records, one per trajectory, with times measured
from the batch start (t = 0, every rollout starts). On disk it is JSONL, one
record per line, tagged with the optimizer step, so one file can hold a whole
training run and the benchmark can replay any of its steps.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np


class Arrival(NamedTuple):
    """One finished trajectory as the learner sees it.

    Attributes:
      traj_id: unique id of the trajectory within its step.
      group: prompt group index.
      member: index of the trajectory within its group.
      arrival_s: seconds from batch start until its reward was known.
      tokens: loss-masked tokens, the driver of its learner cost.
      reward: its scalar reward.
      step: optimizer step the trajectory belongs to.
    """

    traj_id: int
    group: int
    member: int
    arrival_s: float
    tokens: int
    reward: float
    step: int = 0


def validate_trace(trace: Sequence[Arrival]) -> None:
    """Raises ValueError naming the first bad record of a one-step trace."""
    if not trace:
        raise ValueError("trace is empty: a batch needs at least one trajectory")
    steps = {a.step for a in trace}
    if len(steps) > 1:
        raise ValueError(f"trace mixes steps {sorted(steps)}; pass one step (see split_steps)")
    seen_ids: set[int] = set()
    seen_members: set[tuple[int, int]] = set()
    for a in trace:
        if a.traj_id in seen_ids:
            raise ValueError(f"traj_id={a.traj_id} appears twice in the trace")
        if (a.group, a.member) in seen_members:
            raise ValueError(f"group={a.group} member={a.member} appears twice in the trace")
        if not (math.isfinite(a.arrival_s) and a.arrival_s >= 0):
            raise ValueError(
                f"traj_id={a.traj_id}: arrival_s={a.arrival_s} must be finite and >= 0"
            )
        if a.tokens < 0:
            raise ValueError(f"traj_id={a.traj_id}: tokens={a.tokens} must be >= 0")
        if not math.isfinite(a.reward):
            raise ValueError(f"traj_id={a.traj_id}: reward={a.reward} must be finite")
        seen_ids.add(a.traj_id)
        seen_members.add((a.group, a.member))


def _to_record(a: Arrival) -> dict:
    return {
        "step": int(a.step),
        "traj_id": int(a.traj_id),
        "group": int(a.group),
        "member": int(a.member),
        "arrival_s": float(a.arrival_s),
        "tokens": int(a.tokens),
        "reward": float(a.reward),
    }


def write_trace(path: str | os.PathLike, trace: Iterable[Arrival], append: bool = False) -> None:
    """Writes (or appends) one JSON object per trajectory to `path`, then fsyncs.

    The parent directory is created if needed.
    """
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for a in trace:
            f.write(json.dumps(_to_record(a)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_trace(path: str | os.PathLike, step: int | None = None) -> list[Arrival]:
    """Reads a JSONL trace; with `step`, only that step's records.

    Consecutive records of one step form a block; a repeated traj_id also starts a
    new block. A later block of a step replaces the earlier one (a resumed run
    re-exports the steps it redoes), so every step is read once, in order of
    first appearance.
    """
    blocks: dict[int, list[Arrival]] = {}
    current: int | None = None
    block_ids: set[int] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                a = Arrival(
                    traj_id=int(rec["traj_id"]),
                    group=int(rec["group"]),
                    member=int(rec["member"]),
                    arrival_s=float(rec["arrival_s"]),
                    tokens=int(rec["tokens"]),
                    reward=float(rec["reward"]),
                    step=int(rec.get("step", 0)),
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{path}:{lineno}: not a trace record ({e}): {line[:200]!r}"
                ) from e
            if a.step != current or a.traj_id in block_ids:
                current, block_ids = a.step, set()
                blocks[a.step] = []  # a new block; drops an earlier block of this step
            blocks[a.step].append(a)
            block_ids.add(a.traj_id)
    if step is not None:
        return blocks.get(step, [])
    return [a for block in blocks.values() for a in block]


def split_steps(trace: Iterable[Arrival]) -> dict[int, list[Arrival]]:
    """Groups a multi-step trace by step, steps in ascending order."""
    by_step: dict[int, list[Arrival]] = {}
    for a in trace:
        by_step.setdefault(a.step, []).append(a)
    return dict(sorted(by_step.items()))


def lognormal_trace(
    num_groups: int,
    group_size: int,
    sigma: float,
    group_icc: float,
    mean_s: float,
    seed: int,
    *,
    mean_tokens: int = 1024,
    token_sigma: float = 0.25,
    step: int = 0,
) -> list[Arrival]:
    """A synthetic batch with lognormal rollout durations and binary rewards.

    log duration = mu + g_k + e_i with g_k ~ N(0, icc·sigma²) shared by group k and
    e_i ~ N(0, (1 − icc)·sigma²) per trajectory, so log durations have variance
    sigma² and intra-group correlation `group_icc`; mu makes the mean duration
    `mean_s`. Token counts are proportional to duration (agent rollouts are
    decode-bound) times an independent lognormal factor of spread `token_sigma`,
    scaled so their mean is about `mean_tokens`. Each group draws a success rate
    p_k ~ U(0, 1) and rewards are Bernoulli(p_k) in {0.0, 1.0}.

    Args:
      num_groups: prompts in the batch (K).
      group_size: trajectories per prompt (G).
      sigma: standard deviation of log duration.
      group_icc: share of the log-duration variance that is per group, in [0, 1].
      mean_s: mean rollout duration in seconds.
      seed: numpy random seed; the same arguments give the same trace.
      mean_tokens: target mean loss-masked tokens per trajectory.
      token_sigma: spread of the token count around its duration-proportional value.
      step: step tag of the records.
    """
    if num_groups < 1 or group_size < 1:
        raise ValueError(f"num_groups={num_groups}, group_size={group_size}: both must be >= 1")
    if sigma < 0 or token_sigma < 0:
        raise ValueError(f"sigma={sigma}, token_sigma={token_sigma} must be >= 0")
    if not 0.0 <= group_icc <= 1.0:
        raise ValueError(f"group_icc={group_icc} must be in [0, 1]")
    if mean_s <= 0 or mean_tokens < 1:
        raise ValueError(f"mean_s={mean_s} must be > 0 and mean_tokens={mean_tokens} >= 1")
    rng = np.random.default_rng(seed)
    group_effect = rng.normal(0.0, sigma * math.sqrt(group_icc), size=(num_groups, 1))
    own_effect = rng.normal(0.0, sigma * math.sqrt(1.0 - group_icc), size=(num_groups, group_size))
    log_d = math.log(mean_s) - 0.5 * sigma**2 + group_effect + own_effect
    durations = np.exp(log_d)
    token_noise = rng.normal(-0.5 * token_sigma**2, token_sigma, size=durations.shape)
    tokens = np.maximum(1, np.rint(mean_tokens * durations / mean_s * np.exp(token_noise)))
    success = rng.uniform(0.0, 1.0, size=(num_groups, 1))
    rewards = (rng.uniform(0.0, 1.0, size=durations.shape) < success).astype(float)
    return [
        Arrival(
            traj_id=k * group_size + i,
            group=k,
            member=i,
            arrival_s=float(durations[k, i]),
            tokens=int(tokens[k, i]),
            reward=float(rewards[k, i]),
            step=step,
        )
        for k in range(num_groups)
        for i in range(group_size)
    ]
