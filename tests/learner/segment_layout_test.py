"""Segment passes sharded on the learner mesh (fsdp2 x tp2 on 4 fake CPU devices).

A 5-turn OPD trajectory with uneven turns, scored with teacher log-probs through
`SegmentFns.score` + `close` on the mesh, full fine-tuning and LoRA: its summed gradient equals
the same passes on one device and the one-shot full-trajectory gradient of `chunks.py`; the
caches keep their NamedSharding (KV heads over "tp") through every pass, growth and forks, gradients
come out with the trainable params' shardings, and a second trajectory compiles nothing new.

The 4-device part runs in a subprocess (the device count is fixed when jax starts): this file
run as a script is that subprocess, and prints its measurements as one JSON line.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from thundersync_jax.learner import chunks, segment_layout, segments
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.models import lora, qwen3, sharding

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every sharded dim divides by 2 (the mesh's fsdp and tp); the rest small and uneven.
CFG = qwen3.Qwen3Config(
    vocab_size=38,
    hidden_size=24,
    intermediate_size=26,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
)
# One bucket each: four programs per parameterization (compilation dominates the time).
SEG_BUCKETS = (8,)
CACHE_BUCKETS = (32,)
TURNS = ((0, 3), (2, 5), (1, 1), (3, 4), (0, 2))  # (observation, response) tokens per turn


def _episode(rng):
    """(tokens, 0/1 mask of response tokens, teacher log-probs, segment boundaries)."""
    pieces, masks, cuts = [rng.integers(1, CFG.vocab_size, 5)], [np.zeros(5)], [0]
    for obs, resp in TURNS:
        pieces += [rng.integers(1, CFG.vocab_size, obs), rng.integers(1, CFG.vocab_size, resp)]
        masks += [np.zeros(obs), np.ones(resp)]
        cuts.append(sum(map(len, pieces)))
    tokens = np.concatenate(pieces).astype(np.int32)
    mask = np.concatenate(masks).astype(np.float32)
    teacher = np.where(mask > 0, -rng.uniform(0.2, 3.0, len(tokens)), 0).astype(np.float32)
    return tokens, mask, teacher, cuts


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _relative_error(x, y):
    return float(np.linalg.norm(_flat(x) - _flat(y)) / np.linalg.norm(_flat(y)))


def _check_layout(tree, shardings, what):
    for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim), f"{what}: {x.sharding} is not {s}"


def _streamed(fns, trainable, episode, base=None, cache_sharding=None, grad_shardings=None):
    """Σ direct parts + the sweep, summed on device; checks layouts after every call if given."""
    tokens, mask, teacher, cuts = episode
    traj, total = fns.open(), None
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        traj, res = fns.score(
            trainable, traj, tokens[a:b], mask[a:b], teacher_logprobs=teacher[a:b], base_params=base
        )
        if cache_sharding is not None:
            _check_layout((traj.k, traj.v, traj.dk, traj.dv), [cache_sharding] * 4, "cache")
        if res.grad is not None:
            if grad_shardings is not None:
                _check_layout(res.grad, grad_shardings, "direct gradient")
            total = res.grad if total is None else jax.tree.map(jax.numpy.add, total, res.grad)
    deferred, _ = fns.close(trainable, traj, base_params=base)
    if grad_shardings is not None:
        _check_layout(deferred, grad_shardings, "sweep gradient")
    return jax.tree.map(jax.numpy.add, total, deferred)


def _one_shot(graphdef, trainable, episode, base=None):
    """h = Σ_t Â_t ∇ log π(o_t) over the whole trajectory on one device (`chunks.py`)."""
    tokens, mask, teacher, _ = episode
    score = chunks.make_score_grad_fn(graphdef, (32,), lora=base is not None)
    student = TokenLogprobFn(score)(trainable, tokens[None], base)[0]
    adv = np.where(mask > 0, teacher - student, 0.0).astype(np.float32)
    return score(trainable, tokens[None], mask[None], adv[None], base_params=base)[0]


def _compare_on_mesh(graphdef, mesh, trainable, train_sh, base=None, base_sh=None):
    """Errors vs one device and vs one-shot, and compile counts, for one parameterization."""
    kind = base is not None
    episode = _episode(np.random.default_rng(7))
    single = segments.make_segment_fns(graphdef, CFG, SEG_BUCKETS, CACHE_BUCKETS, lora=kind)
    h_single = _streamed(single, trainable, episode, base)
    h_ref = _one_shot(graphdef, trainable, episode, base)

    sharded = segments.make_segment_fns(
        graphdef, CFG, SEG_BUCKETS, CACHE_BUCKETS, lora=kind, mesh=mesh, grad_shardings=train_sh
    )
    cache_sh = NamedSharding(mesh, PartitionSpec(None, None, None, "tp", None))
    on_mesh = jax.device_put(trainable, train_sh)
    base_on_mesh = None if base is None else jax.device_put(base, base_sh)
    h_mesh = _streamed(sharded, on_mesh, episode, base_on_mesh, cache_sh, train_sh)
    compiles = sharded.compiles
    # A second trajectory with the same turn lengths: every program is already compiled.
    again = _episode(np.random.default_rng(8))
    _streamed(sharded, on_mesh, again, base_on_mesh, cache_sh, train_sh)
    return {
        "vs_single": _relative_error(h_mesh, h_single),
        "vs_one_shot": _relative_error(h_mesh, h_ref),
        "compiles": compiles,
        "compiles_single": single.compiles,
        "compiles_after_second": sharded.compiles,
    }


def _grown_and_forked(graphdef, mesh, param_sh):
    """Growing a cache (eager pad) and forking it (eager copy) keep the layout and values."""
    fns = segments.make_segment_fns(
        graphdef, CFG, (8,), (16, 32), mesh=mesh, grad_shardings=param_sh
    )
    cache_sh = NamedSharding(mesh, PartitionSpec(None, None, None, "tp", None))
    traj = fns.open()
    filled = jax.device_put(np.random.default_rng(2).normal(size=traj.k.shape), cache_sh)
    traj = traj._replace(k=filled.astype(np.float32))
    grown = fns._grown(traj, 20)  # no segment program is compiled for this
    forked = fns.fork(grown)
    for t in (grown, forked):
        assert t.capacity == 32, t.capacity
        _check_layout((t.k, t.v, t.dk, t.dv), [cache_sh] * 4, "grown / forked cache")
    np.testing.assert_array_equal(np.asarray(forked.k)[:, :, :16], np.asarray(filled, np.float32))
    return True


def _on_four_devices():
    """The subprocess: full FT and LoRA on a fsdp2 x tp2 mesh; prints the results as JSON."""
    start = time.perf_counter()
    assert jax.device_count() == 4, jax.devices()
    mesh = sharding.make_mesh(2, 2, jax.devices())
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    param_sh = sharding.param_shardings(abstract, sharding.DEFAULT_RULES, mesh)
    assert any(s.spec != PartitionSpec() for s in jax.tree.leaves(param_sh))  # really split
    fresh = lora.init(params, rank=3, alpha=6.0, key=jax.random.key(1))
    adapters = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), fresh)
    results = {
        "full": _compare_on_mesh(graphdef, mesh, params, param_sh),
        "lora": _compare_on_mesh(
            graphdef, mesh, adapters, sharding.replicated(adapters, mesh), params, param_sh
        ),
    }
    results["grown_and_forked"] = _grown_and_forked(graphdef, mesh, param_sh)
    # KV heads that do not divide by tp stay whole on every device.
    odd = dataclasses.replace(CFG, num_key_value_heads=3)
    fns = segments.make_segment_fns(graphdef, odd, mesh=mesh, grad_shardings=param_sh)
    results["odd_heads_spec"] = str(fns.open().k.sharding.spec)
    results["seconds"] = time.perf_counter() - start
    print("RESULTS " + json.dumps(results))


@pytest.mark.slow  # a 4-device child process
def test_segments_on_a_fsdp2_tp2_mesh_match_one_device_and_the_one_shot_gradient():
    # The session's XLA flags (tests/conftest.py: compile-fast) on 4 devices: it compiles much
    # and runs each program once (72 s, against 144 s with XLA's defaults).
    count = "--xla_force_host_platform_device_count"
    flags = re.sub(rf"{count}=\d+", f"{count}=4", os.environ["XLA_FLAGS"])
    env = dict(
        os.environ,
        XLA_FLAGS=flags,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=REPO,
    )
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [s for s in done.stdout.splitlines() if s.startswith("RESULTS ")][-1]
    results = json.loads(line[len("RESULTS ") :])
    print(results)
    for mode in ("full", "lora"):
        r = results[mode]
        assert r["vs_single"] <= 1e-5, (mode, r)
        assert r["vs_one_shot"] <= 1e-5, (mode, r)
        # The same programs as on one device (sharding adds no shapes), bucketed, and none new
        # for a second trajectory of the same turn lengths.
        assert r["compiles"] == r["compiles_single"], (mode, r)
        assert r["compiles"] <= 3 * len(SEG_BUCKETS) * (len(CACHE_BUCKETS) + 1) * 2, (mode, r)
        assert r["compiles_after_second"] == r["compiles"], (mode, r)
    assert results["grown_and_forked"]
    assert results["odd_heads_spec"] == str(PartitionSpec(None, None, None, None, None))


def test_a_mesh_without_gradient_shardings_is_refused():
    mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
    with pytest.raises(ValueError, match="grad_shardings"):
        segment_layout.segment_layout(CFG, mesh)
    with pytest.raises(ValueError, match="mesh"):
        segment_layout.segment_layout(CFG, None, grad_shardings={})
    assert segment_layout.cache_spec(2, mesh) == PartitionSpec(None, None, None, None, None)


if __name__ == "__main__":
    _on_four_devices()
