"""The memory planner's estimate of one chunk's forward + backward working set per device.

Linear in the chunk's tokens T on the long-sequence paths (`models.attention` blockwise or
cuDNN flash attention, `losses.tiled_token_terms`); the reference paths (`attention_impl=
"naive"`, `logits_tile=0`) add the [T, T] scores and the [T, V] logits they materialize.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

_F32 = 4


def _per_layer(m: Any, bt: int, tp: int) -> float:
    """One layer's tensors kept for its backward, in the compute dtype.

    The residual and two norm outputs (3·D), q/k/v before and after norm+RoPE
    (3·(N+2K)·H / tp), the attention output (N·H / tp), the MLP's gate, up, silu and product
    (4·F / tp).
    """
    a = jnp.dtype(m.dtype).itemsize
    n, k, h = m.num_attention_heads, m.num_key_value_heads, m.head_dim
    d, f = m.hidden_size, m.intermediate_size
    return bt * (3 * d + (3 * (n + 2 * k) * h + n * h + 4 * f) / tp) * a


def attention_bytes(m: Any, rows: int, tokens: int, tp: int) -> float:
    """One layer's attention working set beyond q/k/v/out.

    naive: float32 scores and compute-dtype probabilities for N heads over [T, T] (/ tp),
    and the boolean mask. blockwise (and cuDNN flash, the same order): each query's float32
    log-sum-exp and softmax-gradient term, the float32 dq accumulator of the backward, and one
    block pair's scores, probabilities and their gradients (4 float32 tiles).
    """
    a = jnp.dtype(m.dtype).itemsize
    n = m.num_attention_heads / tp
    if m.attention_impl == "naive":
        return rows * tokens * tokens * (n * (_F32 + a) + 1)
    block = min(int(m.attention_block), tokens)
    return rows * tokens * n * (m.head_dim + 2) * _F32 + rows * n * block * block * 4 * _F32


def logits_bytes(m: Any, rows: int, tokens: int, tp: int) -> float:
    """float32 logits, log-softmax and their gradient of one token tile (all T at tile 0)."""
    tile = tokens if not int(m.logits_tile) else min(int(m.logits_tile), tokens)
    return 3 * rows * tile * m.vocab_size * _F32 / tp


def layer_inputs_bytes(m: Any, rows: int, tokens: int) -> int:
    """What remat keeps between the forward and the backward: each layer's input [T, D]."""
    return int(m.num_hidden_layers * rows * tokens * m.hidden_size * jnp.dtype(m.dtype).itemsize)


def activation_bytes(model_config: Any, rows: int, tokens: int, tp: int, remat: bool) -> int:
    """Estimated device working set of one chunk's forward + backward.

    Without remat every layer's tensors are kept. With remat only each layer's input is kept
    (in host memory with `model.remat_offload`: then not counted here, see
    `layer_inputs_bytes`), and one layer's working set is rebuilt at a time (counted twice:
    values and gradients). The LM head's tile is added once.
    """
    m = model_config
    bt = rows * tokens
    layer = _per_layer(m, bt, tp) + attention_bytes(m, rows, tokens, tp)
    head = logits_bytes(m, rows, tokens, tp)
    if not remat:
        return int(m.num_hidden_layers * layer + head)
    kept = 0 if m.remat_offload else layer_inputs_bytes(m, rows, tokens)
    return int(kept + 2 * layer + head)
