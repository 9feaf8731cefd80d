"""Publication latency against a plain memory copy of the same bytes (experiments/bench_publish.py).

End-to-end publication = `snapshots.publish` (flatten, Orbax write, fsync, rename) + the engine's
`load_weights` (manifest and structure checks, Orbax read, device_put) + its acknowledgement
over the engine protocol, measured on a real engine process. The baseline is `np.copyto` of one
buffer holding all parameter bytes into a preallocated buffer: the fastest the bytes could move.
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
from thundersync_jax.rollout import snapshots


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


def _median_time(fn, repeats: int, warmup: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def memcpy_seconds(num_bytes: int, repeats: int, warmup: int) -> float:
    """Median time of one np.copyto of `num_bytes` into a preallocated, touched buffer."""
    src = np.random.default_rng(0).integers(0, 255, num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst.fill(0)
    return _median_time(lambda: np.copyto(dst, src), repeats, warmup)[0]


def measure_publication(
    target_mib: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    base: str = snapshots.DEFAULT_BASE,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Publishes a ~target_mib model to one real engine `warmup + repeats` times.

    Returns a dict with the byte count, median seconds of the memory copy, of the snapshot
    write, of load + acknowledgement, and end to end, the bandwidths, and
    `ratio` = end-to-end bandwidth / memory-copy bandwidth.
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
    write_s, load_s, total_s = [], [], []
    mgr = EngineManager(server_args, num_engines=1, env=env).start()
    try:
        for version in range(warmup + repeats):
            t0 = time.perf_counter()
            path = snapshots.publish(params, version, root)
            t1 = time.perf_counter()
            mgr.load_weights(path, version)
            t2 = time.perf_counter()
            if version >= warmup:
                write_s.append(t1 - t0)
                load_s.append(t2 - t1)
                total_s.append(t2 - t0)
    finally:
        mgr.close()
        shutil.rmtree(root, ignore_errors=True)
    copy_s = memcpy_seconds(num_bytes, repeats, warmup)
    total = statistics.median(total_s)
    return {
        "bytes": num_bytes,
        "leaves": len(_leaves(params)),
        "repeats": repeats,
        "memcpy_s": copy_s,
        "write_s": statistics.median(write_s),
        "load_ack_s": statistics.median(load_s),
        "publish_s": total,
        "publish_s_all": total_s,
        "memcpy_gbps": num_bytes / copy_s / 1e9,
        "publish_gbps": num_bytes / total / 1e9,
        "ratio": copy_s / total,
        "loadavg_1min": os.getloadavg()[0],  # other processes on the machine skew both sides
        "cpus": os.cpu_count(),
    }


def _leaves(tree: Any) -> list:
    import jax

    return jax.tree_util.tree_leaves(tree)
