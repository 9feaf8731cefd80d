"""HF safetensors <-> NNX params through one table per architecture, stacked experts included.

An `Entry` names one HF tensor and where it lives in the NNX param tree. HF stores a Linear as
[prod(out), prod(in)]; we store [*in, *out] (`n_in` leading input axes). HF checkpoints of MoE
models hold one tensor per expert (`mlp.experts.7.gate_proj.weight`); we stack the experts of
a layer into one [E, ...] param, so such an entry also carries `expert`, its row in that stack.
Loading shard by shard (`load_sharded`) reads each device's block straight from the mapped
files, expert rows included, so no tensor is ever whole in host memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from thundersync_jax.models.qwen3 import tensor_views

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One HF tensor: its name, our param path, its shape in our layout, the input axes.

    Attributes:
      hf_name: the checkpoint's tensor name.
      path: the param's path in `nnx.to_pure_dict(params)`.
      shape: this tensor's shape in our layout (one expert's slice for stacked experts).
      n_in: leading input axes of a projection kernel (HF has them last, flattened); None for
        tensors stored as they are (possibly reshaped).
      expert: row of the stacked [E, ...] param this tensor is (None: the whole param).
    """

    hf_name: str
    path: tuple[str | int, ...]
    shape: tuple[int, ...]
    n_in: int | None = None
    expert: int | None = None

    @property
    def hf_shape(self) -> tuple[int, ...]:
        if self.n_in is None:
            return (math.prod(self.shape),) if self.path[-1] == "bias" else self.shape
        ins, outs = self.shape[: self.n_in], self.shape[self.n_in :]
        return (math.prod(outs), math.prod(ins))

    def to_ours(self, hf: np.ndarray) -> np.ndarray:
        return hf.reshape(self.shape) if self.n_in is None else hf.T.reshape(self.shape)

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        if self.n_in is None:
            return np.ascontiguousarray(ours.reshape(self.hf_shape))
        return np.ascontiguousarray(ours.reshape(self.hf_shape[::-1]).T)

    def block(self, view: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
        """Our-layout block `index` of this tensor, sliced from its HF-layout `view`."""
        if self.n_in is None:
            return np.asarray(view.reshape(self.shape)[index])
        ins, outs = self.shape[: self.n_in], self.shape[self.n_in :]
        hf = view.reshape(outs + ins)  # [*out, *in]: HF's layout without a copy
        block = hf[index[self.n_in :] + index[: self.n_in]]
        n_out = len(outs)
        return np.asarray(block.transpose(tuple(range(n_out, block.ndim)) + tuple(range(n_out))))


def experts(hf_prefix: str, path: tuple, num: int, names_shapes) -> list[Entry]:
    """Entries of `num` stacked experts: `hf_prefix`{e}.{name}.weight -> path + (name,)[e]."""
    return [
        Entry(f"{hf_prefix}{e}.{name}.weight", path + (name,), shape, 1, e)
        for name, shape in names_shapes
        for e in range(num)
    ]


def _get(tree: Mapping, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def to_numpy(x: Any) -> np.ndarray:
    """np / jax arrays as they are; torch tensors (bf16 included) via their values."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            return x.float().numpy().astype(jnp.bfloat16)
        return x.numpy()
    return np.asarray(x)


def check_names(table: Sequence[Entry], tensors: Mapping[str, Any], tied: bool) -> None:
    """KeyError naming missing tensors, ValueError naming unexpected or mis-shaped ones."""
    expected = {t.hf_name for t in table}
    given = {n for n in tensors if not n.endswith(_IGNORED_SUFFIXES)}
    if tied and "lm_head.weight" in given:
        head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
        if not np.array_equal(to_numpy(head), to_numpy(embed)):
            raise ValueError("lm_head.weight differs from the embedding but the head is tied")
        given.discard("lm_head.weight")
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing:
        raise KeyError(f"checkpoint is missing tensors {missing[:8]} (of {len(missing)})")
    if unexpected:
        raise ValueError(f"checkpoint has unexpected tensors {unexpected[:8]}")
    for t in table:
        if tuple(tensors[t.hf_name].shape) != t.hf_shape:
            raise ValueError(
                f"tensor {t.hf_name} has shape {tuple(tensors[t.hf_name].shape)}, "
                f"expected {t.hf_shape}"
            )


def to_state_dict(params: Any, table: Sequence[Entry]) -> dict[str, np.ndarray]:
    """HF name -> numpy array (torch layout) from a module, an nnx.State or a pure dict."""
    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    out = {}
    for t in table:
        value = np.asarray(_get(params, t.path))
        value = value if t.expert is None else value[t.expert]
        if value.shape != t.shape:
            raise ValueError(f"{t.path} has shape {value.shape}, expected {t.shape}")
        out[t.hf_name] = t.to_hf(value)
    return out


def from_state_dict(
    build: Callable[[], nnx.Module],
    table: Sequence[Entry],
    tensors: Mapping,
    tied: bool,
    param_dtype: jnp.dtype,
) -> nnx.Module:
    """The module `build()` makes, its params set from HF `tensors` (numpy/torch/jax)."""
    check_names(table, tensors, tied)
    graphdef, state = nnx.split(nnx.eval_shape(build))
    values = nnx.to_pure_dict(state)
    stacks: dict[tuple, dict[int, np.ndarray]] = {}
    for t in table:
        ours = t.to_ours(to_numpy(tensors[t.hf_name]))
        if t.expert is None:
            _set(values, t.path, jnp.asarray(ours, param_dtype))
        else:
            stacks.setdefault(t.path, {})[t.expert] = ours
    for path, rows in stacks.items():
        _set(values, path, jnp.asarray(np.stack([rows[e] for e in sorted(rows)]), param_dtype))
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def load_sharded(
    path: str,
    table: Sequence[Entry],
    abstract_params: Any,
    shardings: Any,
    tied: bool,
    param_dtype: jnp.dtype,
) -> Any:
    """The checkpoint's params (an nnx.State like `abstract_params`), each block read from the
    mapped files and placed on its device (`shardings`: NamedShardings shaped like it)."""
    views = tensor_views(path)
    check_names(table, views, tied)
    values = nnx.to_pure_dict(abstract_params)
    placements = nnx.to_pure_dict(shardings)
    dtype = np.dtype(param_dtype)
    groups: dict[tuple, list[Entry]] = {}
    for t in table:
        groups.setdefault(t.path, []).append(t)
    for param_path, entries in groups.items():
        shape = tuple(_get(values, param_path).shape)

        def read(index, entries=entries):
            if entries[0].expert is None:
                return entries[0].block(views[entries[0].hf_name], index).astype(dtype)
            rows = sorted(entries, key=lambda t: t.expert)[index[0]]
            return np.stack([t.block(views[t.hf_name], index[1:]) for t in rows]).astype(dtype)

        array = jax.make_array_from_callback(shape, _get(placements, param_path), read, dtype=dtype)
        _set(values, param_path, array)
    nnx.replace_by_pure_dict(abstract_params, values)
    return abstract_params


def read_json(path: str) -> dict:
    """`path`/config.json as a dict."""
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}")
    with open(config_path) as f:
        return json.load(f)


def save(path: str, tensors: Mapping[str, np.ndarray], hf_config: dict) -> None:
    """config.json + model.safetensors (tensors in their own dtype) that transformers loads."""
    os.makedirs(path, exist_ok=True)
    hf_config = dict(hf_config)
    hf_config["torch_dtype"] = hf_config["dtype"] = str(next(iter(tensors.values())).dtype)
    save_file(dict(tensors), os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2)
