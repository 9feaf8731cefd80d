"""Dense Qwen3 (and Qwen2/Qwen2.5) in Flax NNX, with HF safetensors I/O and a KV cache.

from thundersync_jax.models import qwen3
model = qwen3.from_pretrained(path, dtype=jnp.float32)
logits = model(input_ids)                      # [B, T] int32 -> [B, T, V] float32
qwen3.save_pretrained(model, path)             # loadable by transformers
"""

from thundersync_jax.models.qwen3._cache import (
    KVCache,
    cache_positions,
    init_cache,
    reset_rows,
    write_layer,
    write_slots,
)
from thundersync_jax.models.qwen3._config import Qwen3Config
from thundersync_jax.models.qwen3._hf_io import (
    from_hf_state_dict,
    from_pretrained,
    read_config,
    read_safetensors,
    save_pretrained,
    tensor_table,
    to_hf_state_dict,
)
from thundersync_jax.models.qwen3._modules import (
    MLP,
    Attention,
    DecoderLayer,
    Embed,
    Linear,
    Qwen3,
    RMSNorm,
    apply_rope,
)
from thundersync_jax.models.qwen3._random import random_state_dict
from thundersync_jax.models.qwen3._segment import SegmentOutput, segment_hidden_states
from thundersync_jax.models.qwen3._shards import load_sharded_params, tensor_views

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "Embed",
    "KVCache",
    "Linear",
    "Qwen3",
    "Qwen3Config",
    "RMSNorm",
    "SegmentOutput",
    "apply_rope",
    "from_hf_state_dict",
    "from_pretrained",
    "random_state_dict",
    "init_cache",
    "load_sharded_params",
    "cache_positions",
    "write_layer",
    "write_slots",
    "read_config",
    "read_safetensors",
    "reset_rows",
    "save_pretrained",
    "segment_hidden_states",
    "tensor_table",
    "tensor_views",
    "to_hf_state_dict",
]
