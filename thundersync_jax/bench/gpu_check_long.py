"""The GPU check's long-sequence learner figures (part "long" of `bench.gpu_check`).

Score-gradient tokens/s and MFU of one row at long lengths (GPU: 8,192 and 32,768 tokens in
bf16 on the Qwen3-0.6B shape, per-layer remat), with the attention `auto` picks (cuDNN flash
on a GPU) beside the plain-JAX blockwise path. On CPU (`--cpu`) at tiny sizes, where `auto`
is the blockwise path too; the JSON names the implementation each row asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LENGTHS = {"gpu": (8192, 32768), "cpu": (256, 512)}
IMPLS = ("auto", "blockwise")


def _one(size: Any, cfg: Any, impl: str, length: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.bench import flops
    from thundersync_jax.learner import chunks
    from thundersync_jax.models import qwen3

    dtype = jnp.dtype(size.dtype)
    block = 512 if length >= 4096 else 128
    model = qwen3.Qwen3(
        cfg, dtype=dtype, param_dtype=dtype, attention_impl=impl, attention_block=block,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    graphdef, params = nnx.split(model, nnx.Param)
    fn = chunks.make_score_grad_fn(graphdef, (length,), remat=True)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, length), np.int32)
    mask = np.ones_like(tokens, np.float32)
    mask[:, 0] = 0

    def call():
        jax.block_until_ready(fn(params, tokens, mask)[0])

    seconds = flops.median_time(call, size.learner_repeats)
    tokens_per_s = length / seconds
    # Causal attention does half the [T, T] work the FLOP count assumes: count it as such.
    achieved = flops.model_flops_per_token(cfg, length // 2) * tokens_per_s
    peak = flops.device_peak_flops(jax.devices()[0])
    return {
        "impl": impl,
        "tokens": length,
        "seconds_per_chunk": seconds,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_s": achieved / 1e12,
        "mfu": None if peak is None else achieved / peak,
    }


def long_part(size: Any, cpu: bool) -> list[dict[str, Any]]:
    """One row per (length, attention implementation)."""
    from thundersync_jax.models import qwen3

    cfg = qwen3.Qwen3Config(**size.model)
    lengths = LENGTHS["cpu" if cpu else "gpu"]
    return [_one(size, cfg, impl, t) for t in lengths for impl in IMPLS]
