"""GRPO with each group's prompt forwarded once and backpropagated once (`rl.shared_prompt`).

DESIGN §2 ("Segments: linear cost"), with the algebra in `learner.segments_prompt`: the first
member of a group to reach the learner forwards the group's prompt into a learner KV cache; every
member then runs forward over its own tokens only against that cache (`SegmentFns.fork`), its
gradient h_i (prompt keys/values held fixed) goes into the ordinary `accumulators.grpo` exactly
as a per-member chunk would, and its cotangents for the prompt's keys/values go into two
prompt-sized tallies, Σ (r_i − c) w_i dKV_i and Σ w_i dKV_i. When the group closes (all its
members in; a `batch`-scope estimator: at the batch end) the prompt is backpropagated once with
the group's advantage scalars, and finalize adds −(1/Z) Σ_groups of those gradients. A
member's segment forward also gives the engine/learner log-prob gap of its sampled tokens and,
with `rl.tis_cap`, their truncated importance weights (in h_i and in its prompt cotangents).

Exact for every affine estimator. Bucketed (non-affine) callables, deterministic mode (whose
tallies are exact integers) and regularizer terms (they read whole trajectories) fall back to
per-member prompts with one log line (`uses_shared_prompts`).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.algorithms.base import (
    BatchLearner,
    BatchPolicy,
    item_lag,
    verifier_failure,
)
from thundersync_jax.learner import segments_prompt
from thundersync_jax.losses.logprob_gap import GapTally
from thundersync_jax.schedule.batch_tally import BatchTally, tally_metrics

log = logging.getLogger(__name__)


class SharedPromptState(NamedTuple):
    """Per-batch state of GRPO with shared prompts.

    Attributes:
      acc: the `accumulators.grpo` state.
      policy: the batch's policy.
      tally: tokens, rewards, lags and verifier failures so far.
      groups: group -> (its prompt tokens, `segments_prompt.PromptGroup`), open groups only.
      members: group -> members folded in so far.
      prompt_grad: Σ over closed groups of the prompt's backward (float32 like the trainable
        params), or None before the first group closes.
      kept_bytes_peak: peak device bytes of the open groups' prompt caches and tallies.
      gap: the engine/learner log-prob gap sums so far.
    """

    acc: Any
    policy: BatchPolicy
    tally: BatchTally
    groups: dict = {}
    members: dict = {}
    prompt_grad: Any = None
    kept_bytes_peak: int = 0
    gap: GapTally = GapTally()


def uses_shared_prompts(acc, regularizer_fn, deterministic: bool) -> bool:
    """Whether `rl.shared_prompt=True` can run as asked; logs (INFO) why not."""
    if regularizer_fn is not None:
        log.info(
            "rl.shared_prompt: regularizer terms read whole trajectories; each member forwards "
            "and backpropagates its own copy of the prompt"
        )
        return False
    if deterministic:
        log.info(
            "rl.shared_prompt: deterministic tallies are exact integers, the prompt tallies "
            "are not; each member forwards and backpropagates its own copy of the prompt"
        )
        return False
    return segments_prompt.shared_prompts_ok(acc)  # logs the bucketed-callable fallback


def _group_bytes(group: segments_prompt.PromptGroup) -> int:
    arrays = (*group.shifted, *group.plain)
    return group.prefix.nbytes + sum(int(x.size) * x.dtype.itemsize for x in arrays)


def _zeros_like(tree):
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)


def _tree_add(a, b):
    return b if a is None else jax.tree.map(lambda x, y: x + y, a, b)


def _fold_member(acc, add, fns, state: SharedPromptState, item) -> SharedPromptState:
    """One member scored over its group's shared prompt cache and added to the tally."""
    p, traj, k = state.policy, item.payload, item.group
    lag = item_lag(p, traj.policy_versions, f"trajectory {item.item_id}")
    prompt = np.asarray(traj.tokens[: traj.prompt_len], np.int32)
    groups = dict(state.groups)
    if k not in groups:
        opened = segments_prompt.open_group(fns, p.params, prompt, base_params=p.base_params)
        groups[k] = (prompt, opened)
    seen, group = groups[k]
    if not np.array_equal(seen, prompt):
        raise ValueError(f"trajectory {item.item_id}: its prompt differs from its group's")
    member = segments_prompt.member(fns, group)
    rest = slice(traj.prompt_len, None)
    mask = np.asarray(traj.loss_mask[rest], np.float32)
    engine = getattr(traj, "logprobs", None)  # NaN (none) where the engine gave none
    member, res = fns.score(
        p.params,
        member,
        traj.tokens[rest],
        mask,
        engine_logprobs=None if engine is None else np.asarray(engine, np.float32)[rest],
        base_params=p.base_params,
    )
    deferred, member = fns.close(p.params, member, base_params=p.base_params)
    h = res.grad if res.grad is not None else _zeros_like(p.params)
    h = h if deferred is None else _tree_add(h, deferred)
    n = res.num_tokens
    acc_state = add(state.acc, item.group, item.reward, h, n)
    weight = acc.loss_weight(max(n, 1))
    groups[k] = (seen, segments_prompt.add_member(group, member, item.reward, weight))
    failure = verifier_failure(traj)
    tally = state.tally.add(
        tokens=n,
        rewards=[(k, float(item.reward))],
        lags=[lag],
        verifier_failures=[] if failure is None else [f"{item.item_id}: {failure}"],
    )
    members = {**state.members, k: state.members.get(k, 0) + 1}
    peak = max(state.kept_bytes_peak, sum(_group_bytes(g) for _, g in groups.values()))
    return state._replace(
        acc=acc_state,
        tally=tally,
        groups=groups,
        members=members,
        kept_bytes_peak=peak,
        gap=state.gap if res.gap is None else state.gap.add(res.gap),
    )


def _close_prompt(acc, fns, state: SharedPromptState, k: int, scope_rewards) -> SharedPromptState:
    """Group k's prompt backpropagated once with its members' advantages (or the scope's)."""
    p = state.policy
    groups = dict(state.groups)
    _, group = groups.pop(k)
    scalars = segments_prompt.advantage_scalars(acc, scope_rewards or group.rewards)
    grad = segments_prompt.close_group(fns, p.params, group, scalars, base_params=p.base_params)
    return state._replace(groups=groups, prompt_grad=_tree_add(state.prompt_grad, grad))


def batch_learner(acc, segment_fns, group_size: int) -> BatchLearner:
    """The GRPO `BatchLearner` with shared prompts (see module doc)."""
    fns = segment_fns
    add = jax.jit(acc.add)
    batch_scope = bool(acc.config.batch_scope)

    def init(params, version: int, base_params=None, enforce_version: bool = True, carry=None):
        del carry  # nothing is kept across batches
        policy = BatchPolicy(params, base_params, int(version), bool(enforce_version))
        return SharedPromptState(acc.init(params), policy, BatchTally())

    def process(state: SharedPromptState, chunk) -> SharedPromptState:
        for item in chunk:
            state = _fold_member(acc, add, fns, state, item)
            k = item.group
            if not batch_scope and state.members[k] == group_size:
                state = _close_prompt(acc, fns, state, k, None)  # the group is complete
        jax.block_until_ready(state.acc)  # timings measure the work (see algorithms.grpo)
        return state

    def close_groups(state: SharedPromptState, groups) -> SharedPromptState:
        """Failed groups close with the members they have; batch scope: every group now."""
        acc_state = state.acc
        for g in sorted(groups):
            acc_state = acc.close(acc_state, g)
        state = state._replace(acc=acc_state)
        everyone = [r for _, r in state.tally.rewards] if batch_scope else None
        for k in sorted(state.groups):
            state = _close_prompt(acc, fns, state, k, everyone)
        return state

    def finalize(state: SharedPromptState):
        if state.groups:
            raise ValueError(
                f"groups {sorted(state.groups)} still hold open prompts: call close_groups first"
            )
        grads = acc.finalize(state.acc)
        if state.prompt_grad is None:
            return grads
        extra = segments_prompt.prompt_term(acc, state.acc, state.prompt_grad)
        return jax.tree.map(lambda a, b: a + b, grads, extra)

    return BatchLearner(
        init=init,
        process=process,
        close_groups=close_groups,
        finalize=finalize,
        metrics=lambda state: {**tally_metrics(state.tally), **state.gap.metrics()},
        compiles=lambda: int(fns.compiles),
        accumulator_state=lambda state: state.acc,
        kept_bytes_peak=lambda state: int(state.kept_bytes_peak),
    )
