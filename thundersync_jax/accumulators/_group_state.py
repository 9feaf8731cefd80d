"""State of a group-wise (GRPO-family) accumulator and its static configuration."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.accumulators import _exact, _tallies
from thundersync_jax.accumulators._advantages import Advantage
from thundersync_jax.accumulators._loss_agg import LossAgg

NEW, OPEN, CLOSED = 0, 1, 2  # values of GroupState.status


class GroupState(NamedTuple):
    """Everything a GRPO-family accumulator keeps between `add` calls.

    Shapes: K = num_groups, G = group_size, S = tally slots (max_open_groups
    for group estimators, 1 for batch scope, 0 when unused), nb = max_buckets.
    Leaves marked "like params" are float32 pytrees with the params' structure
    (and sharding); a leading [S] or [S, nb] axis stacks them. In deterministic
    mode `total` and `buckets` are `_exact.ExactSum` int32-limb tallies (with
    lead () and [S, nb]), every estimator uses buckets, and `shifted`/`plain`
    are empty ([0] stacks). With placement "host" the four tallies live in the
    host memory of the params' devices (`_host`); the small arrays stay on device.

    Attributes:
      total: like params. Σ A_i w_i h_i over closed groups, plus regularizer terms.
      shifted: [S] like params. Per open group, R'_k = Σ (r_i − c_k) w_i h_i.
        A freed slot keeps stale values until the next group takes it and zeroes it.
      plain: [S] like params. Per open group, H_k = Σ w_i h_i.
      buckets: [S, nb] like params. Per open group and distinct reward, Σ w_i h_i
        (non-affine estimators, or any estimator in deterministic mode; batch
        scope: one slot of batch-wide buckets).
      bucket_values: float32 [S, nb]. The reward of each bucket.
      bucket_used: int32 [S]. Buckets in use per slot.
      rewards: float32 [K, G]. Members' rewards in arrival order.
      shifts: float32 [K] (batch scope: [1]). c_k, the first reward seen.
      members: int32 [K]. Members added to each group so far.
      status: int32 [K]. NEW (0), OPEN (1) or CLOSED (2).
      slot_of_group: int32 [K]. Tally slot of an open group, −1 otherwise.
      group_of_slot: int32 [S]. Group using each slot, −1 when free.
      num_trajectories: int32. B, trajectories added.
      num_tokens: int32. N, loss tokens added.
      open_peak: int32. Most groups open at once (for metrics).
      dropped: int32. Trajectories dropped by on_invalid="drop".
      error: int32. Bitwise OR of the error codes recorded under jit (see _errors).
      error_group: int32. Group of the first recorded error.
      error_reward: float32. Reward of the first recorded error.
    """

    total: Any
    shifted: Any
    plain: Any
    buckets: Any
    bucket_values: jax.Array
    bucket_used: jax.Array
    rewards: jax.Array
    shifts: jax.Array
    members: jax.Array
    status: jax.Array
    slot_of_group: jax.Array
    group_of_slot: jax.Array
    num_trajectories: jax.Array
    num_tokens: jax.Array
    open_peak: jax.Array
    dropped: jax.Array
    error: jax.Array
    error_group: jax.Array
    error_reward: jax.Array


class GroupConfig(NamedTuple):
    """Static settings of a GRPO-family accumulator (resolved by the factory)."""

    num_groups: int
    group_size: int
    advantage: Advantage
    loss_agg: LossAgg
    eps: float
    std_ddof: int
    max_len: int | None
    max_open_groups: int
    max_buckets: int
    on_invalid: str
    deterministic: bool = False
    placement: str = "device"  # "host": parameter-sized tallies in host memory (`_host`)

    @property
    def host(self) -> bool:
        return self.placement == "host"

    @property
    def batch_scope(self) -> bool:
        return self.advantage.scope == "batch"

    @property
    def uses_buckets(self) -> bool:
        """Reward buckets: for non-affine estimators, and for every one in deterministic mode."""
        return self.deterministic or not self.advantage.affine

    @property
    def affine_slots(self) -> int:
        if self.uses_buckets:
            return 0
        return 1 if self.batch_scope else self.max_open_groups

    @property
    def bucket_slots(self) -> int:
        if not self.uses_buckets:
            return 0
        return 1 if self.batch_scope else self.max_open_groups


def init_state(cfg: GroupConfig, params) -> GroupState:
    """Empty state for params (any pytree of arrays); tallies are float32."""
    k, g, nb = cfg.num_groups, cfg.group_size, cfg.max_buckets
    slots = max(cfg.affine_slots, cfg.bucket_slots)
    if cfg.deterministic:
        total = _exact.zeros(params)
        buckets = _exact.zeros(params, cfg.bucket_slots, nb)
    else:
        total = _tallies.zeros_like_params(params, host=cfg.host)
        buckets = _tallies.stacked_zeros(params, cfg.bucket_slots, nb, host=cfg.host)
    # Small bookkeeping arrays come from numpy: no per-shape fill kernel to compile.
    i32 = lambda v, shape=(): jnp.asarray(np.full(shape, v, np.int32))
    f32 = lambda shape: jnp.asarray(np.zeros(shape, np.float32))
    small = dict(
        bucket_values=f32((cfg.bucket_slots, nb)),
        bucket_used=i32(0, (cfg.bucket_slots,)),
        rewards=f32((k, g)),
        shifts=f32((1 if cfg.batch_scope else k,)),
        members=i32(0, (k,)),
        status=i32(NEW, (k,)),
        slot_of_group=i32(-1, (k,)),
        group_of_slot=i32(-1, (slots,)),
        num_trajectories=i32(0),
        num_tokens=i32(0),
        open_peak=i32(0),
        dropped=i32(0),
        error=i32(0),
        error_group=i32(-1),
        error_reward=f32(()),
    )
    return GroupState(
        total=total,
        shifted=_tallies.stacked_zeros(params, cfg.affine_slots, host=cfg.host),
        plain=_tallies.stacked_zeros(params, cfg.affine_slots, host=cfg.host),
        buckets=buckets,
        **_tallies.on_mesh_of(params, small),
    )
