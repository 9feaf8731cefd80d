"""Qwen3-MoE (e.g. Qwen3-30B-A3B) in Flax NNX; load and save through `models.auto`."""

from thundersync_jax.models.qwen3_moe._config import Qwen3MoeConfig
from thundersync_jax.models.qwen3_moe._hf_io import (
    attention_entries,
    decoder_table,
    moe_entries,
    swiglu_entries,
    tensor_table,
)
from thundersync_jax.models.qwen3_moe._modules import Attention, Qwen3Moe, init_cache

__all__ = [
    "Attention",
    "Qwen3Moe",
    "Qwen3MoeConfig",
    "attention_entries",
    "decoder_table",
    "init_cache",
    "moe_entries",
    "swiglu_entries",
    "tensor_table",
]
