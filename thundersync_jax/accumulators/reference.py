"""Batch-synchronous float64 numpy reference for the accumulators (tests, notebooks).

Straight from the formulas of DESIGN §2, sharing no code with the streaming
accumulators: wait for the whole batch, compute every advantage from the
complete groups, then ∇L = −(1/Z) Σ_i A_i w_i h_i.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

Trajectory = tuple[int, float, Any, int]  # (group, reward, grad pytree h_i, num_tokens n_i)


def group_advantages(
    rewards: Sequence[float],
    advantage: str | Callable = "grpo",
    eps: float = 1e-6,
    std_ddof: int = 1,
) -> np.ndarray:
    """Advantages of one group's members (float64), verl's conventions.

    A group of one: μ = 0 and σ = 1 (grpo), μ = 0 (drgrpo), baseline 0 (rloo).
    A group of two or more with all-equal rewards: exactly zero (grpo, drgrpo, rloo).
    """
    r = np.asarray(rewards, np.float64)
    n = r.size
    if callable(advantage):
        return np.asarray(advantage(r), np.float64)
    if n >= 2 and np.all(r == r[0]) and advantage in ("grpo", "drgrpo", "rloo", "batch"):
        return np.zeros(n)
    if advantage in ("grpo", "batch"):
        mean, std = (0.0, 1.0) if n == 1 else (r.mean(), r.std(ddof=std_ddof))
        return (r - mean) / (std + eps)
    if advantage == "drgrpo":
        return r - (0.0 if n == 1 else r.mean())
    if advantage == "rloo":
        return r if n == 1 else r - (r.sum() - r) / (n - 1)
    raise ValueError(f"reference has no advantage {advantage!r}")


def loss_weight(loss_agg: str, num_tokens: int) -> float:
    """w_i of a built-in loss_agg mode."""
    if loss_agg == "seq-mean-token-mean":
        return 1.0 / num_tokens if num_tokens > 0 else 0.0
    if loss_agg in ("seq-mean-token-sum", "token-mean", "seq-mean-token-sum-norm"):
        return 1.0
    raise ValueError(f"reference has no loss_agg {loss_agg!r}")


def normalizer(loss_agg: str, num_trajectories: int, num_tokens: int, max_len: int | None) -> float:
    """Z of a built-in loss_agg mode (1 for an empty batch)."""
    if loss_agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
        z = float(num_trajectories)
    elif loss_agg == "token-mean":
        z = float(num_tokens)
    elif loss_agg == "seq-mean-token-sum-norm":
        z = float(num_trajectories) * float(max_len)
    else:
        raise ValueError(f"reference has no loss_agg {loss_agg!r}")
    return z if z > 0 else 1.0


def _weighted_sum(coefficients: Sequence[float], grads: Sequence[Any]):
    def leaf_sum(*leaves):
        out = np.zeros(np.shape(leaves[0]), np.float64)
        for c, leaf in zip(coefficients, leaves, strict=True):
            out += c * np.asarray(leaf, np.float64)
        return out

    return jax.tree.map(leaf_sum, *grads)


def grpo_gradient(
    trajectories: Sequence[Trajectory],
    advantage: str | Callable = "grpo",
    loss_agg: str = "seq-mean-token-mean",
    eps: float = 1e-6,
    std_ddof: int = 1,
    max_len: int | None = None,
):
    """∇L = −(1/Z) Σ_i A_i w_i h_i for a whole batch (float64 pytree like the grads).

    Groups are whoever shares a group id, so a group closed early is simply a
    smaller group. `advantage="batch"` normalises over all trajectories at once.
    """
    if not trajectories:
        raise ValueError("the reference needs at least one trajectory")
    if advantage == "batch":
        rewards = [t[1] for t in trajectories]
        advantages = group_advantages(rewards, "batch", eps, std_ddof)
    else:
        members = defaultdict(list)
        for i, (group, reward, _, _) in enumerate(trajectories):
            members[group].append((i, reward))
        advantages = np.zeros(len(trajectories))
        for items in members.values():
            adv = group_advantages([r for _, r in items], advantage, eps, std_ddof)
            for (i, _), a in zip(items, adv, strict=True):
                advantages[i] = a
    weights = [loss_weight(loss_agg, n) for _, _, _, n in trajectories]
    z = normalizer(loss_agg, len(trajectories), sum(t[3] for t in trajectories), max_len)
    coefficients = [-a * w / z for a, w in zip(advantages, weights, strict=True)]
    return _weighted_sum(coefficients, [t[2] for t in trajectories])


def direct_gradient(
    items: Sequence[tuple[Any, int]],
    coef: float = -1.0,
    loss_agg: str = "token-mean",
    max_len: int | None = None,
):
    """coef · (1/Z) Σ w_i g_i; with the defaults, OPD's −(1/N) Σ_turns grad."""
    if not items:
        raise ValueError("the reference needs at least one item")
    z = normalizer(loss_agg, len(items), sum(n for _, n in items), max_len)
    coefficients = [coef * loss_weight(loss_agg, n) / z for _, n in items]
    return _weighted_sum(coefficients, [g for g, _ in items])


def relative_error(got, want) -> float:
    """‖got − want‖ / ‖want‖ over all leaves (float64)."""
    diff = sum(
        float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )
    norm = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in jax.tree.leaves(want))
    return float(np.sqrt(diff) / max(np.sqrt(norm), 1e-300))
