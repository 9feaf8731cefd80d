"""GRPO behind the loop's algorithm interface: finished trajectories, group-relative advantages.

An episode becomes one `WorkItem` (payload: the Trajectory) when its reward is known. The
planner hands over chunks of trajectories sharing one (group, reward) slot; each becomes one
jitted score-gradient call whose rows are the trajectories, row i weighted by its
loss-aggregation weight w_i, and one `add_weighted` into the streaming accumulator
(`accumulators.grpo`); `finalize` gives ∇L. With `rl.kl_coef` / `rl.entropy_coef` the
accumulator is combined with the terms and each chunk's term gradients go into their global
tally (`algorithms._terms`). The same forward gives the engine/learner log-prob gap of the
sampled tokens (folded per step: the `engine_logprob_gap_*` metrics) and, with `rl.tis_cap`,
each token's truncated importance weight. `rl.shared_prompt=True` forwards and backpropagates
each group's prompt once instead of once per member (`algorithms._grpo_prompts`), with the same
gap and weight from its members' segment forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from thundersync_jax import accumulators
from thundersync_jax.algorithms import _grpo_prompts, _terms
from thundersync_jax.algorithms.base import (
    Algorithm,
    BatchLearner,
    BatchPolicy,
    LearnerSetup,
    item_lag,
    verifier_failure,
)
from thundersync_jax.losses.logprob_gap import GapTally
from thundersync_jax.models import auto
from thundersync_jax.schedule import config_check
from thundersync_jax.schedule.batch_tally import BatchTally, tally_metrics
from thundersync_jax.schedule.episodes import EpisodeWork
from thundersync_jax.schedule.planner import WorkItem


class GrpoState(NamedTuple):
    """Per-batch GRPO learner state.

    Attributes:
      acc: the accumulator's state (`accumulators.grpo`, combined with terms when enabled).
      policy: the batch's policy (params, base, version).
      tally: tokens, rewards, lags and verifier failures so far.
      gap: the engine/learner log-prob gap sums so far.
    """

    acc: Any
    policy: BatchPolicy
    tally: BatchTally
    gap: GapTally = GapTally()


def pack_rows(
    trajectories: Sequence[Any], loss_weight, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Right-padded [m, T] tokens, loss mask and per-row weights w_i for one chunk.

    Returns (tokens, loss_mask, token_weights, num_loss_tokens).
    """
    width = max(len(t.tokens) for t in trajectories)
    m = len(trajectories)
    tokens = np.full((m, width), pad_id, np.int32)
    mask = np.zeros((m, width), np.float32)
    weights = np.zeros((m, width), np.float32)
    total = 0
    for row, traj in enumerate(trajectories):
        n = len(traj.tokens)
        tokens[row, :n] = traj.tokens
        mask[row, :n] = traj.loss_mask
        n_loss = int(np.sum(traj.loss_mask))
        total += n_loss
        weights[row, :n] = float(loss_weight(max(n_loss, 1)))
    return tokens, mask, weights, total


def engine_logprob_rows(trajectories: Sequence[Any], width: int) -> np.ndarray:
    """[m, width] the engine's log-probs of each trajectory's tokens (rows as `pack_rows`).

    NaN (no engine log-prob: left out of the gap, importance weight 1) where a payload carries
    none.
    """
    rows = np.full((len(trajectories), width), np.nan, np.float32)
    for row, traj in enumerate(trajectories):
        logprobs = getattr(traj, "logprobs", None)
        if logprobs is not None:
            rows[row, : len(traj.tokens)] = logprobs
    return rows


def route_rows(trajectories: Sequence[Any], width: int) -> np.ndarray | None:
    """[m, width, M, K] the engine's routes of each trajectory's tokens (MoE policies), -1
    where a payload carries none; None when no trajectory has routes."""
    given = [getattr(t, "routes", None) for t in trajectories]
    shapes = {r.shape[1:] for r in given if r is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"trajectories carry routes of different [M, K] shapes: {shapes}")
    rows = np.full((len(trajectories), width, *shapes.pop()), -1, np.int32)
    for row, r in enumerate(given):
        if r is not None:
            rows[row, : len(r)] = r
    return rows


def batch_learner(acc, score_fn, pad_id: int, regularizer_fn=None) -> BatchLearner:
    """The GRPO `BatchLearner` over accumulator `acc` and score-gradient function `score_fn`.

    Args:
      acc: `accumulators.grpo(...)`, or it combined with `regularizer_fn`'s terms.
      score_fn: `learner.chunks.make_score_grad_fn(...)` for the policy.
      pad_id: padding token id.
      regularizer_fn: `learner.regularizers.RegularizerGradFn` for a combined `acc`, or None.
    """
    add = jax.jit(acc.add_weighted, donate_argnums=0)
    # A combined accumulator wraps the policy's; w_i is the policy's loss weight.
    loss_weight = getattr(acc, "policy", acc).loss_weight
    add_terms = _terms.TermAdder(acc, regularizer_fn)
    host_tallies = getattr(getattr(acc, "policy", acc).config, "host", False)

    def init(
        params, version: int, base_params=None, enforce_version: bool = True, carry=None
    ) -> GrpoState:
        del carry  # GRPO keeps nothing across batches
        policy = BatchPolicy(params, base_params, int(version), bool(enforce_version))
        return GrpoState(acc.init(params), policy, BatchTally())

    def process(state: GrpoState, chunk: list[WorkItem]) -> GrpoState:
        p = state.policy
        trajs = [item.payload for item in chunk]
        lags, failures = [], []
        for item, traj in zip(chunk, trajs, strict=True):
            lags.append(item_lag(p, traj.policy_versions, f"trajectory {item.item_id}"))
            failure = verifier_failure(traj)
            if failure is not None:
                failures.append(f"{item.item_id}: reward {item.reward} ({failure})")
        tokens, mask, weights, n = pack_rows(trajs, loss_weight, pad_id)
        engine_lp = engine_logprob_rows(trajs, tokens.shape[1])
        routes = route_rows(trajs, tokens.shape[1])
        h, _, gap = score_fn.score_and_gap(
            p.params, tokens, mask, weights, engine_lp, base_params=p.base_params, routes=routes
        )
        head = chunk[0]
        acc_state = add(state.acc, head.group, head.reward, h, n, len(chunk))
        acc_state = add_terms(acc_state, p.params, p.base_params, tokens, mask, weights)
        # JAX dispatches asynchronously: wait here so the learner loop's timings (busy time,
        # idle fraction, the timeline) measure the work, and the planner's next decision is
        # taken when the learner is really free, not with an unbounded backlog queued. Host
        # tallies: wait for the device's part only (the score gradient); the copy of w·h
        # and the host add run on while the next chunk is packed and dispatched.
        jax.block_until_ready(h if host_tallies else acc_state)
        tally = state.tally.add(
            tokens=n,
            rewards=[(it.group, float(it.reward)) for it in chunk],
            lags=lags,
            verifier_failures=failures,
        )
        return GrpoState(acc_state, p, tally, state.gap.add(gap))

    def close_groups(state: GrpoState, groups) -> GrpoState:
        acc_state = state.acc
        for g in sorted(groups):
            acc_state = acc.close(acc_state, g)
        return state._replace(acc=acc_state)

    return BatchLearner(
        init=init,
        process=process,
        close_groups=close_groups,
        finalize=lambda state: acc.finalize(state.acc),
        metrics=lambda state: {**tally_metrics(state.tally), **state.gap.metrics()},
        compiles=lambda: int(score_fn.compiles) + add_terms.compiles,
        accumulator_state=lambda state: state.acc,
    )


def accumulator(config) -> Any:
    """The run's `accumulators.grpo(...)` from its `rl` section."""
    rl = config.rl
    return accumulators.grpo(
        num_groups=rl.num_groups,
        group_size=rl.group_size,
        advantage=rl.advantage,
        loss_agg=rl.loss_agg,
        eps=rl.eps,
        std_ddof=rl.std_ddof,
        max_len=rl.max_len or config.rollout.max_traj_tokens,
        max_open_groups=rl.max_open_groups or None,
        # Exactly associative tallies: the same bits whatever the arrival order (DESIGN §8).
        deterministic=bool(rl.deterministic),
        placement=accumulators.tally_placement(config),
    )


def make_learner(setup: LearnerSetup) -> BatchLearner:
    c = setup.config
    acc, reg_fn = _terms.with_regularizers(accumulator(c), setup)
    deterministic = bool(c.rl.deterministic)
    if c.rl.shared_prompt and _grpo_prompts.uses_shared_prompts(acc, reg_fn, deterministic):
        return _grpo_prompts.batch_learner(acc, _terms.segment_fns_for(setup), int(c.rl.group_size))
    return batch_learner(acc, _terms.score_grad_fn(setup), setup.pad_id, reg_fn)


def _finish(k: int, m: int, traj, arrival_s: float) -> WorkItem:
    reward = float(traj.reward if traj.reward is not None else 0.0)
    n_loss = int(traj.loss_mask.sum())
    return WorkItem(f"g{k}m{m}", k, reward, n_loss, arrival_s, payload=traj, member=m)


def _check_config(config) -> None:
    if accumulators.tally_placement(config) == "host" and config.rl.deterministic:
        raise config_check.ConfigError(
            "accum.placement='host' keeps float32 tallies, but rl.deterministic=True needs the "
            "exact int32-limb tallies on the device: use accum.placement='device'"
        )
    if config.rl.shared_prompt and any(auto.layer_pattern(auto.config_from_section(config.model))):
        raise config_check.ConfigError(
            "rl.shared_prompt=True with a mixture-of-experts model "
            f"(model_type={config.model.model_type!r}): the shared prompt's segment programs "
            "run the dense decoder only; use rl.shared_prompt=False"
        )


ALGORITHM = Algorithm(
    name="grpo",
    check_config=_check_config,
    make_learner=make_learner,
    start_services=lambda config, student_cfg, examples, workdir: None,
    episode_work=lambda services, timeline: EpisodeWork(finish=_finish),
    # One chunk should fill the largest bucket's worth of rows, not more.
    max_chunk_tokens=lambda c: int(c.rollout.max_traj_tokens) * max(1, int(c.rl.group_size)),
)
