"""Policy + KL + entropy terms combined, against the sum of float64 references."""

import jax
import numpy as np

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference


def test_combined_terms_match_reference(params, random_grad):
    rng = np.random.default_rng(0)
    rows = [
        (
            k,
            float(r),
            random_grad(rng),
            random_grad(rng),
            random_grad(rng),
            int(rng.integers(1, 30)),
        )
        for k, rewards in enumerate([[1, 0, 0], [2, 2, 5]])
        for r in rewards
    ]
    policy = accumulators.grpo(2, 3, loss_agg="seq-mean-token-mean")
    acc = accumulators.combine(
        policy,
        kl=accumulators.regularizer(0.05),  # aggregated like the policy: shares its tally
        entropy=accumulators.regularizer(-0.01, loss_agg="token-mean"),  # its own tally
    )
    state = acc.init(params)
    assert set(state.terms) == {"entropy"}
    for i in rng.permutation(len(rows)):
        k, r, h, kl_grad, ent_grad, n = rows[i]
        state = acc.add(state, k, r, h, n)
        state = acc.add_term(state, "kl", kl_grad, n)
        state = acc.add_term(state, "entropy", ent_grad, n)
    got = acc.finalize(state)
    parts = [
        reference.grpo_gradient([(k, r, h, n) for k, r, h, _, _, n in rows]),
        reference.direct_gradient([(g, n) for *_, g, _, n in rows], 0.05, "seq-mean-token-mean"),
        reference.direct_gradient([(g, n) for *_, g, n in rows], -0.01, "token-mean"),
    ]
    want = jax.tree.map(lambda *x: sum(x), *parts)
    assert reference.relative_error(got, want) < 1e-5


def test_opd_with_kl_term(params, random_grad):
    rng = np.random.default_rng(1)
    turns = [(random_grad(rng), random_grad(rng), int(rng.integers(1, 20))) for _ in range(4)]
    acc = accumulators.combine(accumulators.opd(), kl=accumulators.regularizer(0.1))
    state = acc.init(params)
    for grad, kl_grad, n in turns:
        state = acc.add_term(acc.add(state, grad, n), "kl", kl_grad, n)
    want = jax.tree.map(
        lambda a, b: a + b,
        reference.direct_gradient([(g, n) for g, _, n in turns]),
        reference.direct_gradient([(g, n) for _, g, n in turns], 0.1, "token-mean"),
    )
    assert reference.relative_error(acc.finalize(state), want) < 1e-6
