"""HF safetensors checkpoints <-> the NNX Qwen3: one table of tensor names, layouts and shapes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from thundersync_jax.models.qwen3._config import Qwen3Config
from thundersync_jax.models.qwen3._modules import Qwen3

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Buffers some exporters write that carry no parameters (recomputed from the config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One HF tensor and where it lives in the NNX model.

    n_in: for projections, how many leading axes of our kernel are input axes; HF stores a
    Linear as [prod(out), prod(in)], we store [*in, *out]. None: same layout, maybe reshaped.
    """

    hf_name: str
    path: tuple[str | int, ...]
    ours_shape: tuple[int, ...]
    n_in: int | None = None

    @property
    def hf_shape(self) -> tuple[int, ...]:
        if self.n_in is None:
            if self.path[-1] == "bias":
                return (math.prod(self.ours_shape),)
            return self.ours_shape
        ins, outs = self.ours_shape[: self.n_in], self.ours_shape[self.n_in :]
        return (math.prod(outs), math.prod(ins))

    def to_ours(self, hf: np.ndarray) -> np.ndarray:
        if self.n_in is None:
            return hf.reshape(self.ours_shape)
        return hf.T.reshape(self.ours_shape)

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        if self.n_in is None:
            return np.ascontiguousarray(ours.reshape(self.hf_shape))
        return np.ascontiguousarray(ours.reshape(self.hf_shape[::-1]).T)


def tensor_table(cfg: Qwen3Config) -> list[_Tensor]:
    """Every HF tensor of the checkpoint `cfg` describes, in HF order."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n, k, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    table = [_Tensor("model.embed_tokens.weight", ("embed_tokens", "embedding"), (v, d))]
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", ("layers", i)
        attn = ours + ("self_attn",)
        table += [
            _Tensor(hf + "input_layernorm.weight", ours + ("input_layernorm", "scale"), (d,)),
            _Tensor(hf + "self_attn.q_proj.weight", attn + ("q_proj", "kernel"), (d, n, h), 1),
            _Tensor(hf + "self_attn.k_proj.weight", attn + ("k_proj", "kernel"), (d, k, h), 1),
            _Tensor(hf + "self_attn.v_proj.weight", attn + ("v_proj", "kernel"), (d, k, h), 1),
            _Tensor(hf + "self_attn.o_proj.weight", attn + ("o_proj", "kernel"), (n, h, d), 2),
        ]
        if cfg.qkv_bias:
            table += [
                _Tensor(hf + "self_attn.q_proj.bias", attn + ("q_proj", "bias"), (n, h)),
                _Tensor(hf + "self_attn.k_proj.bias", attn + ("k_proj", "bias"), (k, h)),
                _Tensor(hf + "self_attn.v_proj.bias", attn + ("v_proj", "bias"), (k, h)),
            ]
        if cfg.o_bias:
            table.append(_Tensor(hf + "self_attn.o_proj.bias", attn + ("o_proj", "bias"), (d,)))
        if cfg.qk_norm:
            table += [
                _Tensor(hf + "self_attn.q_norm.weight", attn + ("q_norm", "scale"), (h,)),
                _Tensor(hf + "self_attn.k_norm.weight", attn + ("k_norm", "scale"), (h,)),
            ]
        mlp = ours + ("mlp",)
        table += [
            _Tensor(hf + "mlp.gate_proj.weight", mlp + ("gate_proj", "kernel"), (d, f), 1),
            _Tensor(hf + "mlp.up_proj.weight", mlp + ("up_proj", "kernel"), (d, f), 1),
            _Tensor(hf + "mlp.down_proj.weight", mlp + ("down_proj", "kernel"), (f, d), 1),
            _Tensor(
                hf + "post_attention_layernorm.weight",
                ours + ("post_attention_layernorm", "scale"),
                (d,),
            ),
        ]
    table.append(_Tensor("model.norm.weight", ("norm", "scale"), (d,)))
    if not cfg.tie_word_embeddings:
        table.append(_Tensor("lm_head.weight", ("lm_head", "kernel"), (d, v), 1))
    return table


def _to_numpy(x: Any) -> np.ndarray:
    """np / jax arrays as they are; torch tensors (bf16 included) via float32 if needed."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            return x.float().numpy().astype(jnp.bfloat16)
        return x.numpy()
    return np.asarray(x)


def _get(tree: Mapping, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def to_hf_state_dict(model_or_params: Any, cfg: Qwen3Config) -> dict[str, np.ndarray]:
    """HF tensor name -> numpy array in torch layout (Linear weights [out, in]), param dtype kept.

    Args:
      model_or_params: a `Qwen3` module, its `nnx.State` of params (`nnx.split(model,
        nnx.Param)[1]`), or the same as a pure nested dict (`nnx.to_pure_dict`).
      cfg: the model's config (decides the tensor set: biases, q/k norms, tied head).
    """
    if isinstance(model_or_params, nnx.Module):
        model_or_params = nnx.state(model_or_params, nnx.Param)
    if isinstance(model_or_params, nnx.State):
        model_or_params = nnx.to_pure_dict(model_or_params)
    out = {}
    for t in tensor_table(cfg):
        try:
            value = np.asarray(_get(model_or_params, t.path))
        except (KeyError, IndexError, TypeError) as e:
            raise KeyError(
                f"parameter {'.'.join(map(str, t.path))} (for {t.hf_name}) is missing"
            ) from e
        if value.shape != t.ours_shape:
            raise ValueError(
                f"parameter {'.'.join(map(str, t.path))} has shape {value.shape}, "
                f"expected {t.ours_shape} for {t.hf_name}"
            )
        out[t.hf_name] = t.to_hf(value)
    return out


def from_hf_state_dict(
    cfg: Qwen3Config,
    state_dict: Mapping[str, Any],
    dtype: jnp.dtype = jnp.float32,
    *,
    param_dtype: jnp.dtype | None = None,
) -> Qwen3:
    """Builds a `Qwen3` from HF tensors (numpy, jax or torch arrays, torch layout).

    Args:
      cfg: architecture the tensors belong to.
      state_dict: HF name -> array; exactly the tensors of `tensor_table(cfg)`.
      dtype: compute dtype of the model, and the parameter dtype unless `param_dtype` is given.
      param_dtype: storage dtype of the parameters.

    Raises:
      KeyError naming missing tensors; ValueError naming unexpected or mis-shaped ones.
    """
    param_dtype = dtype if param_dtype is None else param_dtype
    table = tensor_table(cfg)
    check_tensor_names(cfg, table, state_dict, _to_numpy)

    abstract = nnx.eval_shape(
        lambda: Qwen3(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    )
    graphdef, state = nnx.split(abstract)
    values = nnx.to_pure_dict(state)
    for t in table:
        hf = _to_numpy(state_dict[t.hf_name])
        if hf.shape != t.hf_shape:
            raise ValueError(f"tensor {t.hf_name} has shape {hf.shape}, expected {t.hf_shape}")
        _set(values, t.path, jnp.asarray(t.to_ours(hf), dtype=param_dtype))
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of an HF checkpoint directory: model.safetensors or a sharded index."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        found = sorted(os.listdir(path)) if os.path.isdir(path) else "not a directory"
        raise FileNotFoundError(
            f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE} (found: {found})"
        )
    tensors = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="np") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def read_config(path: str) -> Qwen3Config:
    """`Qwen3Config` from `path`/config.json."""
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}")
    with open(config_path) as f:
        return Qwen3Config.from_hf(json.load(f))


def from_pretrained(
    path: str, dtype: jnp.dtype = jnp.float32, *, param_dtype: jnp.dtype | None = None
) -> Qwen3:
    """Loads an HF Qwen3/Qwen2 directory (config.json + single-file or sharded safetensors).

    `dtype` is the compute dtype and, unless `param_dtype` is given, the parameter dtype.
    """
    return from_hf_state_dict(
        read_config(path), read_safetensors(path), dtype, param_dtype=param_dtype
    )


def save_pretrained(model: Qwen3, path: str) -> None:
    """Writes config.json + model.safetensors that transformers' AutoModelForCausalLM loads.

    Tensors keep the parameter dtype; a tied model writes no lm_head.weight.
    """
    os.makedirs(path, exist_ok=True)
    tensors = to_hf_state_dict(model, model.cfg)
    hf_config = model.cfg.to_hf()
    hf_config["torch_dtype"] = str(next(iter(tensors.values())).dtype)
    hf_config["dtype"] = hf_config["torch_dtype"]
    save_file(tensors, os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2)


def check_tensor_names(cfg, table, tensors, to_numpy=np.asarray) -> None:
    """The checkpoint's tensor names against the config's `table`, before any is loaded.

    A tied head is accepted only if it equals the embedding (some exporters write it anyway).
    Raises KeyError naming missing tensors, ValueError naming unexpected ones.
    """
    expected = {t.hf_name for t in table}
    given = {name for name in tensors if not name.endswith(_IGNORED_SUFFIXES)}
    if cfg.tie_word_embeddings and "lm_head.weight" in given:
        head = to_numpy(tensors["lm_head.weight"])
        embed = tensors.get("model.embed_tokens.weight")
        embed = head if embed is None else to_numpy(embed)
        if head.shape != embed.shape or not np.array_equal(head, embed):
            raise ValueError(
                "lm_head.weight differs from model.embed_tokens.weight but the config has "
                "tie_word_embeddings=true; set it to false to load an untied head"
            )
        given.discard("lm_head.weight")
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing:
        raise KeyError(f"checkpoint is missing tensors {missing} (config: {cfg})")
    if unexpected:
        raise ValueError(f"checkpoint has unexpected tensors {unexpected} for config {cfg}")
