"""Throughput arithmetic shared by the GPU check's parts: timing, model FLOPs, peak FLOP/s."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

# Peak dense bf16 FLOP/s per device kind (vendor figures, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "B200": 2250e12, "A100": 312e12}


def median_time(call, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call (which compiles)."""
    call()  # warm-up: compile
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def model_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6·N (matmul params) + 12·L·T·d_attn (attention scores)."""
    attn = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_layer = cfg.hidden_size * (2 * attn + 2 * kv) + 3 * cfg.hidden_size * cfg.intermediate_size
    matmul = cfg.num_hidden_layers * per_layer + cfg.vocab_size * cfg.hidden_size
    return 6.0 * matmul + 12.0 * cfg.num_hidden_layers * seq_len * attn


def device_peak_flops(device: Any) -> float | None:
    kind = str(getattr(device, "device_kind", ""))
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in kind.upper()), None)
