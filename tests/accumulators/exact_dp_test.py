"""Data-parallel exact tallies: P replicas' all-reduced totals are bitwise the one-process total.

Replica p streams groups k ≡ p (mod P) into its own deterministic accumulator (DESIGN §7);
the per-step all-reduce is `_exact.psum` (one pmax of the windows, one psum of the int32
limbs) over 4 of the 8 fake CPU devices, standing in for 4 processes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from thundersync_jax import accumulators
from thundersync_jax.accumulators import _exact

K, G, REPLICAS = 8, 3, 4


def _batch(random_grad):
    rng = np.random.default_rng(21)
    return [
        (k, float(rng.integers(0, 3)), jax.tree.map(lambda g, s=10.0 ** (k % 4): g * s,
                                                    random_grad(rng)), int(rng.integers(1, 30)))
        for k in range(K)
        for _ in range(G)
    ]  # fmt: skip


def _stream(acc, params, trajectories, seed):
    state = acc.init(params)
    for i in np.random.default_rng(seed).permutation(len(trajectories)):
        state = acc.add(state, *trajectories[i])
    return state


# 8-device programs, the unit tier's slowest compile: in make test, not test-quick.
@pytest.mark.slow
def test_all_reduced_replicas_equal_one_process_bitwise(params, random_grad):
    acc = accumulators.grpo(K, G, advantage="grpo", deterministic=True)
    batch = _batch(random_grad)
    single = _stream(acc, params, batch, seed=0)
    replicas = [
        _stream(acc, params, [t for t in batch if t[0] % REPLICAS == p], seed=p + 1)
        for p in range(REPLICAS)
    ]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *[r.total for r in replicas])
    mesh = Mesh(np.asarray(jax.devices()[:REPLICAS]), ("dp",))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("dp"), out_specs=P())
    def all_reduce(totals):
        local = jax.tree.map(lambda x: x[0], totals)
        summed, overflow = _exact.psum(local, "dp")
        return summed, overflow

    merged, overflow = all_reduce(stacked)
    assert not bool(overflow)
    for got, want in zip(
        jax.tree.leaves(merged.limbs), jax.tree.leaves(single.total.limbs), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Pairwise host-side merging in another order gives the same cells.
    total = replicas[3].total
    for p in (1, 0, 2):
        total, overflow = _exact.merge(total, replicas[p].total)
        assert not bool(overflow)
    for got, want in zip(
        jax.tree.leaves(total.limbs), jax.tree.leaves(single.total.limbs), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The merged replica state finalizes to the one-process gradient, bit for bit (the
    # counts B, N are psum'd integers too).
    got = acc.finalize(single._replace(total=merged))
    want = acc.finalize(single)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.int32), np.asarray(b).view(np.int32))


def _bits(tree):
    return [np.asarray(x).view(np.int32) for x in jax.tree.leaves(tree)]


def test_replica_states_finalize_the_summed_exact_tallies_to_the_one_process_bits(
    params, random_grad
):
    # The loop's data-parallel batch end: each replica's combined state (a policy total and
    # a term with its own loss_agg mode), global counts, one exact sum over the stack.
    policy = accumulators.grpo(K, G, advantage="grpo", deterministic=True)
    acc = accumulators.combine(policy, kl=accumulators.regularizer(0.1, "token-mean"))
    batch = _batch(random_grad)

    def stream(members, seed):
        state = acc.init(params)
        for i in np.random.default_rng(seed).permutation(len(members)):
            k, r, g, n = members[i]
            state = acc.add(state, k, r, g, n)
            state = acc.add_term(state, "kl", jax.tree.map(lambda x: 0.5 * x, g), n)
        return state

    single = stream(batch, seed=0)
    replicas = [stream([t for t in batch if t[0] % REPLICAS == p], p + 1) for p in range(REPLICAS)]
    b, n = (sum(accumulators.batch_totals(r)[i] for r in replicas) for i in (0, 1))
    assert (b, n) == accumulators.batch_totals(single)
    tallies = [accumulators.exact_tallies(r) for r in replicas]
    assert sorted(tallies[0]) == ["term/kl", "total"]
    summed = jax.tree.map(lambda *x: jnp.stack(x), *tallies)
    summed = jax.jit(accumulators.sum_exact_tallies)(summed)
    for p in range(REPLICAS):
        state = accumulators.with_batch_totals(replicas[p], b, n)
        got = _bits(acc.finalize(accumulators.with_exact_tallies(state, summed)))
        want = _bits(acc.finalize(single))
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True)), p
    assert accumulators.exact_tallies(accumulators.grpo(K, G).init(params)) is None


def test_summed_exact_tallies_past_the_headroom_are_a_clear_error(params):
    acc = accumulators.grpo(K, G, advantage="grpo", deterministic=True)
    state = acc.init(params)
    full = state.total._replace(adds=jnp.int32(_exact.MAX_ADDS + 1))
    with pytest.raises(ValueError, match=r"'total' holds \d+ adds summed over processes"):
        accumulators.with_exact_tallies(state, {"total": full})
    with pytest.raises(ValueError, match="do not match this state's"):
        accumulators.with_exact_tallies(state, {"total": full, "term/kl": full})
