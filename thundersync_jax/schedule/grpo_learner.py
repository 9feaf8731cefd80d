"""GRPO learner work for one batch: score-gradient chunks folded into the accumulator.

The planner hands over chunks of trajectories sharing one (group, reward) slot;
each becomes one jitted score-gradient call whose rows are the trajectories,
each row weighted by its loss-aggregation weight w_i, and one
`add_weighted` into the streaming accumulator. `finalize` then gives ∇L.
With regularizers (KL to reference, entropy) the accumulator is an
`accumulators.combine(...)` one and each chunk's term gradients go straight into
its global tally with `add_term`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from thundersync_jax.rollout.staleness import check_version
from thundersync_jax.schedule.planner import WorkItem


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


class GrpoLearner:
    """Folds chunks of one batch into a GRPO accumulator.

    Args:
      acc: a `thundersync_jax.accumulators.grpo(...)` accumulator.
      score_fn: `learner.chunks.make_score_grad_fn(...)` for the policy.
      pad_id: padding token id.
      enforce_version: reject trajectories sampled by another policy version (sync,
        group and stream); off only for the `async` staleness baseline.
      regularizer_fn: `schedule.regularizers.RegularizerGradFn` for the terms of a combined
        `acc` (`accumulators.combine`), or None.
    """

    def __init__(
        self, acc, score_fn, pad_id: int, enforce_version: bool = True, regularizer_fn=None
    ):
        self.acc = acc
        self.score_fn = score_fn
        self.pad_id = pad_id
        self.enforce_version = enforce_version
        self._add = jax.jit(acc.add_weighted, donate_argnums=0)
        # A combined accumulator wraps the policy's; w_i is the policy's loss weight.
        self.loss_weight = getattr(acc, "policy", acc).loss_weight
        self.regularizer_fn = regularizer_fn
        if regularizer_fn is not None:
            have = sorted(getattr(acc, "terms", ()))
            if sorted(regularizer_fn.terms) != have:
                raise ValueError(
                    f"regularizer terms {regularizer_fn.terms} need an accumulator combined with "
                    f"the same terms (accumulators.combine), got {have}"
                )
            # A chunk's term gradient arrives already weighted row by row (Σ_i w_i g_i); it is
            # added with num_tokens=1, whose loss weight must then be 1 (all built-in modes).
            if float(self.loss_weight(1)) != 1.0:
                raise ValueError("regularizers need a loss_agg mode whose weight at 1 token is 1")
            self._add_term = jax.jit(acc.add_term, static_argnums=1, donate_argnums=0)
        self.state = None
        self.params = None
        self.base_params = None
        self.version = -1
        self.tokens = 0
        self.max_lag = 0

    def begin(self, params, version: int, base_params=None) -> None:
        """Starts a batch on `params` (policy `version`)."""
        self.params, self.base_params, self.version = params, base_params, version
        self.state = self.acc.init(params)
        self.tokens = 0
        self.max_lag = 0
        self.rewards: list[float] = []
        self.verifier_failures: list[str] = []  # "item: reason" of rewards a failed verifier set

    def process(self, chunk: list[WorkItem]) -> None:
        trajs = [item.payload for item in chunk]
        for item, traj in zip(chunk, trajs, strict=True):
            for v in traj.policy_versions:
                if self.enforce_version:
                    check_version(v, self.version, what=f"trajectory {item.item_id}")
                self.max_lag = max(self.max_lag, self.version - int(v))
            verdict = getattr(traj, "verifier", None)
            if verdict is not None and verdict.error is not None:
                self.verifier_failures.append(
                    f"{item.item_id}: reward {item.reward} ({verdict.reason}: {verdict.error})"
                )
        tokens, mask, weights, n = pack_rows(trajs, self.loss_weight, self.pad_id)
        h, _ = self.score_fn(self.params, tokens, mask, weights, base_params=self.base_params)
        head = chunk[0]
        self.state = self._add(self.state, head.group, head.reward, h, n, len(chunk))
        if self.regularizer_fn is not None:
            terms = self.regularizer_fn(
                self.params, tokens, mask, weights, base_params=self.base_params
            )
            for name, grad in terms.items():
                self.state = self._add_term(self.state, name, grad, 1)
        self.tokens += n
        self.rewards.extend(float(item.reward) for item in chunk)
        # JAX dispatches asynchronously: wait here so the learner loop's timings (busy time,
        # idle fraction, the timeline) measure the work, and the planner's next decision is
        # taken when the learner is really free, not with an unbounded backlog queued.
        jax.block_until_ready(self.state)

    def close_short_groups(self, groups) -> None:
        """Closes groups that lost members for good, so they fold with the members they have."""
        for g in sorted(groups):
            self.state = self.acc.close(self.state, g)

    def finalize(self):
        return self.acc.finalize(self.state)
