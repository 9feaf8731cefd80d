"""Add/finalize time of exact (deterministic) vs float32 tallies, side by side on one machine.

    python -m thundersync_jax.accumulators.benchmark --params=1000000 --repeats=7

Streams `repeats` batches of K × G trajectories (binary rewards, random arrival order) into
jitted, donated `grpo` and `opd` accumulators of both modes, alternating the modes batch by
batch so machine load hits both alike, and prints the median time of one add, of the group
closes and of finalize (after a warm-up batch that compiles).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax import accumulators


def _params(total: int, leaves: int):
    """`leaves` float32 matrices of about total/leaves entries each (width 256)."""
    rows = max(1, total // leaves // 256)
    return {f"w{i}": jnp.zeros((rows, 256), jnp.float32) for i in range(leaves)}


def _timed(fn, *args):
    """(result, CPU seconds of this process): less sensitive than wall time to other
    processes on a shared machine (XLA's CPU threads are counted)."""
    start = time.process_time()
    out = jax.block_until_ready(fn(*args))
    return out, time.process_time() - start


def _grpo_batch(acc, fns, params, grads, rng, num_groups, group_size):
    """One batch in a random order; returns (add times, close time, finalize time)."""
    add, close, finalize = fns
    state = acc.init(params)
    adds = []
    # Four groups stream at a time (max_open_groups=4), members interleaved at random.
    block = 4 * group_size
    trajectories = np.arange(num_groups * group_size)
    order = np.concatenate(
        [rng.permutation(trajectories[j : j + block]) for j in range(0, trajectories.size, block)]
    )
    for i in order:
        reward = float(rng.integers(0, 2))
        state, seconds = _timed(add, state, int(i) // group_size, reward, grads[i % 4], 7)
        adds.append(seconds)
    state, close_s = _timed(close, state, 0)  # idempotent: every group closed itself
    acc.check(state)  # nothing was skipped
    _, final_s = _timed(finalize, state)
    return adds, close_s, final_s


def _opd_batch(acc, fns, params, grads, count):
    add, finalize = fns
    state = acc.init(params)
    adds = []
    for i in range(count):
        state, seconds = _timed(add, state, grads[i % 4], 7)
        adds.append(seconds)
    _, final_s = _timed(finalize, state)
    return adds, final_s


def run(total: int, leaves: int, repeats: int, num_groups: int, group_size: int) -> dict:
    params = _params(total, leaves)
    rng = np.random.default_rng(0)
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)]
    grads = [jax.tree.map(lambda g, s=s: g * s, grads[0]) for s in (1.0, 3e-3, 70.0, -0.5)]
    setups = {}
    for deterministic in (False, True):
        acc = accumulators.grpo(
            num_groups, group_size, max_open_groups=4, max_buckets=2, deterministic=deterministic
        )
        fns = (
            jax.jit(acc.add, donate_argnums=0),
            jax.jit(acc.close, donate_argnums=0),
            jax.jit(acc.finalize),
        )
        direct = accumulators.opd(deterministic=deterministic)
        direct_fns = (jax.jit(direct.add, donate_argnums=0), jax.jit(direct.finalize))
        setups[deterministic] = (acc, fns, direct, direct_fns)
    keys = ("add", "batch_adds", "close", "finalize", "opd_add", "opd_final")
    times = {d: {k: [] for k in keys} for d in setups}
    for repeat in range(repeats + 1):  # repeat 0 compiles and is dropped
        for deterministic, (acc, fns, direct, direct_fns) in setups.items():
            adds, close_s, final_s = _grpo_batch(
                acc, fns, params, grads, rng, num_groups, group_size
            )
            opd_adds, opd_final = _opd_batch(direct, direct_fns, params, grads, 16)
            if repeat:
                t = times[deterministic]
                t["add"] += adds
                t["batch_adds"].append(sum(adds))
                t["close"].append(close_s)
                t["finalize"].append(final_s)
                t["opd_add"] += opd_adds
                t["opd_final"].append(opd_final)
    return {d: {k: statistics.median(v) for k, v in t.items()} for d, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=8)
    args = parser.parse_args()
    medians = run(args.params, args.leaves, args.repeats, args.groups, args.group_size)
    size = sum(x.size for x in jax.tree.leaves(_params(args.params, args.leaves)))
    print(
        f"params {size}, {args.leaves} leaves, K={args.groups} G={args.group_size}, "
        f"{args.repeats} batches, device {jax.devices()[0].platform}; "
        "medians of process CPU time in ms"
    )
    print("| measure | float32 tallies | deterministic | ratio |")
    print("|---|---:|---:|---:|")
    for key, label in [
        ("add", "grpo add (one trajectory)"),
        ("batch_adds", "grpo all adds of a batch (with folds)"),
        ("finalize", "grpo finalize"),
        ("opd_add", "opd add (one turn)"),
        ("opd_final", "opd finalize"),
    ]:
        fast, exact = medians[False][key] * 1e3, medians[True][key] * 1e3
        print(f"| {label} | {fast:.3f} | {exact:.3f} | {exact / fast:.2f}x |")


if __name__ == "__main__":
    main()
