"""The memory planner's estimate of one chunk's forward + backward working set per device.

Linear in the chunk's tokens T on the long-sequence paths (`models.attention` blockwise or
cuDNN flash attention, `losses.tiled_token_terms`); the reference paths (`attention_impl=
"naive"`, `logits_tile=0`) add the [T, T] scores and the [T, V] logits they materialize.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from thundersync_jax.models import auto

_F32 = 4


def layer_dims(m: Any) -> tuple[int, int, int, int, list[float]]:
    """(query heads, key/value heads, q/k head width, value head width, per-layer token width
    of the feed-forward activations). MLA expands keys and values for every head; a MoE
    layer's width is its active one (top-k experts + shared experts), plus its k gathered
    copies of the token and of the expert outputs (2·k·D)."""
    cfg = auto.config_from_section(m)
    if cfg.model_type == "glm4_moe_lite":
        n = kv = cfg.num_attention_heads
        qk, v = cfg.qk_head_dim, cfg.v_head_dim
    else:
        n, kv, qk = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        v = qk
    widths = []
    for sparse in auto.layer_pattern(cfg):
        if not sparse:
            widths.append(4.0 * cfg.intermediate_size)
            continue
        spec = cfg.moe
        widths.append(
            4.0 * (spec.top_k * spec.expert_size + spec.shared_size)
            + 2.0 * spec.top_k * cfg.hidden_size
        )
    return n, kv, qk, v, widths


def _per_layer(m: Any, bt: int, tp: int) -> list[float]:
    """Each layer's tensors kept for its backward, in the compute dtype.

    The residual and two norm outputs (3·D), q/k/v before and after norm+RoPE
    (3·(N+2K)·H / tp), the attention output (N·Hv / tp), the feed-forward activations
    (`layer_dims`: a dense MLP's gate, up, silu and product 4·F, a MoE layer's active ones).
    """
    a = jnp.dtype(m.dtype).itemsize
    n, k, h, v, widths = layer_dims(m)
    d = m.hidden_size
    return [bt * (3 * d + (3 * (n + 2 * k) * h + n * v + w) / tp) * a for w in widths]


def attention_bytes(m: Any, rows: int, tokens: int, tp: int) -> float:
    """One layer's attention working set beyond q/k/v/out.

    naive: float32 scores and compute-dtype probabilities for N heads over [T, T] (/ tp),
    and the boolean mask. blockwise (and cuDNN flash, the same order): each query's float32
    log-sum-exp and softmax-gradient term, the float32 dq accumulator of the backward, and one
    block pair's scores, probabilities and their gradients (4 float32 tiles).
    """
    a = jnp.dtype(m.dtype).itemsize
    heads, _, _, v, _ = layer_dims(m)
    n = heads / tp
    if m.attention_impl == "naive":
        return rows * tokens * tokens * (n * (_F32 + a) + 1)
    block = min(int(m.attention_block), tokens)
    return rows * tokens * n * (v + 2) * _F32 + rows * n * block * block * 4 * _F32


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
    attention = attention_bytes(m, rows, tokens, tp)
    layers = [layer + attention for layer in _per_layer(m, bt, tp)]
    head = logits_bytes(m, rows, tokens, tp)
    if not remat:
        return int(sum(layers) + head)
    kept = 0 if m.remat_offload else layer_inputs_bytes(m, rows, tokens)
    return int(kept + 2 * max(layers) + head)
