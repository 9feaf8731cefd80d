"""What the MoE architectures' configs share in reading and writing HF config.json.

`RUNTIME_KEYS` are keys of a run config's `model` section that are not architecture;
`default_rope_theta` reads the RoPE settings (refusing scaled variants), `hf_dict` writes a
frozen dataclass config as config.json fields, `from_section` builds one from a `model` section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

RUNTIME_KEYS = (
    "checkpoint", "dtype", "param_dtype", "remat", "routing",
    "remat_offload", "attention_impl", "attention_block", "logits_tile", "scan_layers",
)  # fmt: skip


def default_rope_theta(hf: Mapping[str, Any], check_partial: bool = False) -> float:
    """The RoPE base of a config.json; ValueError unless the RoPE is the default one (and,
    with `check_partial`, rotates the whole rotary part)."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    scaled = rope.get("rope_type", rope.get("type", "default")) != "default"
    if scaled or (check_partial and rope.get("partial_rotary_factor", 1.0) != 1.0):
        raise ValueError(f"rope {rope} is not supported: only the default RoPE")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def known_fields(cls: type, hf: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `hf` that are fields of the dataclass `cls`."""
    fields = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in hf.items() if k in fields}


def hf_dict(cfg: Any, architecture: str, **extra: Any) -> dict[str, Any]:
    """`cfg`'s fields as config.json values (tuples as lists), its architecture, silu, the
    default RoPE at `cfg.rope_theta`, and `extra`."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
    out.update(
        architectures=[architecture],
        hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        **extra,
    )
    return out


def from_section(cls: type, section: Any, derived: tuple[str, ...] = ()) -> Any:
    """`cls.from_hf` of a run config's `model` section, its run-time and `derived` keys left out."""
    as_dict = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    drop = RUNTIME_KEYS + derived
    return cls.from_hf({k: v for k, v in as_dict.items() if k not in drop})
