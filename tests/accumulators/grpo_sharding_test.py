"""Tallies carry the parameters' shardings over a mesh of the 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
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
