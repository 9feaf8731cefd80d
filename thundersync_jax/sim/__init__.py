"""Trace-driven step-time model: predicts what sync / group / stream / async cost.

A batch starts at t = 0 with every rollout; trajectory i delivers its reward at
a_i with n_i loss-masked tokens in group g_i. The learner is one serial worker.
A chunk of trajectories of one (group, reward) slot costs

    c(chunk) = fixed_s + per_token_s · padded(Σ n_i)          (CostModel)

and after the last chunk the optimizer step (opt_s) and publication (pub_s)
follow (`CostModel(row_padding=True)` instead charges a packed chunk as the
learner runs it: rows padded to a power of two, each to the longest's bucket).
The chunk decisions are not modelled: `simulate` drives the orchestrator's own
`schedule.planner.Planner` on a virtual clock, so there is one policy.

Step time = batch start → weights published. With R = max a_i (rollout
span), L = chunk work of sync and O = opt_s + pub_s:

    sync    T = R + L + O                 learner starts at R; groups in index order
    group   a group's chunks are ready at its last arrival; FIFO by that time
    stream  each trajectory is ready at a_i; closed groups first, then open groups
            with differing rewards, then the rest; ready same-slot trajectories packed
    async   T = max(R, L) + O             one-step off-policy steady state: the
            learner trains on batch n while batch n+1 rolls out; both must finish
            before the optimizer step and the weight swap (a barrier), so the
            rollouts of n+1 use weights from step n−1 (policy lag 1)

Ceiling. Every trajectory's work starts after it arrives, so group and stream
satisfy T ≥ max(R + c_last, L_lb) + O, where c_last is the cheapest chunk
holding the last trajectory and L_lb ≤ L a lower bound on any packing's work
(fixed cost per unavoidable chunk + per-token cost of unpadded tokens). Hence
speedup over sync ≤ (R + L + O) / (max(R, L_lb) + O) ≈ (R + L)/max(R, L), which
is 2 at balance L = R and falls toward 1 as either side dominates. `ceiling`
uses the tighter release-time form T ≥ max_t [t + work_lb(arrivals ≥ t)] + O
(t = R and t = 0 give the two terms above): late-arriving work cannot overlap.
Async reaches (R + L + O)/(max(R, L) + O) exactly, at the price of staleness.
`balance` rescales arrival times to a chosen L / R.

Learner-time metrics (same definitions as thundersync_jax.metrics):
learner_busy_s = L_schedule + O, learner_idle_frac = 1 − busy / T,
tail_s = T − R, open_groups_peak = most groups with some but not all members
processed, counted after each chunk is handed out.

OPD (`simulate_opd`, `opd_trace`): work items are scored turns (granularity `turn`: a
segment's direct pass, plus the reverse sweep on a trajectory's last turn) or whole
trajectories (`trajectory`: one-shot gradient); `SegmentCost` prices each padded call.
"""

from thundersync_jax.sim._ceiling import Ceiling, balance, ceiling, learner_work_s
from thundersync_jax.sim._cost import CostModel
from thundersync_jax.sim._opd import (
    GRANULARITIES,
    CallKey,
    SegmentCost,
    balance_opd,
    best_granularity,
    end_item_id,
    item_costs,
    one_shot_call,
    opd_items,
    opd_planner,
    segment_calls,
    simulate_opd,
    step_time_by_granularity,
    turn_item_id,
)
from thundersync_jax.sim._opd_trace import OpdTurn, opd_trace, trajectories, validate_opd_trace
from thundersync_jax.sim._simulate import (
    LEARNER_KINDS,
    SCHEDULES,
    STREAM_RANKS,
    Chunk,
    SimResult,
    simulate,
)
from thundersync_jax.sim._trace import (
    Arrival,
    lognormal_trace,
    read_trace,
    split_steps,
    validate_trace,
    write_trace,
)

__all__ = [
    "GRANULARITIES",
    "CallKey",
    "OpdTurn",
    "SegmentCost",
    "balance_opd",
    "best_granularity",
    "item_costs",
    "end_item_id",
    "one_shot_call",
    "turn_item_id",
    "opd_items",
    "opd_planner",
    "opd_trace",
    "segment_calls",
    "simulate_opd",
    "step_time_by_granularity",
    "trajectories",
    "validate_opd_trace",
    "LEARNER_KINDS",
    "SCHEDULES",
    "STREAM_RANKS",
    "Arrival",
    "Ceiling",
    "Chunk",
    "CostModel",
    "SimResult",
    "balance",
    "ceiling",
    "learner_work_s",
    "lognormal_trace",
    "read_trace",
    "simulate",
    "split_steps",
    "validate_trace",
    "write_trace",
]
