"""Shared by every algorithm: the score-gradient function and the regularizer terms of a config.

The score-gradient chunk and the segment passes are built with `rl.tis_cap` (0 = off): the
truncated importance weight min(π_learner / π_engine, cap) on each sampled token of the
policy-gradient term (DESIGN §2), from the engine log-probs every trajectory carries. The
regularizer terms are not weighted.

`rl.kl_coef` (KL to the frozen warm start) and `rl.entropy_coef` (entropy bonus) work the same
way for GRPO and OPD: the accumulator is combined with the enabled terms
(`accumulators.combine`) and each chunk's term gradients go into its global tally.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from thundersync_jax.algorithms.base import LearnerSetup
from thundersync_jax.learner import chunks, regularizers, segments
from thundersync_jax.losses import logprob_gap


def score_grad_fn(setup: LearnerSetup) -> chunks.ScoreGradFn:
    """The policy's jitted score-gradient chunk function for the run's config."""
    c = setup.config
    return chunks.make_score_grad_fn(
        setup.graphdef,
        tuple(c.learner.seq_buckets),
        remat=bool(c.model.remat),
        lora=setup.lora,
        pad_id=setup.pad_id,
        temperature=float(c.rollout.temperature),  # log-probs of what the engine sampled
        out_shardings=setup.grad_shardings,
        rows=setup.rows,
        tis_cap=tis_cap(c),
        routing=str(c.model.routing),
    )


def tis_cap(config) -> float:
    """`rl.tis_cap` checked (0 = off, else a finite cap >= 1); ValueError naming a bad value."""
    return logprob_gap.check_tis_cap(config.rl.tis_cap)


def with_regularizers(acc, setup: LearnerSetup):
    """(accumulator, RegularizerGradFn or None): `acc` combined with the config's terms."""
    c = setup.config
    coefs = regularizers.term_coefficients(c.rl)  # also rejects a bad kl_estimator
    if not coefs:
        return acc, None
    fn = regularizers.RegularizerGradFn(
        setup.graphdef,
        tuple(coefs),
        reference_params=setup.reference_params,
        kl_estimator=c.rl.kl_estimator,
        seq_buckets=tuple(c.learner.seq_buckets),
        lora_adapters=setup.lora,
        pad_id=setup.pad_id,
        temperature=float(c.rollout.temperature),
    )
    return regularizers.combined_accumulator(acc, coefs), fn


class TermAdder:
    """Adds a chunk's regularizer gradients into a combined accumulator's global tallies."""

    def __init__(self, acc, regularizer_fn):
        self.fn = regularizer_fn
        if regularizer_fn is None:
            return
        have = sorted(getattr(acc, "terms", ()))
        if sorted(regularizer_fn.terms) != have:
            raise ValueError(
                f"regularizer terms {regularizer_fn.terms} need an accumulator combined with "
                f"the same terms (accumulators.combine), got {have}"
            )
        # A chunk's term gradient arrives already weighted row by row (Σ_i w_i g_i); it is
        # added with num_tokens=1, whose loss weight must then be 1 (all built-in modes).
        if float(acc.policy.loss_weight(1)) != 1.0:
            raise ValueError("regularizers need a loss_agg mode whose weight at 1 token is 1")
        self._add_term = jax.jit(acc.add_term, static_argnums=1, donate_argnums=0)

    def __call__(self, acc_state, params, base_params, tokens, mask, weights) -> Any:
        if self.fn is None:
            return acc_state
        terms = self.fn(params, tokens, mask, weights, base_params=base_params)
        for name, grad in terms.items():
            acc_state = self._add_term(acc_state, name, grad, 1)
        return acc_state

    @property
    def compiles(self) -> int:
        return 0 if self.fn is None else int(self.fn.compiles)


def segment_fns_for(setup: LearnerSetup):
    """The learner's segment passes for the run (OPD `turn` granularity, GRPO shared prompts)."""
    c = setup.config
    cfg = nnx.merge(setup.graphdef, setup.reference_params).cfg
    seq = tuple(int(b) for b in c.learner.seq_buckets)
    # Segments (an observation plus a turn) are short; a few small buckets bound the padding.
    seg = tuple(sorted({b for b in (32, 64) if b < seq[-1]} | set(seq)))
    return segments.make_segment_fns(
        setup.graphdef,
        cfg,
        seg_buckets=seg,
        cache_buckets=seq,
        remat=bool(c.model.remat),
        lora=setup.lora,
        temperature=float(c.rollout.temperature),
        cache_dtype=c.model.dtype,
        pad_id=setup.pad_id,
        tis_cap=tis_cap(c),
        # Laid out on the learner mesh like the chunks: the mesh of the chunk rows.
        mesh=None if setup.rows is None else setup.rows.mesh,
        grad_shardings=setup.grad_shardings,
    )
