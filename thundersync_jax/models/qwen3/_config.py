"""Qwen3 / Qwen2 architecture hyper-parameters, read from and written to HF config.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# model_type -> (q/k/v projections have a bias, o_proj has a bias, per-head q/k RMSNorm).
# Qwen2 / Qwen2.5 always bias q/k/v and never o; Qwen3 follows `attention_bias` for all four.
_SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Dense Qwen3 (or Qwen2/Qwen2.5) decoder hyper-parameters.

    Frozen and hashable, so it can be a static argument of `jax.jit`.

    Attributes:
      vocab_size: rows of the token embedding (and of the LM head).
      hidden_size: width of the residual stream (D).
      intermediate_size: width of the SwiGLU MLP (F).
      num_hidden_layers: decoder layers (L).
      num_attention_heads: query heads (N).
      num_key_value_heads: key/value heads (K); N must be a multiple of K (grouped-query attention).
      head_dim: width of one head (H); Qwen2 checkpoints have hidden_size / num_attention_heads.
      rope_theta: RoPE base frequency (default rope, rotate-half convention as in HF).
      rms_norm_eps: epsilon inside every RMSNorm.
      tie_word_embeddings: LM head reuses the token embedding (then there is no lm_head tensor).
      qkv_bias: q/k/v projections carry a bias (Qwen2: always; Qwen3: `attention_bias`).
      o_bias: o_proj carries a bias (Qwen2: never; Qwen3: `attention_bias`).
      qk_norm: per-head RMSNorm on queries and keys before RoPE (Qwen3 yes, Qwen2 no).
      max_position_embeddings: longest context the checkpoint was trained for (informational).
      model_type: "qwen3" or "qwen2"; decides how `to_hf` spells the biases.
      bos_token_id, eos_token_id: copied through to config.json for generation tooling.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True
    max_position_embeddings: int = 32768
    model_type: str = "qwen3"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        if self.model_type not in _SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; valid: {_SUPPORTED_MODEL_TYPES}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotate-half RoPE")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one key/value head (G = N / K)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Qwen3Config:
        """Builds the config from a parsed HF config.json (transformers 4.x or 5.x spelling).

        Raises ValueError for architectures this implementation would silently get wrong:
        another model_type, an activation other than SiLU, rope scaling, sliding-window attention.
        """
        model_type = hf.get("model_type", "qwen3")
        if model_type not in _SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json model_type={model_type!r} is not supported; "
                f"valid: {_SUPPORTED_MODEL_TYPES}"
            )
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported; only 'silu' (SwiGLU)")
        if hf.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=true is not supported; only full attention")
        layer_types = hf.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(f"layer_types={layer_types} is not supported; only 'full_attention'")
        rope_theta = _rope_theta(hf)
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        if model_type == "qwen2":
            qkv_bias, o_bias, qk_norm = True, False, False
        else:
            bias = bool(hf.get("attention_bias", False))
            qkv_bias, o_bias, qk_norm = bias, bias, True
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=qk_norm,
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            model_type=model_type,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict transformers' Qwen3ForCausalLM / Qwen2ForCausalLM loads.

        Writes both `rope_theta` (transformers 4.x, vLLM) and `rope_parameters` (transformers 5.x).
        """
        if self.model_type == "qwen2":
            if not (self.qkv_bias and not self.o_bias and not self.qk_norm):
                raise ValueError(
                    "a qwen2 config needs qkv_bias=True, o_bias=False, qk_norm=False; got "
                    f"{self.qkv_bias=}, {self.o_bias=}, {self.qk_norm=}"
                )
            if self.head_dim * self.num_attention_heads != self.hidden_size:
                raise ValueError(
                    f"qwen2 needs head_dim * num_attention_heads == hidden_size; got "
                    f"{self.head_dim} * {self.num_attention_heads} != {self.hidden_size}"
                )
            arch, extra = "Qwen2ForCausalLM", {}
        else:
            if self.qkv_bias != self.o_bias or not self.qk_norm:
                raise ValueError(
                    "a qwen3 config needs qkv_bias == o_bias (attention_bias) and qk_norm=True; "
                    f"got {self.qkv_bias=}, {self.o_bias=}, {self.qk_norm=}"
                )
            arch, extra = "Qwen3ForCausalLM", {"attention_bias": self.qkv_bias}
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "use_sliding_window": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            **extra,
        }

    @classmethod
    def from_config_dict(cls, section: Any) -> Qwen3Config:
        """From the `model` section of configs/common.py (HF field names plus run-time keys).

        Keys that are not architecture (checkpoint, dtype, param_dtype, remat) are ignored here;
        the caller reads them itself.
        """
        as_dict = section.to_dict() if hasattr(section, "to_dict") else dict(section)
        for runtime_key in ("checkpoint", "dtype", "param_dtype", "remat"):
            as_dict.pop(runtime_key, None)
        return cls.from_hf(as_dict)


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """rope_theta from either spelling; rejects any rope scaling (YaRN, linear, dynamic...)."""
    for key in ("rope_scaling", "rope_parameters"):
        params = hf.get(key)
        if params is None:
            continue
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"{key}={dict(params)} is not supported: only the default RoPE "
                "(rope_type='default', no scaling) is implemented"
            )
        if "rope_theta" in params:
            return params["rope_theta"]
    return hf.get("rope_theta", 10000.0)
