"""Per-chunk cost of host-resident vs device-resident GRPO tallies, side by side (issue 15).

    python -m thundersync_jax.bench.host_tallies --hidden=256 --layers=4 --repeats=5

A small Qwen3 streams batches of K × G trajectories through the GRPO learner
(`algorithms.grpo.batch_learner`: pack rows, score gradient, `add_weighted`) with
`accum.placement` "device" and "host", alternating the two batch by batch so machine load
hits both alike; the first batch of each compiles and is dropped. Per chunk it records the
wall time of `learner.process` (which waits for the device's work: the whole add with device
tallies, the score gradient only with host tallies, the copy and host add running on) and,
at batch end, the time until the host adds are done (`block_until_ready` of the state), and
the batch's wall and CPU time per chunk until then (the overhead a run pays). It prints the
medians, and the add alone (gradient ready, state waited on) per mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import numpy as np
from flax import nnx

from thundersync_jax import accumulators
from thundersync_jax.algorithms import grpo
from thundersync_jax.learner import chunks
from thundersync_jax.models import qwen3
from thundersync_jax.schedule.planner import WorkItem

PLACEMENTS = ("device", "host")


@dataclasses.dataclass
class _Traj:
    tokens: np.ndarray
    loss_mask: np.ndarray
    reward: float
    policy_versions: tuple = (0,)


def _policy(hidden: int, layers: int):
    cfg = qwen3.Qwen3Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        tie_word_embeddings=False,
    )
    graphdef, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return cfg, graphdef, params


def _batch(rng, num_groups, group_size, tokens, vocab) -> list[WorkItem]:
    """One batch's items in a random (stream-like) arrival order, one trajectory per chunk."""
    items = []
    for k in range(num_groups):
        for m in range(group_size):
            mask = np.ones(tokens, np.float32)
            mask[:8] = 0
            traj = _Traj(rng.integers(1, vocab, tokens).astype(np.int32), mask, float(m % 2))
            items.append(WorkItem(f"g{k}m{m}", k, traj.reward, tokens - 8, 0.0, payload=traj))
    return [items[i] for i in rng.permutation(len(items))]


def _one_batch(learner, params, items):
    """Per-chunk process() seconds, drain seconds, and the batch's wall and CPU seconds.

    The batch ends when its state is done (host adds included); CPU seconds are the
    process's (all threads), less sensitive than wall time to other processes' load.
    """
    state = learner.init(params, 0)
    jax.block_until_ready(state.acc)
    per_chunk = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for item in items:
        start = time.perf_counter()
        state = learner.process(state, [item])
        per_chunk.append(time.perf_counter() - start)
    start = time.perf_counter()
    jax.block_until_ready(state.acc)
    drain = time.perf_counter() - start
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    learner.finalize(state)
    return per_chunk, drain, wall / len(items), cpu / len(items)


def _add_only(acc, params, grad, repeats):
    """Median seconds of one jitted, donated add_weighted with the gradient ready."""
    add = jax.jit(acc.add_weighted, donate_argnums=0)
    times = []
    for i in range(repeats + 1):
        state = acc.init(params)
        start = time.perf_counter()
        state = jax.block_until_ready(add(state, 0, float(i % 2), grad, 100, 1))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def run(hidden, layers, num_groups, group_size, tokens, repeats) -> dict:
    cfg, graphdef, params = _policy(hidden, layers)
    score_fn = chunks.make_score_grad_fn(graphdef, seq_buckets=(tokens,), pad_id=0)
    learners, accs = {}, {}
    for placement in PLACEMENTS:
        accs[placement] = accumulators.grpo(
            num_groups, group_size, max_open_groups=num_groups, placement=placement
        )
        learners[placement] = grpo.batch_learner(accs[placement], score_fn, pad_id=0)
    rng = np.random.default_rng(0)
    chunk_s, drain_s, wall_s, cpu_s = ({p: [] for p in PLACEMENTS} for _ in range(4))
    for b in range(repeats + 1):  # batch 0 compiles
        items = _batch(rng, num_groups, group_size, tokens, cfg.vocab_size)
        for placement in PLACEMENTS if b % 2 else PLACEMENTS[::-1]:
            per_chunk, drain, wall, cpu = _one_batch(learners[placement], params, items)
            if b:
                chunk_s[placement] += per_chunk
                drain_s[placement].append(drain)
                wall_s[placement].append(wall)
                cpu_s[placement].append(cpu)
    grad = jax.tree.map(lambda p: np.ones(p.shape, np.float32), params)
    grad = jax.device_put(grad)
    add_s = {p: _add_only(accs[p], params, grad, 2 * repeats) for p in PLACEMENTS}
    num_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    return dict(
        num_params=num_params,
        host_memory_kind=accumulators.host_memory_kind(),
        chunks_per_mode=len(chunk_s["device"]),
        chunk_ms={p: 1e3 * statistics.median(chunk_s[p]) for p in PLACEMENTS},
        drain_ms={p: 1e3 * statistics.median(drain_s[p]) for p in PLACEMENTS},
        batch_wall_ms={p: 1e3 * statistics.median(wall_s[p]) for p in PLACEMENTS},
        batch_cpu_ms={p: 1e3 * statistics.median(cpu_s[p]) for p in PLACEMENTS},
        add_ms={p: 1e3 * add_s[p] for p in PLACEMENTS},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--num_groups", type=int, default=4)
    ap.add_argument("--group_size", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    r = run(a.hidden, a.layers, a.num_groups, a.group_size, a.tokens, a.repeats)
    mb = 4 * r["num_params"] / 1e6
    print(f"params {r['num_params']:,} (f32 tally {mb:.1f} MB), host memory kind "
          f"{r['host_memory_kind']}, {r['chunks_per_mode']} chunks per mode")  # fmt: skip
    print("| median per chunk, ms | device tallies | host tallies | host / device |")
    print("|---|---:|---:|---:|")
    rows = (("process() call (what the learner waits for)", "chunk_ms"),
            ("batch wall time / chunks (host adds done)", "batch_wall_ms"),
            ("batch CPU time / chunks (all threads)", "batch_cpu_ms"),
            ("batch-end drain (last host adds)", "drain_ms"),
            ("add alone, gradient ready, state waited on", "add_ms"))  # fmt: skip
    for name, key in rows:
        d, h = r[key]["device"], r[key]["host"]
        print(f"| {name} | {d:.2f} | {h:.2f} | {h / d if d else float('nan'):.2f}x |")


if __name__ == "__main__":
    main()
