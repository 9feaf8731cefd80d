"""Publication latency against a plain memory copy of the same bytes (experiments/bench_publish.py).

End-to-end publication = `snapshots.publish` (one copy of each leaf into the snapshot file inside
Orbax's temporary directory, manifest, commit by rename) + the engine's `load_weights` (manifest
and structure checks, read-only mapping of the file, `jax.device_put`) + its acknowledgement
over the engine protocol, measured on a real engine process. The baseline is `np.copyto` of one
buffer holding all parameter bytes into a preallocated, touched buffer, timed after every
publication so both see the same machine load.

Two series in one run: "warm" publications fill the spare file prepared in the background since
the previous publication (the bench waits for it outside the timer, standing in for the training
step between publications); "cold" publications (prepare_next=False) allocate a new file.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from thundersync_jax.rollout import server as rollout_server
from thundersync_jax.rollout import snapshot_spares, snapshots


def bench_model_config(target_mib: int = 128) -> dict[str, Any]:
    """An HF Qwen3 config whose float32 parameters take about `target_mib` MiB."""
    hidden, vocab, inter, heads, kv, head_dim = 1024, 16384, 2816, 16, 8, 64
    embed = vocab * hidden
    per_layer = hidden * (heads + 2 * kv) * head_dim + heads * head_dim * hidden
    per_layer += 3 * hidden * inter + 2 * hidden + 2 * head_dim
    layers = max(1, round((target_mib * 2**20 / 4 - embed) / per_layer))
    return dict(
        model_type="qwen3",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        tie_word_embeddings=True,
    )


def measure_publication(
    target_mib: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    base: str = snapshots.DEFAULT_BASE,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Publishes a ~target_mib model to one real engine, in a warm and a cold series.

    Each series runs `warmup` unmeasured then about `repeats` measured publications (in two
    interleaved halves). Returns the byte count, the memory copy's median seconds, and per
    series the medians of the snapshot write, of load + acknowledgement and end to end, their
    bandwidths, and `ratio` = end-to-end bandwidth / memory-copy bandwidth; top-level `ratio`
    is the warm series'.
    """
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.models import qwen3
    from thundersync_jax.rollout.manager import EngineManager

    hf = bench_model_config(target_mib)
    cfg = qwen3.Qwen3Config.from_hf(hf)
    params = nnx.split(qwen3.Qwen3(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0)), nnx.Param)[1]
    num_bytes = sum(int(np.asarray(x).nbytes) for x in _leaves(params))
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="bench-publish-", dir=base)
    server_args = rollout_server.server_args(hf, max_batch=1, max_seq_len=16)
    series = {"warm": ([], [], []), "cold": ([], [], [])}
    copy_src = np.random.default_rng(0).integers(0, 255, num_bytes, dtype=np.uint8)
    copy_dst = np.zeros_like(copy_src)  # allocated and touched: a copy, not page faults
    copy_all: list[float] = []
    mgr = EngineManager(server_args, num_engines=1, env=env).start()
    try:
        version = 0
        for mode in ("warm", "cold", "warm", "cold"):  # interleaved against drifting load
            write_s, load_s, total_s = series[mode]
            for i in range(warmup + -(-repeats // 2)):
                t0 = time.perf_counter()
                # As EngineManager.publish does: write, every engine acks, prepare the next file.
                path = snapshots.publish(params, version, root, prepare_next=False)
                t1 = time.perf_counter()
                mgr.load_weights(path, version)
                t2 = time.perf_counter()
                if mode == "warm":
                    snapshots.prepare_next(path)
                else:  # only the deferred cleanup (unmapping, deleting pruned versions)
                    snapshot_spares.after_publication(root, None)
                version += 1
                snapshot_spares.drain()  # the training step between publications
                t3 = time.perf_counter()
                np.copyto(copy_dst, copy_src)  # the baseline, under the same load
                t4 = time.perf_counter()
                if i >= warmup:
                    copy_all.append(t4 - t3)
                    write_s.append(t1 - t0)
                    load_s.append(t2 - t1)
                    total_s.append(t2 - t0)
    finally:
        mgr.close()
        snapshot_spares.discard(root)
        shutil.rmtree(root, ignore_errors=True)
    out = _summary(num_bytes, len(_leaves(params)), copy_all, series)
    out["ratio"] = out["warm"]["ratio"]
    out["loadavg_1min"] = os.getloadavg()[0]  # other processes on the machine skew both sides
    out["cpus"] = os.cpu_count()
    return out


def _summary(num_bytes: int, leaves: int, copy_all: list, series: dict) -> dict[str, Any]:
    """Medians and bandwidths of each series, against the memory copy's."""
    copy_s = statistics.median(copy_all)
    out: dict[str, Any] = {
        "bytes": num_bytes,
        "leaves": leaves,
        "repeats_per_series": len(series["warm"][2]),
        "memcpy_s": copy_s,
        "memcpy_gbps": num_bytes / copy_s / 1e9,
    }
    for mode, (write_s, load_s, total_s) in series.items():
        write, load, total = (statistics.median(x) for x in (write_s, load_s, total_s))
        out[mode] = {
            "write_s": write,
            "load_ack_s": load,
            "publish_s": total,
            "publish_s_all": total_s,
            "write_gbps": num_bytes / write / 1e9,
            "load_ack_gbps": num_bytes / load / 1e9,
            "publish_gbps": num_bytes / total / 1e9,
            "ratio": copy_s / total,
        }
    return out


def _leaves(tree: Any) -> list:
    import jax

    return jax.tree_util.tree_leaves(tree)
