"""Qwen3-MoE architecture hyper-parameters, read from and written to HF config.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from thundersync_jax.models import hf_config, moe


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig:
    """Qwen3-MoE (e.g. Qwen3-30B-A3B) hyper-parameters; frozen, hashable (a jit static).

    Attention is Qwen3's (grouped-query, per-head q/k RMSNorm, rotate-half RoPE). Layer i is
    sparse unless i is in `mlp_only_layers` or (i + 1) is not a multiple of
    `decoder_sparse_step` (transformers' rule); dense layers use `intermediate_size`.

    Attributes: as transformers' Qwen3MoeConfig (num_experts = E, num_experts_per_tok = K,
      moe_intermediate_size = one expert's width, norm_topk_prob = renormalize the K weights).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    model_type: str = "qwen3_moe"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for name in ("mlp_only_layers", "eos_token_id"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    # What qwen3.Attention reads.
    qkv_bias = property(lambda self: self.attention_bias)
    o_bias = property(lambda self: self.attention_bias)
    qk_norm = property(lambda self: True)
    num_query_groups = property(lambda self: self.num_attention_heads // self.num_key_value_heads)

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        return tuple(
            i not in self.mlp_only_layers
            and self.num_experts > 0
            and (i + 1) % self.decoder_sparse_step == 0
            for i in range(self.num_hidden_layers)
        )

    @property
    def moe(self) -> moe.MoeSpec:
        return moe.MoeSpec(
            hidden_size=self.hidden_size,
            num_experts=self.num_experts,
            top_k=self.num_experts_per_tok,
            expert_size=self.moe_intermediate_size,
            scoring="softmax",
            norm_topk_prob=self.norm_topk_prob,
        )

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Qwen3MoeConfig:
        """From a parsed config.json; rejects what this implementation would get wrong."""
        if hf.get("model_type", "qwen3_moe") != "qwen3_moe":
            raise ValueError(f"model_type={hf.get('model_type')!r} is not 'qwen3_moe'")
        if hf.get("hidden_act", "silu") != "silu" or hf.get("use_sliding_window", False):
            raise ValueError("only hidden_act='silu' and full attention are supported")
        heads = hf["num_attention_heads"]
        kw = hf_config.known_fields(cls, hf)
        kw["num_experts"] = hf.get("num_experts", hf.get("num_local_experts"))
        kw["head_dim"] = hf.get("head_dim") or hf["hidden_size"] // heads
        kw["num_key_value_heads"] = hf.get("num_key_value_heads") or heads
        kw["rope_theta"] = hf_config.default_rope_theta(hf)
        kw["mlp_only_layers"] = tuple(hf.get("mlp_only_layers") or ())
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json transformers' Qwen3MoeForCausalLM (and vLLM) loads."""
        return hf_config.hf_dict(
            self, "Qwen3MoeForCausalLM", use_sliding_window=False, sliding_window=None
        )

    @classmethod
    def from_config_dict(cls, section: Any) -> Qwen3MoeConfig:
        """From the `model` section of a run config (run-time keys ignored)."""
        return hf_config.from_section(cls, section)
