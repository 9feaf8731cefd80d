"""Per-chunk fixed cost vs per-token cost of score-gradient chunks (used by bench_chunks).

Streaming cuts a batch's backward work into many small chunks, so a fixed per-call cost
(host padding, pytree flattening, dispatch, the device->host sync) would be paid once per
trajectory or turn. This measures wall time per chunk at several lengths after warm-up and
fits time = fixed + per_token · tokens by least squares on relative residuals (each point
weighted by 1/time): the lengths span 32x, and plain least squares would let the longest
chunk's error swamp the intercept. The process CPU time (all threads) is recorded too: on a
shared machine it is less noisy than wall time. Two overheads every chunk pays are timed
directly: host-side padding, and a jitted identity over the same parameter pytree (pytree
flattening + dispatch + sync), a floor for the fixed cost.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from thundersync_jax.learner import buckets, chunks
from thundersync_jax.models import qwen3


def _median_seconds(call, repeats: int) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of `call` over `repeats` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def fit_cost(lengths: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(fixed, per_token) minimizing Σ ((fixed + per_token·T_i − s_i) / s_i)²."""
    t = np.asarray(lengths, np.float64)
    s = np.asarray(seconds, np.float64)
    design = np.stack([np.ones_like(t), t], axis=1) / s[:, None]
    (fixed, per_token), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    return float(fixed), float(per_token)


def run(
    model_config: Any,
    lengths: Sequence[int] = (32, 64, 128, 256, 512, 1024),
    repeats: int = 20,
    warmup: int = 3,
    reference_length: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Times one-row score-gradient chunks of each length; returns a JSON-ready dict.

    Each length is its own bucket, so no padding inflates the per-token cost. Alongside the
    full call it times the overheads a chunk pays regardless of length: host-side padding, and
    dispatching a jitted identity over the same parameter pytree (tree flattening + dispatch +
    sync).
    """
    cfg = qwen3.Qwen3Config.from_config_dict(model_config)
    model = nnx.jit(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)))()
    graphdef, params = nnx.split(model, nnx.Param)
    fn = chunks.make_score_grad_fn(graphdef, seq_buckets=tuple(lengths))
    rng = np.random.default_rng(seed)

    rows = []
    for length in lengths:
        tokens = rng.integers(0, cfg.vocab_size, (1, length)).astype(np.int32)
        mask = np.ones((1, length), np.float32)
        mask[0, 0] = 0

        def call(tokens=tokens, mask=mask):
            h, _ = fn(params, tokens, mask)
            jax.block_until_ready(h)

        for _ in range(warmup):
            call()
        wall, cpu = _median_seconds(call, repeats)
        rows.append({"tokens": length, "median_s": wall, "median_cpu_s": cpu})

    lengths = [r["tokens"] for r in rows]
    fits = {}
    for clock in ("median_s", "median_cpu_s"):
        fixed, per_token = fit_cost(lengths, [r[clock] for r in rows])
        measured = {r["tokens"]: r[clock] for r in rows}
        reference = measured.get(reference_length, fixed + per_token * reference_length)
        fits[clock] = {
            "fixed_s": fixed,
            "per_token_s": per_token,
            "fixed_fraction_of_reference": fixed / reference,
        }
        for r in rows:
            t = r["tokens"]
            r[clock.replace("median", "fit")] = fixed + per_token * t

    identity = jax.jit(lambda p: p)
    jax.block_until_ready(identity(params))
    dispatch, _ = _median_seconds(lambda: jax.block_until_ready(identity(params)), repeats)
    tokens = rng.integers(0, cfg.vocab_size, (1, reference_length))
    mask = np.ones((1, reference_length), np.float32)
    mask[0, 0] = 0
    padding, _ = _median_seconds(
        lambda: buckets.pad_chunk(tokens, mask, None, tuple(lengths)), repeats
    )
    return {
        "model": model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config),
        "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
        "num_param_leaves": len(jax.tree.leaves(params)),
        "backend": jax.default_backend(),
        "repeats": repeats,
        "rows": rows,
        "fit_wall": fits["median_s"],
        "fit_cpu": fits["median_cpu_s"],
        "reference_tokens": reference_length,
        "identity_dispatch_s": dispatch,
        "host_padding_s": padding,
        "compiles": fn.compiles,
    }


def markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table plus the fitted line."""
    lines = [
        "| tokens | wall ms (median) | wall fit ms | CPU ms (median) | CPU fit ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tokens']} | {1e3 * r['median_s']:.2f} | {1e3 * r['fit_s']:.2f} "
            f"| {1e3 * r['median_cpu_s']:.2f} | {1e3 * r['fit_cpu_s']:.2f} |"
        )
    ref = result["reference_tokens"]
    lines.append("")
    for name in ("wall", "cpu"):
        fit = result[f"fit_{name}"]
        lines.append(
            f"{name}: fixed = {1e3 * fit['fixed_s']:.3f} ms,"
            f" per token = {1e6 * fit['per_token_s']:.2f} us;"
            f" fixed / {ref}-token chunk = {100 * fit['fixed_fraction_of_reference']:.1f}%"
        )
    by_tokens = {r["tokens"]: r["median_s"] for r in result["rows"]}
    if ref in by_tokens:
        smallest = min(by_tokens)
        lines.append(
            f"bounds on the fixed cost (wall): <= {smallest}-token chunk / {ref}-token chunk ="
            f" {100 * by_tokens[smallest] / by_tokens[ref]:.1f}%; >= dispatch floor ="
            f" {100 * result['identity_dispatch_s'] / by_tokens[ref]:.1f}%"
        )
    lines += [
        f"jitted identity over the {result['num_param_leaves']}-leaf param tree:"
        f" {1e3 * result['identity_dispatch_s']:.3f} ms; host padding:"
        f" {1e3 * result['host_padding_s']:.3f} ms",
    ]
    return "\n".join(lines)
