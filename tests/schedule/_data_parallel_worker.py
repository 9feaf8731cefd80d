"""Run by launch_local in tests/schedule/data_parallel_test.py: one of two learner processes
at batch end (`DataParallel.finalize`), for every accumulator the loop folds across processes.

Every process draws the same batch (seeded), folds only the groups it owns (k mod 2, as the
loop launches them) into the run's own accumulator, and finalizes through
`DataParallel.finalize`: the allgather of counts (and the `batch` advantage's rewards), the
global totals, the cross-process sum (the exact one under `rl.deterministic`). It also folds
the WHOLE batch into one state, the one-process run's finalize, and writes both results'
distance to p<index>.json for the test to read.
"""

import json
import os
import sys
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from configs import cpu
from thundersync_jax import accumulators, distributed
from thundersync_jax.algorithms import grpo
from thundersync_jax.learner import replicas
from thundersync_jax.schedule.batch_tally import BatchTally, tally_metrics
from thundersync_jax.schedule.data_parallel import DataParallel

K = 4  # groups in the batch: two per process


class _Batch(NamedTuple):
    acc: Any  # what the algorithms' per-batch states keep their accumulator state in


class _Learner(NamedTuple):
    """The two `BatchLearner` functions `DataParallel.finalize` calls, as GRPO's and OPD's
    learners define them (algorithms/grpo.py `batch_learner`, algorithms/opd.py): the
    accumulator state is `state.acc` and the gradient is the accumulator's finalize."""

    acc: Any

    def accumulator_state(self, batch):
        return batch.acc

    def finalize(self, batch):
        return self.acc.finalize(batch.acc)


def _config(advantage: str, deterministic: bool):
    c = cpu.get_config("smoke")
    c.rl.num_groups, c.rl.advantage, c.rl.deterministic = K, advantage, deterministic
    c.mesh.fsdp, c.mesh.tp = 2, 2
    c.distributed.debug_check_replicas = True
    return c


def _params(mesh: Mesh) -> dict:
    return {
        "w": jax.device_put(
            np.zeros((6, 4), np.float32), NamedSharding(mesh, PartitionSpec("fsdp", "tp"))
        ),
        "b": jax.device_put(np.zeros((5,), np.float32), NamedSharding(mesh, PartitionSpec())),
    }


def _batch(group_size: int, params: dict, seed: int) -> list:
    """(group, reward, gradient, tokens) of every member; gradients on the params' shardings."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(K):
        for _ in range(group_size):
            grad = {
                n: jax.device_put(rng.normal(size=p.shape).astype(np.float32), p.sharding)
                for n, p in params.items()
            }
            out.append((k, float(rng.integers(0, 3)), grad, int(rng.integers(1, 30))))
    return out


def _fold_grpo(acc, params, members, groups):
    state = acc.init(params)
    for k in groups:  # the loop folds a group's members, then closes it
        for g, reward, grad, tokens in members:
            if g == k:
                state = acc.add(state, k, reward, grad, tokens)
        state = acc.close(state, k)
    return state


def _fold_opd(acc, params, members, groups):
    state = acc.init(params)
    for g, _, grad, tokens in members:
        if g in groups:
            state = acc.add(state, grad, tokens)
    return state


def _case(name, dp, acc, fold, params, members) -> dict:
    mine = dp.owned_groups(K)
    assert mine and len(mine) < K, mine  # the batch really is split
    got = dp.finalize(_Learner(acc), _Batch(fold(acc, params, members, mine)))
    want = acc.finalize(fold(acc, params, members, range(K)))
    replicas.check_replicas_identical(got, step=0)  # raises unless every process holds these bits
    kept = all(got[n].sharding == params[n].sharding for n in params)
    got, want = (
        jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float64), t) for t in (got, want)
    )
    return {
        "case": name,
        "max_abs": max(float(np.max(np.abs(got[n] - want[n]))) for n in want),
        "scale": max(float(np.max(np.abs(want[n]))) for n in want),
        "bitwise": all(got[n].tobytes() == want[n].tobytes() for n in want),
        "shardings_kept": kept,
    }


def _tally(groups, seed: int) -> tuple[BatchTally, float]:
    """An OPD-like tally of `groups` (2 members each, 3 turns a member) and its reverse KL."""
    rng = np.random.default_rng(seed)
    tally = BatchTally()
    for k in groups:
        for _ in range(2):
            reward = float(rng.integers(0, 2))
            lags = [int(rng.integers(0, 3)) for _ in range(3)]
            tally = tally.add(tokens=int(rng.integers(1, 40)), rewards=[(k, reward)], lags=lags)
    return tally, round(float(rng.normal()), 6)


def _metrics_case(dp) -> dict:
    """`merge_metrics` over the two processes' tallies = the metrics of one whole-batch tally:
    tokens and mixed groups summed, the reward mean over every member, the policy lag mean
    weighted by items, OPD's reverse KL weighted by tokens, per-process lists in process order."""
    parts = [_tally([k for k in range(K) if k % 2 == p], seed=30 + p) for p in (0, 1)]
    mine, kl = parts[dp.info.index]
    merged = dp.merge_metrics({**tally_metrics(mine), "reverse_kl": kl}, mine, num_members=2 * K)
    whole = BatchTally()
    for t, _ in parts:
        whole = whole.add(tokens=t.tokens, rewards=t.rewards, lags=t.lags)
    want = tally_metrics(whole)
    want["reverse_kl"] = round(sum(k * t.tokens for t, k in parts) / whole.tokens, 6)
    want["tokens_per_process"] = [t.tokens for t, _ in parts]
    want["max_policy_lag_per_process"] = [max(t.lags) for t, _ in parts]
    wrong = {k: (merged.get(k), v) for k, v in want.items() if not _same(merged.get(k), v)}
    return {"case": "metrics", "wrong": repr(wrong), "checked": sorted(want)}


def _same(got, want) -> bool:
    """Floats to 1e-12 relative (the merge sums in float64, in another order); others exactly."""
    if isinstance(want, float):
        return isinstance(got, (int, float)) and abs(got - want) <= 1e-12 * max(1.0, abs(want))
    return got == want


def main() -> None:
    info = distributed.initialize(init_timeout_s=60, heartbeat_timeout_s=10)
    local = Mesh(
        np.array(sorted(jax.local_devices(), key=lambda d: d.id)).reshape(2, 2), ("fsdp", "tp")
    )
    params = _params(local)
    # One DataParallel for every case: what it does at batch end follows the accumulator state
    # (exact tallies or float, with or without the batch's rewards), not the config.
    dp = DataParallel.from_config(_config("grpo", False), info)
    results = []
    for advantage, deterministic in (("batch", False), ("grpo", False), ("grpo", True)):
        c = _config(advantage, deterministic)
        members = _batch(int(c.rl.group_size), params, seed=7)
        name = f"grpo-{advantage}" + ("-exact" if deterministic else "")
        results.append(_case(name, dp, grpo.accumulator(c), _fold_grpo, params, members))
    opd = accumulators.opd(loss_agg="token-mean")  # as algorithms/opd.py builds it
    results.append(_case("opd", dp, opd, _fold_opd, params, _batch(2, params, seed=8)))
    results.append(_metrics_case(dp))
    out = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--out="))
    with open(os.path.join(out, f"p{info.index}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
