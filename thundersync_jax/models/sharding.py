"""Logical-to-mesh axis rules: parameters name their axes, a config maps names to mesh axes.

The model annotates each parameter with logical axis names ("vocab", "embed", "q_heads",
"kv_heads", "head_dim", "mlp", "layers", "norm"). A config picks one mapping from those names
to the mesh axes ("fsdp", "tp") — or to None (replicated) — so the sharding policy lives in the
config, not in the model code (levanter's approach). Params, gradients, optimizer state and
accumulator tallies all use the resulting `NamedSharding`s, so per-device memory of each
divides by the number of devices its dims are split over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("fsdp", "tp")
LOGICAL_AXES = (
    "vocab",
    "embed",
    "q_heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "layers",
    "norm",
    "expert",  # routed experts of a MoE block (expert parallelism)
    "latent",  # MLA's low-rank q / kv bottleneck
)

# FSDP over the residual width, tensor parallelism over heads / MLP width / vocabulary.
DEFAULT_RULES: dict[str, str | None] = {
    "vocab": "tp",
    "embed": "fsdp",
    "q_heads": "tp",
    "kv_heads": "tp",
    "head_dim": None,
    "mlp": "tp",
    "layers": None,
    "norm": None,
    "expert": None,
    "latent": None,
}

Rules = Mapping[str, str | tuple[str, ...] | None]


def make_mesh(fsdp: int, tp: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("fsdp", "tp") mesh over the first fsdp·tp devices (default: all local devices)."""
    devices = list(jax.devices() if devices is None else devices)
    if fsdp < 1 or tp < 1 or fsdp * tp > len(devices):
        raise ValueError(
            f"mesh fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices; {len(devices)} available"
        )
    grid = np.asarray(devices[: fsdp * tp], dtype=object).reshape(fsdp, tp)
    return Mesh(grid, MESH_AXES)


def rules_from_config(mesh_config: Any) -> dict[str, str | tuple[str, ...] | None]:
    """The config's mapping (`mesh.rules`: pairs or a dict) over the defaults, validated."""
    given = getattr(mesh_config, "rules", None) if mesh_config is not None else None
    rules = dict(DEFAULT_RULES)
    if given:
        rules.update(dict(given.items()) if hasattr(given, "items") else dict(given))
    validate_rules(rules)
    return rules


def validate_rules(rules: Rules) -> None:
    """Raises ValueError for unknown logical names or mesh axes in a rules mapping."""
    for name, target in rules.items():
        if name not in LOGICAL_AXES:
            raise ValueError(f"unknown logical axis {name!r} in rules; valid: {LOGICAL_AXES}")
        axes = (target,) if isinstance(target, str) or target is None else tuple(target)
        for axis in axes:
            if axis is not None and axis not in MESH_AXES:
                raise ValueError(
                    f"rule {name!r} -> {target!r}: mesh axis {axis!r} is not one of {MESH_AXES}"
                )


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _path(keypath) -> str:
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keypath]
    return "/".join(n for n in names if n != "value")


def logical_to_spec(
    path: str, shape: Sequence[int], names: Sequence[str | None] | None, rules: Rules, mesh: Mesh
) -> PartitionSpec:
    """Mesh PartitionSpec of one param; ValueError naming param, dim and axis if not divisible."""
    if not names:
        return PartitionSpec()
    if len(names) != len(shape):
        raise ValueError(f"{path}: axis names {tuple(names)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for dim, (name, size) in enumerate(zip(names, shape, strict=True)):
        if name is not None and name not in rules:
            raise ValueError(f"{path}: logical axis {name!r} has no rule; rules cover {set(rules)}")
        target = rules.get(name) if name is not None else None
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a not in used)  # a mesh axis may split one dim only
        ways = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        if size % ways:
            raise ValueError(
                f"{path}: dim {dim} ({name!r}, size {size}) is not divisible by mesh axis "
                f"{axes} of size {ways}; change the mesh or map {name!r} to None in the rules"
            )
        used.update(axes)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return PartitionSpec(*spec)


def param_specs(abstract_params: Any, rules: Rules, mesh: Mesh) -> Any:
    """PartitionSpec pytree (same structure as the params) from their logical axis names."""
    validate_rules(rules)

    def spec(keypath, leaf):
        value = leaf.get_value() if _is_variable(leaf) else leaf
        names = leaf.get_metadata().get("out_sharding") if _is_variable(leaf) else None
        s = logical_to_spec(_path(keypath), tuple(value.shape), names, rules, mesh)
        return leaf.replace(s) if _is_variable(leaf) else s

    return jax.tree_util.tree_map_with_path(spec, abstract_params, is_leaf=_is_variable)


def param_shardings(abstract_params: Any, rules: Rules, mesh: Mesh) -> Any:
    """NamedSharding pytree for params (arrays or `jax.ShapeDtypeStruct`s from eval_shape)."""
    specs = param_specs(abstract_params, rules, mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def shard_params(params: Any, rules: Rules, mesh: Mesh) -> Any:
    """Places params on the mesh according to the rules (a copy; the input is not donated)."""
    return jax.device_put(params, param_shardings(params, rules, mesh))


def replicated(tree: Any, mesh: Mesh) -> Any:
    """A fully replicated NamedSharding for every leaf (e.g. LoRA adapters, small states)."""
    return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)
