"""Worst relative error of streaming vs the float64 synchronous update, per estimator × mode.

`pytest -s tests/accumulators/grpo_error_table_test.py` prints the table reported in
BENCHMARKS.md: for each cell, the max over random interleaved arrival orders (with
one group closed early, one singleton, one all-equal group) of ‖g − g_ref‖/‖g_ref‖.
"""

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference
from thundersync_jax.accumulators.replay import peak_open_groups, replay

MODES = ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean", "seq-mean-token-sum-norm"]
ESTIMATORS = {
    "grpo": "grpo",
    "drgrpo": "drgrpo",
    "rloo": "rloo",
    "batch": "batch",
    "rank (callable)": lambda r: (
        (r[:, None] > r[None, :]).sum(1) * 1.0 - (r[:, None] < r[None, :]).sum(1)
    ),
}
LEVELS = [[0, 1, 1, 3], [2, 2, 2, 2], [1, 0, 3], [2]]  # full, all-equal, short, singleton
ORDERS = 2


def _worst_error(estimator, loss_agg, random_grad, offset, scale, seed):
    rng = np.random.default_rng(seed)
    trajectories = [
        (k, offset + scale * level, random_grad(rng), int(rng.integers(1, 40)))
        for k, levels in enumerate(LEVELS)
        for level in levels
    ]
    worst = 0.0
    for _ in range(ORDERS):
        order = list(rng.permutation(len(trajectories)))
        acc = accumulators.grpo(
            len(LEVELS),
            4,
            advantage=estimator,
            loss_agg=loss_agg,
            max_len=41,
            max_open_groups=peak_open_groups(trajectories, order),
        )
        got = acc.finalize(replay(acc, params_of(random_grad), trajectories, order))
        want = reference.grpo_gradient(trajectories, estimator, loss_agg, max_len=41)
        worst = max(worst, reference.relative_error(got, want))
    return worst


def params_of(random_grad):
    return jax.tree.map(np.zeros_like, random_grad(np.random.default_rng(0)))


# in make test, not test-quick: one of the unit tier's slowest (BENCHMARKS' error table)
@pytest.mark.slow
def test_error_table(random_grad):
    header = f"{'estimator':18s} {'loss_agg':25s} {'rewards 0..3':>13s} {'1000 + j/64':>12s}"
    lines = [header]
    worst_plain, worst_offset = 0.0, 0.0
    for seed, (name, estimator) in enumerate(ESTIMATORS.items()):
        for loss_agg in MODES:
            plain = _worst_error(estimator, loss_agg, random_grad, 0.0, 1.0, seed)
            # Rank comparisons are exact on float32 rewards, so the callable is checked with
            # offsets too; a callable doing float arithmetic on raw rewards (r − mean) would
            # not be, which is the user's numerics, not the accumulator's.
            shifted = _worst_error(estimator, loss_agg, random_grad, 1000.0, 1 / 64, seed)
            worst_plain = max(worst_plain, plain)
            worst_offset = max(worst_offset, shifted)
            lines.append(f"{name:18s} {loss_agg:25s} {plain:13.2e} {shifted:12.2e}")
    print("\n" + "\n".join(lines))
    assert worst_plain < 1e-5
    assert worst_offset < 1e-4
