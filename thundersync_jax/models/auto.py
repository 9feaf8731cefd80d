"""One entry point for every architecture, dispatching on config.json's `model_type`.

from thundersync_jax.models import auto
model = auto.from_pretrained(path, dtype=jnp.float32)   # qwen3, qwen2, qwen3_moe, glm4_moe_lite
logits = model(input_ids)                               # [B, T] -> [B, T, V] float32
auto.save_pretrained(model, path)                       # loadable by transformers
auto.active_params(cfg)              # weights one token's forward multiplies (MoE: top-k)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from thundersync_jax.models import glm4_moe_lite, hf_table, qwen3, qwen3_moe


@dataclasses.dataclass(frozen=True)
class Family:
    """How to build, cache and (de)serialize one architecture."""

    config_cls: type
    module_cls: type
    table: Callable[[Any], list]
    init_cache: Callable[..., qwen3.KVCache]


def _qwen3_table(cfg) -> list[hf_table.Entry]:
    return [
        hf_table.Entry(t.hf_name, t.path, t.ours_shape, t.n_in) for t in qwen3.tensor_table(cfg)
    ]


FAMILIES: dict[str, Family] = {
    "qwen3": Family(qwen3.Qwen3Config, qwen3.Qwen3, _qwen3_table, qwen3.init_cache),
    "qwen2": Family(qwen3.Qwen3Config, qwen3.Qwen3, _qwen3_table, qwen3.init_cache),
    "qwen3_moe": Family(
        qwen3_moe.Qwen3MoeConfig,
        qwen3_moe.Qwen3Moe,
        qwen3_moe.tensor_table,
        qwen3_moe.init_cache,
    ),
    "glm4_moe_lite": Family(
        glm4_moe_lite.Glm4MoeLiteConfig,
        glm4_moe_lite.Glm4MoeLite,
        glm4_moe_lite.tensor_table,
        glm4_moe_lite.init_cache,
    ),
}


def family(model_type_or_cfg: Any) -> Family:
    """The family of a model_type string or of a config object."""
    if isinstance(model_type_or_cfg, str):
        name = model_type_or_cfg
    else:
        name = getattr(model_type_or_cfg, "model_type", None)
    if name not in FAMILIES:
        raise ValueError(f"model_type={name!r} is not supported; valid: {sorted(FAMILIES)}")
    return FAMILIES[name]


def config_from_hf(hf: Mapping[str, Any]) -> Any:
    """The architecture's config from a parsed config.json."""
    return family(hf.get("model_type", "qwen3")).config_cls.from_hf(hf)


def config_from_section(section: Any) -> Any:
    """The architecture's config from a run config's `model` section (its `model_type`)."""
    model_type = section.get("model_type", "qwen3") if hasattr(section, "get") else "qwen3"
    return family(model_type).config_cls.from_config_dict(section)


def read_config(path: str) -> Any:
    """The architecture's config from `path`/config.json."""
    return config_from_hf(hf_table.read_json(path))


def build(
    cfg, *, dtype=jnp.float32, param_dtype=None, remat=False, rngs=None, **options
) -> nnx.Module:
    """A freshly initialized model of `cfg`; `options`: the long-sequence keywords of
    `qwen3.Qwen3` (remat_offload, attention_impl, attention_block, logits_tile)."""
    param_dtype = dtype if param_dtype is None else param_dtype
    rngs = nnx.Rngs(0) if rngs is None else rngs
    module_cls = family(cfg).module_cls
    return module_cls(cfg, dtype=dtype, param_dtype=param_dtype, remat=remat, rngs=rngs, **options)


def tensor_table(cfg) -> list[hf_table.Entry]:
    return family(cfg).table(cfg)


def init_cache(cfg, batch_size: int, max_len: int, dtype=jnp.float32) -> qwen3.KVCache:
    """An empty sampling cache of the architecture (MLA: the compressed one)."""
    return family(cfg).init_cache(cfg, batch_size, max_len, dtype)


def from_hf_state_dict(cfg, tensors: Mapping, dtype=jnp.float32, *, param_dtype=None):
    """A model of `cfg` from HF-named tensors (numpy, torch or jax)."""
    param_dtype = dtype if param_dtype is None else param_dtype
    return hf_table.from_state_dict(
        lambda: build(cfg, dtype=dtype, param_dtype=param_dtype),
        tensor_table(cfg),
        tensors,
        cfg.tie_word_embeddings,
        param_dtype,
    )


def to_hf_state_dict(params: Any, cfg) -> dict:
    """HF name -> numpy array (torch layout) of a model or its params."""
    return hf_table.to_state_dict(params, tensor_table(cfg))


def from_pretrained(path: str, dtype=jnp.float32, *, param_dtype=None) -> nnx.Module:
    """Loads an HF directory (config.json + single-file or sharded safetensors)."""
    cfg = read_config(path)
    return from_hf_state_dict(cfg, qwen3.tensor_views(path), dtype, param_dtype=param_dtype)


def load_sharded_params(path: str, cfg, shardings: Any, param_dtype) -> Any:
    """The checkpoint's params (nnx.State), each block read and placed on its sharding."""
    abstract = nnx.eval_shape(lambda: build(cfg, param_dtype=param_dtype))
    _, state = nnx.split(abstract, nnx.Param)
    return hf_table.load_sharded(
        path, tensor_table(cfg), state, shardings, cfg.tie_word_embeddings, param_dtype
    )


def save_pretrained(model: nnx.Module, path: str) -> None:
    """config.json + model.safetensors that transformers' AutoModelForCausalLM loads."""
    hf_table.save(path, to_hf_state_dict(model, model.cfg), model.cfg.to_hf())


def layer_pattern(cfg) -> tuple[bool, ...]:
    """Per decoder layer: True where its feed-forward block is a sparse MoE block."""
    return tuple(getattr(cfg, "sparse_layers", (False,) * cfg.num_hidden_layers))


def with_layer_pattern(cfg, pattern: tuple[bool, ...]):
    """`cfg` with len(pattern) layers, layer i sparse iff pattern[i] (a dense config: all
    False). Lets a planner trace one layer of each kind instead of the whole depth."""
    n = len(pattern)
    if cfg.model_type == "qwen3_moe":
        dense = tuple(i for i, s in enumerate(pattern) if not s)
        return dataclasses.replace(
            cfg, num_hidden_layers=n, mlp_only_layers=dense, decoder_sparse_step=1
        )
    if cfg.model_type == "glm4_moe_lite":
        types = tuple("sparse" if s else "dense" for s in pattern)
        return dataclasses.replace(cfg, num_hidden_layers=n, mlp_layer_types=types)
    if any(pattern):
        raise ValueError(f"{cfg.model_type} has no sparse layers")
    return dataclasses.replace(cfg, num_hidden_layers=n)


@functools.cache  # configs are frozen (hashable); the predictor asks once per chunk shape
def active_params(cfg) -> int:
    """Weights of the matrix products one token's forward runs through: its compute is
    ~2 FLOPs per active weight forward, ~6 forward + backward (plus attention over T).

    Counts every kernel (attention or MLA projections, dense-layer and shared-expert MLPs,
    routers, the LM head: the embedding table when tied) and, of each sparse layer's routed
    experts, the `top_k` of `num_experts` a token is sent to. Leaves out the embedding lookup
    (no multiply), norm scales, biases and the router's correction bias (elementwise, O(D)).
    Memory, optimizer and publication bytes touch every expert: price those by the total.
    """
    pattern = layer_pattern(cfg)
    kinds = tuple(sorted(set(pattern)))  # one layer of each kind stands for all of that kind
    abstract = nnx.eval_shape(lambda: build(with_layer_pattern(cfg, kinds)))
    params = nnx.to_pure_dict(nnx.split(abstract, nnx.Param)[1])  # nested dicts of shapes
    count = 0
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(params):
        path = [str(k.key) for k in keypath]
        size = leaf.size
        if path[-2:] == ["embed_tokens", "embedding"]:
            size = size if cfg.tie_word_embeddings else 0  # tied: it is also the LM head
        elif len(path) > 1 and path[-2] == "experts":  # routed experts stacked [E, ...]
            size = size // cfg.moe.num_experts * cfg.moe.top_k
        elif path[-1] != "kernel":
            size = 0
        if path[0] == "layers":
            size *= pattern.count(kinds[int(path[1])])
        count += size
    return count
