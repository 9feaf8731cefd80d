"""The loop's side of data-parallel learner processes (DESIGN §7, issue 15).

One learner replica per process. Process p launches and streams only the groups k with
k mod P = p, on its own engines, folding them into its own tallies: nothing crosses
processes while rollouts and chunks run. At batch end:

1. the processes exchange a few numbers: each one's trajectory and token counts (Z of
   every loss_agg mode: B, N; OPD's N), with the `batch` advantage its rewards and member
   counts ([K, G] + [K], for the batch-wide mean and std), in one small allgather; and its
   rewards and metric scalars (for the step's metrics) in another;
2. each finalizes its partial gradient with the GLOBAL counts (and rewards)
   (`accumulators.with_batch_totals`): −(1/Z) Σ over its own groups;
3. one cross-process sum over `dp` (`learner.replicas.make_cross_process_sum`);
   deterministic mode (`rl.deterministic`, DESIGN §8) sums the exact fixed-point tallies
   instead (`accumulators.exact_tallies`, `sum_exact_tallies`) and every process
   finalizes that one global tally: bitwise the one-process run, however groups were split;

then every replica applies the same optax step to the same gradient, so replicas stay
bitwise identical (checked every step with `distributed.debug_check_replicas`). With one
process every function here is the plain one-process path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from thundersync_jax import accumulators, distributed
from thundersync_jax.learner import replicas
from thundersync_jax.schedule.batch_tally import BatchTally, tally_metrics
from thundersync_jax.schedule.config_check import ConfigError

# Metrics whose batch value is the sum over processes (their groups are disjoint), and
# those that are the largest process's; the rest are process 0's own (e.g. timings), with
# the learner's busy time also reported per process.
SUMMED = ("tokens", "mixed_groups", "verifier_failures", "rollout_failures", "turns")
# Means over the batch's loss tokens (OPD's reverse-KL estimate): weighted by each one's tokens.
TOKEN_MEANS = ("reverse_kl",)
LARGEST = ("max_policy_lag", "open_groups_peak", "accum_bytes_peak", "compiles")
# Means over the batch's learner items (trajectories / turns): weighted by each one's items.
ITEM_MEANS = ("mean_policy_lag",)
# Learner figures each process measures for its own groups: also reported as a list over
# processes (`<name>_per_process`, process p at index p) in the metrics process 0 writes.
PER_PROCESS = (
    "learner_busy_s",
    "mean_policy_lag",
    "max_policy_lag",
    "tokens",
    "open_groups_peak",
    "accum_bytes_peak",
    "compiles",
)
_ITEMS = "__learner_items"  # the exchanged count of learner items (not a metric)


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """This process's place among the learner replicas, and the batch-end exchange.

    Attributes:
      info: this process's index and the process count.
      global_mesh: the (dp, fsdp, tp) mesh (None with one process).
      cross_sum: tree -> Σ over processes of every leaf (None with one process).
      check_replicas: hash the train state on every process after each step.
      exact_sum: exact tallies -> their exact Σ over processes (None with one process).
    """

    info: distributed.ProcessInfo
    global_mesh: Any = None
    cross_sum: Callable[[Any], Any] | None = None
    check_replicas: bool = False
    exact_sum: Callable[[Any], Any] | None = None

    @classmethod
    def from_config(cls, config, info: distributed.ProcessInfo) -> DataParallel:
        if info.count == 1:
            return cls(info)
        if config.rl.deterministic and config.rl.advantage == "batch":
            # Deterministic `batch` scope keeps its batch-wide reward buckets open until
            # finalize; the cross-process exact sum carries only the folded `total`.
            raise ConfigError(
                f"rl.deterministic=True with rl.advantage='batch' needs one learner process "
                f"(got {info.count}): use a per-group advantage (grpo, drgrpo, rloo) or "
                "rl.deterministic=False"
            )
        mesh = distributed.global_mesh(int(config.mesh.fsdp), int(config.mesh.tp))
        check = bool(config.distributed.debug_check_replicas)
        exact = replicas.make_cross_process_sum(mesh, reduce=accumulators.sum_exact_tallies)
        return cls(info, mesh, replicas.make_cross_process_sum(mesh), check, exact)

    @property
    def several(self) -> bool:
        return self.info.count > 1

    def owned_groups(self, num_groups: int) -> list[int]:
        return distributed.owned_groups(num_groups, self.info)

    def other_groups(self, num_groups: int) -> list[int]:
        mine = set(self.owned_groups(num_groups))
        return [k for k in range(num_groups) if k not in mine]

    def finalize(self, learner, batch) -> Any:
        """∇L of the whole batch on every process (its own `learner.finalize` with one)."""
        if not self.several:
            return learner.finalize(batch)
        acc_state = learner.accumulator_state(batch)
        # float64 carries the counts and float32 rewards exactly; other processes' reward rows
        # are zero in this state, so the sums are the batch's (`batch` advantage only).
        rewards, members = accumulators.batch_rewards(acc_state)
        local = [np.asarray(accumulators.batch_totals(acc_state), np.float64)]
        if rewards is not None:
            local += [rewards.reshape(-1).astype(np.float64), members.astype(np.float64)]
        every = distributed.allgather(np.concatenate(local)).sum(axis=0)
        b, n = (int(x) for x in every[:2])
        if rewards is not None:
            k = members.shape[0]
            rewards = every[2 : 2 + rewards.size].reshape(rewards.shape)
            members = every[2 + rewards.size : 2 + rewards.size + k]
        # The algorithms' per-batch states keep their accumulator state in `acc`.
        globally = accumulators.with_batch_totals(acc_state, b, n, rewards, members)
        exact = accumulators.exact_tallies(globally)
        if exact is not None:  # deterministic: one exact sum, then the same finalize everywhere
            summed = accumulators.with_exact_tallies(globally, self.exact_sum(exact))
            return learner.finalize(batch._replace(acc=summed))
        partial = learner.finalize(batch._replace(acc=globally))
        return self.cross_sum(partial)

    def after_update(self, state, step: int) -> None:
        if self.several and self.check_replicas:
            replicas.check_replicas_identical(state, step)

    def merge_metrics(self, out: dict, tally: BatchTally, num_members: int) -> dict:
        """The step's metrics over every process's groups (identical on every process)."""
        if not self.several:
            return out
        numbers = {k: v for k, v in out.items() if isinstance(v, (int, float, bool, np.number))}
        numbers[_ITEMS] = len(tally.lags)
        keys = sorted(numbers)
        local = np.asarray([float(numbers[k]) for k in keys], np.float64)
        rewards = np.full((num_members, 2), np.nan)
        for row, (g, r) in enumerate(tally.rewards):
            rewards[row] = (g, r)
        every = distributed.allgather(np.concatenate([local, rewards.reshape(-1)]))
        scalars, gathered = every[:, : len(keys)], every[:, len(keys) :].reshape(-1, 2)
        merged = dict(out)
        items = scalars[:, keys.index(_ITEMS)]
        for i, k in enumerate(keys):
            if k == _ITEMS:
                continue
            if k in SUMMED:
                merged[k] = type(out[k])(scalars[:, i].sum())
            elif k in LARGEST:
                merged[k] = type(out[k])(scalars[:, i].max())
            elif k in TOKEN_MEANS and "tokens" in keys:
                weights = scalars[:, keys.index("tokens")]
                merged[k] = round(float(scalars[:, i] @ weights / max(weights.sum(), 1.0)), 6)
            elif k in ITEM_MEANS:
                merged[k] = float(scalars[:, i] @ items / max(items.sum(), 1.0))
            if k in PER_PROCESS:
                merged[f"{k}_per_process"] = [type(out[k])(x) for x in scalars[:, i]]
        pairs = [(int(g), float(r)) for g, r in gathered if not np.isnan(g)]
        merged["reward_mean"] = tally_metrics(BatchTally(rewards=tuple(pairs)))["reward_mean"]
        return merged
