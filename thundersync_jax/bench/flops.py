"""Throughput arithmetic shared by the GPU check's parts: timing, model FLOPs, peak FLOP/s."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from thundersync_jax.models import auto

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


def attention_width(cfg: Any) -> int:
    """Multiply-adds per (query, key) pair of one layer over all heads: QK^T and AV (MLA:
    d_qk = nope + rope part, d_v its own)."""
    qk = getattr(cfg, "qk_head_dim", None) or cfg.head_dim
    v = getattr(cfg, "v_head_dim", None) or cfg.head_dim
    return cfg.num_attention_heads * (qk + v)


def model_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6·N_active + 6·L·T·n·(d_qk + d_v) (attention over T keys).

    N_active (`auto.active_params`) are the weights a token multiplies by: a MoE token runs
    through its top-k routed experts, not all of them; the embedding lookup is not counted.
    """
    attention = 6.0 * cfg.num_hidden_layers * seq_len * attention_width(cfg)
    return 6.0 * auto.active_params(cfg) + attention


def device_peak_flops(device: Any) -> float | None:
    kind = str(getattr(device, "device_kind", ""))
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in kind.upper()), None)
