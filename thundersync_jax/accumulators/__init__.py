"""Streaming gradient accumulators: pure (init, add, close, finalize) factories.

    from thundersync_jax import accumulators
    acc = accumulators.grpo(num_groups=K, group_size=G, advantage="grpo")
    state = acc.init(params)
    state = acc.add(state, group=k, reward=r, grad=h_i, num_tokens=n_i)
    grads = acc.finalize(state)      # = the batch-synchronous ∇L

See DESIGN §2 for the math and `reference` for a float64 batch-synchronous oracle.
"""

from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators._advantages import (
    advantage_names,
    affine_coefficients,
    register_advantage,
)
from thundersync_jax.accumulators._batch_totals import (
    batch_rewards,
    batch_totals,
    exact_tallies,
    sum_exact_tallies,
    with_batch_totals,
    with_exact_tallies,
)
from thundersync_jax.accumulators._combine import (
    CombinedAccumulator,
    CombinedState,
    Regularizer,
    combine,
    regularizer,
)
from thundersync_jax.accumulators._group_state import GroupState
from thundersync_jax.accumulators._grpo import GroupAccumulator, grpo
from thundersync_jax.accumulators._host import PLACEMENTS as TALLY_PLACEMENTS
from thundersync_jax.accumulators._host import host_memory_kind, tally_placement
from thundersync_jax.accumulators._loss_agg import loss_agg_names, register_loss_agg
from thundersync_jax.accumulators._opd import OpdAccumulator, OpdAccumulatorState, opd

__all__ = [
    "CombinedAccumulator",
    "CombinedState",
    "affine_coefficients",
    "OpdAccumulator",
    "OpdAccumulatorState",
    "GroupAccumulator",
    "GroupState",
    "TALLY_PLACEMENTS",
    "Regularizer",
    "advantage_names",
    "batch_rewards",
    "batch_totals",
    "combine",
    "exact_tallies",
    "grpo",
    "host_memory_kind",
    "loss_agg_names",
    "opd",
    "reference",
    "sum_exact_tallies",
    "tally_placement",
    "register_advantage",
    "register_loss_agg",
    "regularizer",
    "with_batch_totals",
    "with_exact_tallies",
]
