"""LoRA adapters as pure functions of parameter pytrees.

A targeted weight W (any layout, e.g. [embed, q_heads, head_dim]) gets a low-rank update

    W' = W + (alpha / rank) · reshape(A @ B),   A: [*batch, In, rank], B: [*batch, rank, Out]

where In is the product of W's input-side dims and Out of its output-side dims (the "layers"
axis of stacked weights, if any, is a batch dim). A starts small and random, B at zero, so a
fresh adapter leaves the model unchanged. Which dims are input-side comes from the logical
axis names the model puts on its parameters: projections that read the residual stream
(q/k/v/gate/up) take their "embed" dims as input; those that write it (o_proj, down_proj)
take their "embed" dims as output. Parameters without axis names must be 2-D [in, out]
(the `nnx.Linear` layout).

Training differentiates only the adapters: `merge(base_params, adapters)` is differentiable in
`adapters`, so `jax.grad(loss)(adapters, base_params)` returns a tree shaped like the adapters,
and optimizer state and accumulator tallies built on the adapters stay adapter-sized.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

HF_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Targets whose output, not input, is the residual stream ("embed" dims are output-side).
_WRITES_RESIDUAL = frozenset({"o_proj", "down_proj"})
_RESIDUAL_AXIS = "embed"
# Dims that index independent weights: stacked layers, and a MoE block's routed experts
# (each expert gets its own adapter pair).
_BATCH_AXES = ("layers", "expert")
# A MoE block stores its experts' projections as leaves of `experts` ([E, ...] params named
# gate_proj / up_proj / down_proj), not as modules holding a `kernel`.
_EXPERTS = "experts"


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a weight's dims split into batch, input and output sides (indices into its shape).

    Attributes:
      shape: the weight's shape.
      batch_axes: dims that index independent weights (stacked layers).
      in_axes: dims contracted with the layer input.
      out_axes: dims of the layer output.
    """

    shape: tuple[int, ...]
    batch_axes: tuple[int, ...]
    in_axes: tuple[int, ...]
    out_axes: tuple[int, ...]

    @property
    def in_features(self) -> int:
        return math.prod(self.shape[i] for i in self.in_axes)

    @property
    def out_features(self) -> int:
        return math.prod(self.shape[i] for i in self.out_axes)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[i] for i in self.batch_axes)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["weights"],
    meta_fields=["rank", "alpha", "layouts"],
)
@dataclasses.dataclass(frozen=True)
class Adapters:
    """LoRA factors for every targeted weight; a pytree whose only leaves are the factors.

    Attributes:
      weights: {param path: {"a": [*batch, In, rank], "b": [*batch, rank, Out]}} float32.
      rank: LoRA rank r.
      alpha: LoRA alpha; the update is scaled by alpha / rank.
      layouts: ((param path, Layout), ...) static description of each targeted weight.
    """

    weights: dict[str, dict[str, jax.Array]]
    rank: int
    alpha: float
    layouts: tuple[tuple[str, Layout], ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_name(keypath: Sequence[Any]) -> str:
    """'layers/0/self_attn/q_proj/kernel' for a jax key path (a Variable's '.value' dropped)."""
    names = [_key_name(k) for k in keypath]
    if names and names[-1] == "value":
        names = names[:-1]
    return "/".join(names)


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _axis_names(leaf: Any) -> tuple[str | None, ...] | None:
    """Logical axis names of an nnx.Param (from nnx.with_partitioning), or None."""
    if not _is_variable(leaf):
        return None
    names = leaf.get_metadata().get("out_sharding")
    return tuple(names) if names else None


def _layout(path: str, target: str, shape: tuple[int, ...], names) -> Layout:
    if names is None:
        if len(shape) != 2:
            raise ValueError(
                f"LoRA target {path} has shape {shape} and no logical axis names; only 2-D "
                "[in, out] weights can be adapted without names (add nnx.with_partitioning)"
            )
        return Layout(shape, (), (0,), (1,))
    batch = tuple(i for i, n in enumerate(names) if n in _BATCH_AXES)
    residual = tuple(i for i, n in enumerate(names) if n == _RESIDUAL_AXIS)
    other = tuple(i for i, n in enumerate(names) if n not in _BATCH_AXES and n != _RESIDUAL_AXIS)
    if not residual or not other:
        raise ValueError(
            f"LoRA target {path} has axis names {names}; expected '{_RESIDUAL_AXIS}' dims and "
            "projection dims (e.g. ('embed', 'q_heads', 'head_dim'))"
        )
    if target in _WRITES_RESIDUAL:
        return Layout(shape, batch, other, residual)
    return Layout(shape, batch, residual, other)


def _targeted(path: str, targets: Sequence[str], ndim: int) -> str | None:
    """The target module a weight belongs to, or None (biases and norms are never adapted)."""
    parts = path.split("/")
    if ndim < 2 or parts[-1] in ("bias", "scale"):
        return None
    for part in parts[:-1]:
        if part in targets:
            return part
    if len(parts) > 1 and parts[-2] == _EXPERTS and parts[-1] in targets:
        return parts[-1]  # a routed expert's projection: per-expert adapters
    return None


def find_layouts(
    params: Any, targets: Sequence[str] = HF_TARGETS
) -> tuple[tuple[str, Layout], ...]:
    """Finds every weight under a target module (by path component) and its layout.

    Works on arrays and on abstract params (`jax.ShapeDtypeStruct`s from eval_shape).
    """
    unknown = set(targets) - set(HF_TARGETS)
    if unknown:
        raise ValueError(f"unknown LoRA targets {sorted(unknown)}; valid: {HF_TARGETS}")
    found = []
    for keypath, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_variable)[0]:
        path = path_name(keypath)
        shape = tuple((leaf.get_value() if _is_variable(leaf) else leaf).shape)
        target = _targeted(path, targets, len(shape))
        if target is not None:
            found.append((path, _layout(path, target, shape, _axis_names(leaf))))
    if not found:
        raise ValueError(f"no parameter matches LoRA targets {tuple(targets)}")
    return tuple(found)


def init(
    params: Any,
    rank: int,
    alpha: float,
    targets: Sequence[str] = HF_TARGETS,
    key: jax.Array | None = None,
) -> Adapters:
    """Creates adapters for every targeted weight: A ~ U(±1/sqrt(In)), B = 0 (float32).

    Args:
      params: the model's parameter pytree (`nnx.split(model, nnx.Param)[1]` or a pure dict).
      rank: LoRA rank r (>= 1).
      alpha: scale numerator; the update is alpha / rank · A @ B.
      targets: HF-style module names to adapt.
      key: PRNG key for A.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank={rank} must be >= 1")
    key = jax.random.key(0) if key is None else key
    layouts = find_layouts(params, targets)

    @jax.jit  # one program instead of one eager dispatch per factor
    def factors(key):
        weights = {}
        for i, (path, lay) in enumerate(layouts):
            bound = 1.0 / math.sqrt(lay.in_features)
            a_shape = (*lay.batch_shape, lay.in_features, rank)
            a = jax.random.uniform(jax.random.fold_in(key, i), a_shape, jnp.float32, -bound, bound)
            b = jnp.zeros((*lay.batch_shape, rank, lay.out_features), jnp.float32)
            weights[path] = {"a": a, "b": b}
        return weights

    weights = factors(key)
    return Adapters(weights=weights, rank=rank, alpha=float(alpha), layouts=layouts)


def delta(adapters: Adapters, path: str) -> jax.Array:
    """(alpha / rank) · A @ B for one weight, in the weight's own layout (float32)."""
    lay = dict(adapters.layouts)[path]
    pair = adapters.weights[path]
    flat = jnp.matmul(pair["a"], pair["b"]) * adapters.scale  # [*batch, In, Out]
    in_shape = tuple(lay.shape[i] for i in lay.in_axes)
    out_shape = tuple(lay.shape[i] for i in lay.out_axes)
    full = flat.reshape(*lay.batch_shape, *in_shape, *out_shape)
    order = (*lay.batch_axes, *lay.in_axes, *lay.out_axes)  # dims of `full`, in weight indices
    return jnp.transpose(full, tuple(order.index(i) for i in range(len(lay.shape))))


def _add_deltas(params: Any, adapters: Adapters, sign: float) -> Any:
    layouts = dict(adapters.layouts)

    def update(keypath, w):
        path = path_name(keypath)
        if path not in layouts:
            return w
        if tuple(w.shape) != layouts[path].shape:
            raise ValueError(f"{path}: param shape {w.shape} != adapter layout {layouts[path]}")
        return (w.astype(jnp.float32) + sign * delta(adapters, path)).astype(w.dtype)

    missing = set(layouts) - {
        path_name(kp) for kp, _ in jax.tree_util.tree_leaves_with_path(params)
    }
    if missing:
        raise ValueError(f"adapters target params not in this tree: {sorted(missing)[:4]}")
    return jax.tree_util.tree_map_with_path(update, params)


def merge(params: Any, adapters: Adapters) -> Any:
    """W + (alpha/r)·A@B for every targeted weight; other params unchanged (same tree)."""
    return _add_deltas(params, adapters, 1.0)


def unmerge(params: Any, adapters: Adapters) -> Any:
    """Inverse of `merge`: W − (alpha/r)·A@B (exact up to rounding in the param dtype)."""
    return _add_deltas(params, adapters, -1.0)


def apply(graphdef: nnx.GraphDef, base_params: Any, adapters: Adapters, *args, **kwargs):
    """Runs the model with adapted weights; differentiable in `adapters` only (base is frozen).

    Use inside a jitted loss `loss(adapters, base_params, batch)` and take
    `jax.grad(loss)(adapters, base_params, batch)`: the gradient is an `Adapters` tree.
    """
    frozen = jax.lax.stop_gradient(base_params)
    return nnx.merge(graphdef, merge(frozen, adapters))(*args, **kwargs)


def num_params(adapters: Adapters) -> int:
    """Trainable parameter count of the adapters."""
    return sum(x.size for x in jax.tree.leaves(adapters))
