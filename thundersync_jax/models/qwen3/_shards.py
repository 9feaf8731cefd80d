"""HF safetensors read shard by shard straight into `NamedSharding`s (never one whole model).

A safetensors file is an 8-byte header length, a JSON header (name -> dtype, shape, byte
offsets) and the raw little-endian tensors. Mapping the file (`np.memmap`) makes every tensor a
lazy view, so each device's block is read from disk on its own: `jax.make_array_from_callback`
asks for one index per addressable shard, the block is sliced out of the view (in HF layout,
then transposed to ours), cast to the parameter dtype and handed to that device. Peak host
memory is one shard, and the model never sits whole on any device. The header is parsed here
rather than through `safetensors.safe_open(framework="np")`, which cannot represent bfloat16.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from thundersync_jax.models.qwen3 import _hf_io
from thundersync_jax.models.qwen3._config import Qwen3Config
from thundersync_jax.models.qwen3._modules import Qwen3

# safetensors dtype codes -> numpy dtypes (bfloat16 through ml_dtypes, as jnp.bfloat16 is).
_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _checkpoint_files(path: str) -> list[str]:
    index_path = os.path.join(path, _hf_io.INDEX_FILE)
    if os.path.exists(index_path):
        with open(index_path) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    if os.path.exists(os.path.join(path, _hf_io.SINGLE_FILE)):
        return [_hf_io.SINGLE_FILE]
    found = sorted(os.listdir(path)) if os.path.isdir(path) else "not a directory"
    raise FileNotFoundError(
        f"{path} has neither {_hf_io.SINGLE_FILE} nor {_hf_io.INDEX_FILE} (found: {found})"
    )


def _file_views(file_path: str) -> dict[str, np.ndarray]:
    """name -> lazy read-only view of every tensor of one safetensors file."""
    with open(file_path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    raw = np.memmap(file_path, dtype=np.uint8, mode="r")
    base = 8 + header_len
    views = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(
                f"{file_path}: tensor {name} has dtype {info['dtype']}; readable: {sorted(_DTYPES)}"
            )
        start, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        views[name] = raw[base + start : base + end].view(dtype).reshape(info["shape"])
    return views


def tensor_views(path: str) -> dict[str, np.ndarray]:
    """name -> lazy view of every tensor in an HF checkpoint directory (single or sharded)."""
    views: dict[str, np.ndarray] = {}
    for name in _checkpoint_files(path):
        views.update(_file_views(os.path.join(path, name)))
    return views


def _block(t: _hf_io._Tensor, view: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
    """Our-layout block `index` of tensor `t`, read from its HF-layout view `view`."""
    if t.n_in is None:
        return np.asarray(view.reshape(t.ours_shape)[index])
    ins, outs = t.ours_shape[: t.n_in], t.ours_shape[t.n_in :]
    # HF [prod(out), prod(in)] is, without copying, [*out, *in]; slice there, then transpose.
    hf_view = view.reshape(outs + ins)
    block = hf_view[index[t.n_in :] + index[: t.n_in]]
    n_out = len(outs)
    return np.asarray(block.transpose(tuple(range(n_out, block.ndim)) + tuple(range(n_out))))


def _check_tensor_set(cfg: Qwen3Config, views: dict[str, np.ndarray]) -> None:
    """KeyError/ValueError naming missing, unexpected or mis-shaped tensors (before any read)."""
    table = _hf_io.tensor_table(cfg)
    _hf_io.check_tensor_names(cfg, table, views)
    for t in table:
        if tuple(views[t.hf_name].shape) != t.hf_shape:
            raise ValueError(
                f"tensor {t.hf_name} has shape {tuple(views[t.hf_name].shape)}, "
                f"expected {t.hf_shape}"
            )


def load_sharded_params(path: str, cfg: Qwen3Config, shardings: Any, param_dtype: jnp.dtype) -> Any:
    """The checkpoint's params as an `nnx.State`, each leaf placed on its sharding on arrival.

    Args:
      path: HF directory (config.json + model.safetensors or a sharded index).
      cfg: its architecture (`read_config(path)`).
      shardings: NamedSharding pytree shaped like the model's `nnx.Param` state
        (`sharding.param_shardings` of the abstract params).
      param_dtype: storage dtype; each block is cast on the host before it moves.
    """
    views = tensor_views(path)
    _check_tensor_set(cfg, views)
    abstract = nnx.eval_shape(lambda: Qwen3(cfg, param_dtype=param_dtype, rngs=nnx.Rngs(0)))
    _, state = nnx.split(abstract, nnx.Param)
    values = nnx.to_pure_dict(state)
    placements = nnx.to_pure_dict(shardings)
    dtype = np.dtype(param_dtype)
    for t in _hf_io.tensor_table(cfg):
        view, target = views[t.hf_name], _hf_io._get(placements, t.path)
        array = jax.make_array_from_callback(
            t.ours_shape,
            target,
            lambda index, t=t, view=view: _block(t, view, index).astype(dtype),
            dtype=dtype,
        )
        _hf_io._set(values, t.path, array)
    nnx.replace_by_pure_dict(state, values)
    return state
