"""Predicted step time of the b200 recipes on P nodes (docs/scale_out.md, issue 15).

    python -m thundersync_jax.bench.scale_model --traces=200

Per step, with P learner processes (one per node) streaming their own groups k mod P:

    T(P) = E[ max_p S_p ] + x + A(P) + opt + publish

S_p is process p's stream timeline (`sim.simulate` on its own groups' arrivals, the real
`Planner` on a virtual clock): its last reward plus the learner work still queued then.
The step waits for the slowest process, so the expectation of the max over P is taken over
`--traces` random batches drawn from the rollout-time distribution below. x is the
batch-end exchange of scalars, A(P) the ring all-reduce of each GPU's gradient shard.
Every hardware number is an assumption (no B200 in this project), listed in `ASSUMED`
and printed with the table.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from configs import b200
from thundersync_jax import sim
from thundersync_jax.bench import flops
from thundersync_jax.learner import memory
from thundersync_jax.models import auto

ASSUMED = dict(
    bf16_flops=2.25e15,  # B200 dense bf16 tensor FLOP/s per GPU (no sparsity)
    mfu=0.35,  # of that, reached by the learner's remat forward + backward chunks
    hbm_bytes_s=8.0e12,  # B200 HBM3e bandwidth (the optimizer step is bandwidth-bound)
    d2h_bytes_s=50e9,  # per GPU, device -> pinned host (PCIe Gen5 x16, ~80% of 64 GB/s)
    host_mem_bytes_s=500e9,  # the node's two CPU sockets' DRAM bandwidth for the host adds
    ib_bytes_s=50e9,  # per GPU between nodes: one 400 Gb/s NIC per GPU (DGX B200)
    exchange_s=0.01,  # the batch-end allgathers of counts and rewards (a few KB)
    publish_h2d_bytes_s=25e9,  # per rollout GPU, /dev/shm snapshot -> engine weights
    rollout_mean_s=300.0,  # mean SWE episode (up to 30 turns): seconds to its reward
    rollout_sigma=0.6,  # std of log episode duration (lognormal)
    rollout_group_icc=0.3,  # share of that variance shared within a prompt's group
    mean_tokens=4000,  # mean loss tokens of an episode (the full recipe caps them at 8192)
)


def chunk_flops(cfg: Any, length: int) -> float:
    """Learner FLOPs per token of a `length`-token row: remat runs the forward twice, then
    the backward (2 + 2 + 4 FLOPs per active weight; LoRA has no frozen-weight gradients:
    2 + 2 + 2), and causal attention's QK^T and AV over length / 2 keys on average, 4 passes.
    A MoE token is priced by the weights it runs through (`auto.active_params`: its top-k
    experts), not by every expert."""
    arch = auto.config_from_section(cfg.model)
    per_weight = 6.0 if cfg.lora.enabled else 8.0
    attention = 4 * 2 * arch.num_hidden_layers * flops.attention_width(arch) * (length / 2)
    return per_weight * auto.active_params(arch) + attention


def _chunk_seconds(
    cfg: Any, rows: int, length: int, n_params: int, host_tallies: bool, a: dict
) -> float:
    """One chunk on the node's learner GPUs: compute, or the host add when that is slower."""
    gpus = int(cfg.node.learner_gpus)
    compute = rows * length * chunk_flops(cfg, length) / (gpus * a["bf16_flops"] * a["mfu"])
    if not host_tallies:
        return compute
    # Per chunk: w·h (f32, the GPU's shard) to host, then R' and H of one slot read and
    # written and w·h read on the host: 5 tally-sized passes over host DRAM for the node.
    # Tallies cover every parameter (each expert's too): priced by the total.
    shard = 4 * n_params / gpus
    copy = shard / a["d2h_bytes_s"]
    host_add = 5 * shard * gpus / a["host_mem_bytes_s"]
    return max(compute, copy, host_add)  # the three pipeline across chunks (async dispatch)


def cost_model(cfg: Any, a: dict) -> sim.CostModel:
    """Per-shape chunk seconds for every padded (rows, bucket) the learner can run."""
    host = cfg.accum.placement == "host"
    buckets = tuple(int(b) for b in cfg.learner.seq_buckets)
    plan = memory.plan(cfg)
    shapes = [
        (rows, n, _chunk_seconds(cfg, rows, n, plan.num_params, host, a))
        for rows in (1, 2, 4, 8, 16, 32, 64)
        for n in buckets
    ]
    per_gpu = plan.trainable_params / int(cfg.node.learner_gpus)
    opt_s = 28 * per_gpu / a["hbm_bytes_s"]  # adamw: read p, g, m, v; write p, m, v
    snapshot = 2 * plan.num_params  # bf16 weights, every expert (LoRA publishes merged ones)
    pub_s = (
        snapshot / (int(cfg.node.learner_gpus) * a["d2h_bytes_s"])
        + snapshot / int(cfg.node.rollout_gpus) / a["publish_h2d_bytes_s"]
    )
    return sim.CostModel(0.0, 0.0, opt_s, pub_s, buckets, row_padding=True, shape_s=shapes)


def allreduce_s(cfg: Any, nodes: int, a: dict) -> float:
    """Ring all-reduce of each learner GPU's f32 gradient shard over its own NIC."""
    shard = 4 * memory.plan(cfg).trainable_params / int(cfg.node.learner_gpus)
    return 2 * (nodes - 1) / nodes * shard / a["ib_bytes_s"]


def _process_trace(trace, nodes: int, p: int):
    mine = [x for x in trace if x.group % nodes == p]
    return [x._replace(group=x.group // nodes) for x in mine]


def predict(cfg: Any, nodes: int, traces: int, a: dict, per_node: bool = False) -> dict:
    """Mean (over random batches) step-time terms of `cfg` on `nodes` nodes.

    per_node: every node keeps the recipe's K groups (global batch K·P, weak scaling);
    otherwise the global batch stays K groups, split K/P per node (strong scaling).
    """
    rl = cfg.rl
    num_groups = int(rl.num_groups) * (nodes if per_node else 1)
    cost = cost_model(cfg, a)
    max_chunk = int(cfg.rollout.max_traj_tokens) * int(rl.group_size)
    spans, slowest, busy = [], [], []
    for seed in range(traces):
        trace = sim.lognormal_trace(
            num_groups, int(rl.group_size), a["rollout_sigma"],
            a["rollout_group_icc"], a["rollout_mean_s"], seed, mean_tokens=a["mean_tokens"],
        )  # fmt: skip
        trace = [x._replace(tokens=min(x.tokens, int(cfg.rollout.max_traj_tokens))) for x in trace]
        per_process = [
            sim.simulate(
                _process_trace(trace, nodes, p),
                cfg.schedule,
                cost,
                max_chunk,
                int(rl.max_open_groups) or None,
            )  # fmt: skip
            for p in range(nodes)
        ]
        spans.append(max(x.arrival_s for x in trace))
        # Each process's own timeline without its opt and publish (they come after the sum).
        slowest.append(max(r.step_time_s - cost.opt_s - cost.pub_s for r in per_process))
        busy.append(statistics.mean(r.learner_work_s for r in per_process))
    stream = statistics.mean(slowest)
    reduce = allreduce_s(cfg, nodes, a) if nodes > 1 else 0.0
    return dict(
        rollout_span_s=statistics.mean(spans),
        slowest_stream_s=stream,
        learner_work_per_process_s=statistics.mean(busy),
        exchange_s=a["exchange_s"] if nodes > 1 else 0.0,
        allreduce_s=reduce,
        opt_s=cost.opt_s,
        publish_s=cost.pub_s,
        step_s=stream + (a["exchange_s"] if nodes > 1 else 0.0) + reduce + cost.opt_s + cost.pub_s,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=200)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 8])
    args = ap.parse_args()
    print("assumed:", ", ".join(f"{k}={v:g}" for k, v in ASSUMED.items()))
    for per_node in (False, True):
        print("\nglobal batch:", "K x G per node (x P)" if per_node else "K x G in all")
        _table(args, per_node)


def _table(args, per_node: bool) -> None:
    print("| recipe | nodes | rollout span R | slowest process R_p + tail_p | learner work "
          "per process | exchange | all-reduce | opt | publish | **step** |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for variant in b200.VARIANTS:
        cfg = b200.get_config(variant)
        for nodes in args.nodes:
            r = predict(cfg, nodes, args.traces, ASSUMED, per_node)
            name = f"{variant} ({cfg.schedule}, tallies on {cfg.accum.placement})"
            cells = [r[k] for k in ("rollout_span_s", "slowest_stream_s",
                                    "learner_work_per_process_s", "exchange_s", "allreduce_s",
                                    "opt_s", "publish_s")]  # fmt: skip
            print(f"| {name} | {nodes} | " + " | ".join(f"{c:.2f} s" for c in cells)
                  + f" | **{r['step_s']:.1f} s** |")  # fmt: skip


if __name__ == "__main__":
    main()
