"""Blockwise attention's cost per tile size (used by `experiments.bench_attention`).

The blockwise path holds one [B, K, G, tile, tile] float32 score tile at a time; on a CPU a
large tile falls out of cache, so the best tile depends on the platform and the head layout
(`model.attention_block`). This times the forward and the gradient (queries and keys) of
`models.attention.dot_product_attention(impl="blockwise")` for a model config's head layout
at each (length, largest tile), medians after warm-up, with the tile the length is actually
cut into (`attention.balanced_tile`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.models import attention


def _median_s(call, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _programs(slots, tile: int):
    def loss(q, k):
        out = attention.dot_product_attention(
            q, k, k, q_slots=slots, impl="blockwise", block_q=tile, block_k=tile
        )
        return jnp.sum(out)

    return jax.jit(loss), jax.jit(jax.grad(loss, argnums=(0, 1)))


def run(
    model_config: Any,
    lengths: Sequence[int] = (1023, 1119, 1535),
    tiles: Sequence[int] = (128, 256, 384, 512),
    rows: int = 4,
    repeats: int = 7,
    warmup: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Median seconds of the forward and the gradient per (length, largest tile); causal, `rows`
    sequences, the config's query heads, kv heads and head dim, float32."""
    heads, kv_heads = int(model_config.num_attention_heads), int(model_config.num_key_value_heads)
    head_dim = int(model_config.head_dim)
    rng = np.random.default_rng(seed)
    out = []
    for length in lengths:
        q = jnp.asarray(rng.normal(size=(rows, length, heads, head_dim)), jnp.float32)
        k = jnp.asarray(rng.normal(size=(rows, length, kv_heads, head_dim)), jnp.float32)
        slots = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
        for tile in tiles:
            forward, gradient = _programs(slots, tile)
            out.append({
                "tokens": length,
                "largest_tile": tile,
                "tile": attention.balanced_tile(length, tile),
                "forward_s": _median_s(lambda f=forward, q=q, k=k: f(q, k), repeats, warmup),
                "gradient_s": _median_s(lambda g=gradient, q=q, k=k: g(q, k), repeats, warmup),
            })  # fmt: skip
    return {
        "rows": rows,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "backend": jax.default_backend(),
        "repeats": repeats,
        "results": out,
    }


def markdown(result: dict[str, Any]) -> str:
    """The gradient's median seconds as a table: one row per length, one column per tile."""
    tiles = sorted({r["largest_tile"] for r in result["results"]})
    lines = [
        f"blockwise attention gradient, median s ({result['rows']} rows, {result['heads']} "
        f"query / {result['kv_heads']} kv heads of {result['head_dim']}, {result['backend']})",
        "",
        "| tokens | " + " | ".join(f"tile {t}" for t in tiles) + " |",
        "|---|" + "---|" * len(tiles),
    ]
    for length in sorted({r["tokens"] for r in result["results"]}):
        cells = {r["largest_tile"]: r for r in result["results"] if r["tokens"] == length}
        row = [f"{cells[t]['gradient_s']:.3f} ({cells[t]['tile']})" for t in tiles]
        lines.append(f"| {length} | " + " | ".join(row) + " |")
    return "\n".join(lines)
