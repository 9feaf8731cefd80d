"""Tallies carry the parameters' shardings over a mesh of the 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from thundersync_jax import accumulators
from thundersync_jax.accumulators import reference


def _sharded_params():
    # The project's meshes (models/sharding.py) are plain `Mesh`es: Auto axis types.
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    specs = {"w": P("fsdp", "tp"), "b": P(), "v": P(None, "fsdp")}
    shapes = {"w": (12, 6), "b": (7,), "v": (3, 8)}
    params = {
        k: jax.device_put(jnp.zeros(shapes[k], jnp.float32), NamedSharding(mesh, specs[k]))
        for k in shapes
    }
    return mesh, params


def test_tallies_and_gradient_are_sharded_like_params():
    mesh, params = _sharded_params()
    acc = accumulators.grpo(2, 2, max_open_groups=2)
    state = acc.init(params)
    for k, p in params.items():
        assert state.total[k].sharding == p.sharding
        stacked = NamedSharding(mesh, P(None, *p.sharding.spec))
        assert state.shifted[k].sharding.is_equivalent_to(stacked, 1 + p.ndim)
        assert state.plain[k].sharding.is_equivalent_to(stacked, 1 + p.ndim)

    rng = np.random.default_rng(0)
    trajectories = []
    jit_add = jax.jit(acc.add, donate_argnums=0)
    for i, (k, r) in enumerate([(0, 1.0), (1, 0.0), (0, 0.0), (1, 2.0)]):
        grad = {
            name: jax.device_put(rng.normal(size=p.shape).astype(np.float32), p.sharding)
            for name, p in params.items()
        }
        trajectories.append((k, r, grad, 3 + i))
        add = jit_add if i % 2 else acc.add  # eager and jitted adds interleave
        state = add(state, k, r, grad, 3 + i)
        for name, p in params.items():
            assert state.total[name].sharding.is_equivalent_to(p.sharding, p.ndim)
    grads = jax.jit(acc.finalize)(state)
    for name, p in params.items():
        assert grads[name].sharding.is_equivalent_to(p.sharding, p.ndim)
    assert reference.relative_error(grads, reference.grpo_gradient(trajectories)) < 1e-5


def _grpo_add(acc):
    return lambda state, grad: acc.add_weighted(state, 0, 0.5, grad, 3, 1)


def _opd_add(acc):
    return lambda state, grad: acc.add_weighted(state, grad, 3, 1)


@pytest.mark.parametrize(
    "make, add_of",
    [
        (lambda: accumulators.grpo(2, 2, max_open_groups=2), _grpo_add),
        (lambda: accumulators.grpo(2, 2, max_open_groups=2, deterministic=True), _grpo_add),
        (lambda: accumulators.opd(), _opd_add),
    ],
    ids=["grpo", "grpo-exact", "opd"],
)
def test_a_fresh_state_is_laid_out_like_the_adds_outputs(make, add_of):
    # The first add of a batch gets `init`'s state, every later one the previous add's output:
    # with params on a mesh both must be the same types (mesh and layout included), or a
    # training run traces and compiles its add twice (it did: `add_weighted` per run).
    mesh, params = _sharded_params()
    acc = make()
    acc_add, traces = add_of(acc), []

    def add(state, grad):
        traces.append(1)  # runs once per trace
        return acc_add(state, grad)

    jit_add = jax.jit(add, donate_argnums=0)
    grad = jax.tree.map(jnp.ones_like, params)
    state = acc.init(params)
    fresh = [(x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(state)]
    state = jit_add(state, grad)
    state = jit_add(state, grad)
    assert len(traces) == 1
    after = jax.tree.leaves(state)
    assert len(after) == len(fresh)
    for (shape, dtype, sharding), x in zip(fresh, after, strict=True):
        assert (shape, dtype) == (x.shape, x.dtype)
        if x.size:  # an empty stack (the other estimator family's) has no layout to keep
            assert sharding.is_equivalent_to(x.sharding, len(shape)), (sharding, x.sharding)
