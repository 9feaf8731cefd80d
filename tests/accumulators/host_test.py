"""Host-resident tallies (`placement="host"`): in host memory, and the device run's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from thundersync_jax import accumulators
from thundersync_jax.accumulators import _host, reference

# (group, reward) arrivals over 3 groups of 3 with 2 slots: group 2 waits for a free slot,
# group 1 is closed short (2 of 3 members) before finalize.
ARRIVALS = [(0, 1.0), (1, 0.0), (0, 0.0), (1, 2.0), (0, 1.0), (2, 0.5), (2, 0.5), (2, 3.0)]


def _leaves_kind(tree) -> set:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree) if x.size}


def _run(params, placement, advantage, grads):
    acc = accumulators.grpo(3, 3, advantage=advantage, max_open_groups=2, placement=placement)
    state = acc.init(params)
    add = jax.jit(acc.add, donate_argnums=0)  # as the loop calls it (eager close below)
    for i, ((k, r), g) in enumerate(zip(ARRIVALS, grads, strict=True)):
        state = add(state, k, r, g, 2 + i)
        if i == 3:
            state = acc.close(state, 1)
    return state, acc.finalize(state)


def _grads(params, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in ARRIVALS:
        out.append(
            jax.tree.map(
                lambda p: jax.device_put(
                    rng.normal(size=p.shape).astype(np.float32), getattr(p, "sharding", None)
                ),
                params,
            )
        )
    return out


@pytest.mark.parametrize("advantage", ["grpo", "batch", "squared"])
def test_host_tallies_equal_device_tallies(params, advantage):
    # A non-affine callable keeps reward buckets instead of the affine pair.
    fn = (lambda r: jnp.square(r - jnp.mean(r))) if advantage == "squared" else advantage
    grads = _grads(params)
    host_state, host = _run(params, "host", fn, grads)
    device_state, device = _run(params, "device", fn, grads)
    tallies = lambda s: (s.total, s.shifted, s.plain, s.buckets)
    assert _leaves_kind(tallies(host_state)) == {_host.host_memory_kind()}
    assert _leaves_kind(tallies(device_state)) == {"device"}
    assert _leaves_kind(host) == {"device"}  # the gradient comes back for the optimizer
    # Same update functions on the same float32 operands: the same bits.
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(device), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # And both are the float64 batch gradient.
    trajectories = [
        (k, r, g, 2 + i) for i, ((k, r), g) in enumerate(zip(ARRIVALS, grads, strict=True))
    ]
    assert reference.relative_error(host, reference.grpo_gradient(trajectories, fn)) < 1e-5


def test_host_tallies_keep_the_params_sharding_in_host_memory():
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    specs = {"w": P("fsdp", "tp"), "b": P()}
    params = {
        "w": jax.device_put(jnp.zeros((12, 6)), NamedSharding(mesh, specs["w"])),
        "b": jax.device_put(jnp.zeros((7,)), NamedSharding(mesh, specs["b"])),
    }
    grads = _grads(params, seed=1)
    host_state, host = _run(params, "host", "grpo", grads)
    _, device = _run(params, "device", "grpo", grads)
    kind = _host.host_memory_kind()
    for name, p in params.items():
        stacked = NamedSharding(mesh, P(None, *p.sharding.spec), memory_kind=kind)
        assert host_state.shifted[name].sharding.is_equivalent_to(stacked, 1 + p.ndim)
        assert host_state.total[name].sharding.memory_kind == kind
        assert host[name].sharding.is_equivalent_to(p.sharding, p.ndim)
        np.testing.assert_array_equal(np.asarray(host[name]), np.asarray(device[name]))


def test_host_placement_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="placement must be one of"):
        accumulators.grpo(2, 2, placement="disk")
    with pytest.raises(ValueError, match="deterministic=True"):
        accumulators.grpo(2, 2, placement="host", deterministic=True)
    # jax 0.10.2's CPU devices have both host spaces; pinned is preferred.
    assert _host.host_memory_kind(jax.devices()[0]) == "pinned_host"
