"""GRPO with a group's shared prompt forwarded once and backpropagated once (DESIGN §2).

The G members of a group share their prompt. Member i's gradient splits (reverse mode is
linear) into its own part h_i (its completion, prompt K/V held fixed) and J_pᵀ dKV_i, with
J_p the prompt's forward and dKV_i member i's cotangent for the prompt's keys/values. The GRPO
gradient of the group is −(1/Z) Σ_i A_i w_i (h_i + J_pᵀ dKV_i). For an affine estimator,
A_i = scale·(r_i − c) + offset in the accumulator's shifted coordinates, so

    Σ_i A_i w_i dKV_i = scale · Σ_i (r_i − c) w_i dKV_i + offset · Σ_i w_i dKV_i

needs two prompt-sized tallies (not parameter-sized), and the prompt is backpropagated once
when the group closes, with the same (scale, offset) the gradient tallies get. h_i goes into
the ordinary `accumulators.grpo` as each member's gradient; `prompt_term` gives the rest.

Non-affine estimators (reward buckets) have no such pair of scalars: `shared_prompts_ok`
says so in a log line, and the caller forwards the prompt with every member instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.accumulators import affine_coefficients
from thundersync_jax.learner.segments import SegmentFns, Trajectory

log = logging.getLogger(__name__)


class PromptGroup(NamedTuple):
    """One group's shared prompt and its members' prompt-cotangent tallies.

    Attributes:
      prefix: the prompt as a `Trajectory`, forwarded once (its last token is pending: each
        member's first segment forwards it, as the one-shot forward does).
      shifted: (dk, dv) float32 [L, 1, S, K, H] each, Σ_i (r_i − c) w_i dKV_i.
      plain: (dk, dv) float32, Σ_i w_i dKV_i.
      rewards: members' rewards so far, in arrival order.
    """

    prefix: Trajectory
    shifted: tuple[jax.Array, jax.Array]
    plain: tuple[jax.Array, jax.Array]
    rewards: tuple[float, ...] = ()

    @property
    def shift(self) -> float:
        """c, the first member's reward (0 before any member)."""
        return self.rewards[0] if self.rewards else 0.0


def shared_prompts_ok(acc: Any) -> bool:
    """Whether a `grpo` accumulator's estimator lets members share a prompt's backward.

    Logs (INFO) why not for a non-affine estimator: the caller then forwards the prompt with
    every member (`SegmentFns.open` per member), which is exact for any estimator.
    """
    advantage = acc.config.advantage
    if not advantage.affine:
        log.info(
            "advantage %r is not affine (reward buckets): shared prompts are off, each group "
            "member forwards and backpropagates its own copy of the prompt",
            getattr(advantage.fn, "__name__", advantage.fn),
        )
    return bool(advantage.affine)


def open_group(
    fns: SegmentFns,
    params: Any,
    prompt: Sequence[int] | np.ndarray,
    *,
    base_params: Any = None,
    capacity: int | None = None,
) -> PromptGroup:
    """Forwards the prompt once (no loss on it) and starts empty tallies."""
    prompt = np.asarray(prompt, np.int32).reshape(-1)
    if len(prompt) < 1:
        raise ValueError("a shared prompt needs at least one token")
    prefix, _ = fns.score(
        params, fns.open(capacity or len(prompt)), prompt, base_params=base_params
    )
    zeros = jnp.zeros(prefix.dk.shape, jnp.float32, device=fns.layout.cache)
    return PromptGroup(prefix, (zeros, zeros), (zeros, zeros))


def member(fns: SegmentFns, group: PromptGroup) -> Trajectory:
    """A member's trajectory continuing the shared prompt (score its completion on it)."""
    return fns.fork(group.prefix)


@jax.jit
def _tally(shifted, plain, dk, dv, offset, weight):
    shifted = (shifted[0] + offset * weight * dk, shifted[1] + offset * weight * dv)
    plain = (plain[0] + weight * dk, plain[1] + weight * dv)
    return shifted, plain


def add_member(group: PromptGroup, finished: Trajectory, reward: float, weight) -> PromptGroup:
    """Folds a finished member's prompt cotangents into the group's tallies.

    Args:
      group: the member's group.
      finished: the member's state after `SegmentFns.close` (its buffer on the prompt's slots
        holds dKV_i; slots past the prompt are ignored).
      reward: r_i.
      weight: w_i of the accumulator's loss_agg (`acc.loss_weight(n_i)`).
    """
    if finished.shared != len(group.prefix.segments):
        raise ValueError(
            f"this trajectory shares {finished.shared} segments, the group's prompt has "
            f"{len(group.prefix.segments)}: it was not forked from this group (`member`)"
        )
    slots = group.prefix.capacity
    dk, dv = finished.dk[:, :, :slots], finished.dv[:, :, :slots]
    rewards = (*group.rewards, float(reward))
    offset = jnp.float32(rewards[-1] - rewards[0])  # r_i − c with c the first reward
    shifted, plain = _tally(group.shifted, group.plain, dk, dv, offset, jnp.float32(weight))
    return group._replace(shifted=shifted, plain=plain, rewards=rewards)


def advantage_scalars(
    acc: Any, rewards: Sequence[float], shift: float | None = None
) -> tuple[float, float, float]:
    """(scale, offset, shift) with A_i = scale·(r_i − shift) + offset, as the accumulator has.

    Args:
      acc: a `grpo` accumulator with an affine estimator.
      rewards: the estimator's scope: the group's rewards (batch scope: the whole batch's),
        in arrival order.
      shift: the constant the accumulator subtracts (default: the first reward).
    """
    if not acc.config.advantage.affine:
        raise ValueError("advantage_scalars needs an affine estimator (see shared_prompts_ok)")
    r = np.asarray(rewards, np.float32).reshape(-1)
    if not len(r):
        raise ValueError("advantage_scalars needs at least one reward")
    shift = float(r[0]) if shift is None else float(shift)
    fn = affine_coefficients(acc.config.advantage.fn, acc.config.eps, acc.config.std_ddof)
    scale, offset = fn(jnp.asarray(r - np.float32(shift)), jnp.ones(len(r), bool), shift)
    return float(scale), float(offset), shift


def close_group(
    fns: SegmentFns,
    params: Any,
    group: PromptGroup,
    scalars: tuple[float, float, float],
    *,
    base_params: Any = None,
) -> Any:
    """Σ_i A_i w_i J_pᵀ dKV_i: the prompt backpropagated once, float32 like params.

    Args:
      scalars: `advantage_scalars(acc, ...)` for this group's scope (group, or the batch).
    """
    scale, offset, shift = scalars
    # A_i = scale (r_i − c) + offset + scale (c − shift): the tallies are shifted by c.
    plain_coef = jnp.float32(offset + scale * (group.shift - shift))
    scale = jnp.float32(scale)
    dk = scale * group.shifted[0] + plain_coef * group.plain[0]
    dv = scale * group.shifted[1] + plain_coef * group.plain[1]
    grad, _ = fns.close(
        params, group.prefix._replace(dk=dk, dv=dv), base_params=base_params, consumed=True
    )
    return grad


def prompt_term(acc: Any, acc_state: Any, prompt_grad_sum: Any) -> Any:
    """−(1/Z) Σ_groups close_group(...): add it to `acc.finalize(acc_state)`.

    Z is the accumulator's normalizer over the batch (trajectories, loss tokens, max_len).
    """
    cfg = acc.config
    z = cfg.loss_agg.normalizer(acc_state.num_trajectories, acc_state.num_tokens, cfg.max_len)
    z = jnp.where(z > 0, z, 1.0)
    return jax.tree.map(lambda g: -g / z, prompt_grad_sum)
