"""GLM-4.7-Flash (`glm4_moe_lite`) hyper-parameters, read from and written to HF config.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from thundersync_jax.models import hf_config, moe

_DERIVED_KEYS = ("qk_head_dim", "head_dim", "num_local_experts")


@dataclasses.dataclass(frozen=True)
class Glm4MoeLiteConfig:
    """GLM-4.7-Flash: multi-head latent attention (MLA) + sigmoid-routed experts.

    Frozen, hashable (a jit static). Field names and meaning as transformers'
    Glm4MoeLiteConfig: queries through a `q_lora_rank` bottleneck (None: one q_proj), keys and
    values from a `kv_lora_rank` latent plus one shared `qk_rope_head_dim` rotary key; only the
    rotary part of each head is rotated (`rope_interleave`: DeepSeek's interleaved pairs);
    `mlp_layer_types[i]` is "dense" or "sparse" (default: the first layer dense).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    n_routed_experts: int
    num_experts_per_tok: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    num_key_value_heads: int | None = None
    n_shared_experts: int = 1
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    mlp_layer_types: tuple[str, ...] | None = None
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 202752
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    model_type: str = "glm4_moe_lite"

    def __post_init__(self):
        types = self.mlp_layer_types
        if types is None:
            types = ("dense",) + ("sparse",) * (self.num_hidden_layers - 1)
        object.__setattr__(self, "mlp_layer_types", tuple(types))
        if len(self.mlp_layer_types) != self.num_hidden_layers:
            raise ValueError(f"mlp_layer_types {types} must name {self.num_hidden_layers} layers")
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError(
                "MLA expands keys for every head: num_key_value_heads must equal "
                "num_attention_heads"
            )
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """transformers' `scaling` (qk_head_dim^-0.5; a YaRN mscale would multiply it, but
        only the default RoPE is accepted)."""
        return self.qk_head_dim**-0.5

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        return tuple(t == "sparse" for t in self.mlp_layer_types)

    @property
    def moe(self) -> moe.MoeSpec:
        return moe.MoeSpec(
            hidden_size=self.hidden_size,
            num_experts=self.n_routed_experts,
            top_k=self.num_experts_per_tok,
            expert_size=self.moe_intermediate_size,
            scoring="sigmoid",
            norm_topk_prob=self.norm_topk_prob,
            n_group=self.n_group,
            topk_group=self.topk_group,
            routed_scaling_factor=self.routed_scaling_factor,
            correction_bias=True,
            shared_size=self.moe_intermediate_size * self.n_shared_experts,
        )

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Glm4MoeLiteConfig:
        """From a parsed config.json; rejects what this implementation would get wrong."""
        if hf.get("model_type", "glm4_moe_lite") != "glm4_moe_lite":
            raise ValueError(f"model_type={hf.get('model_type')!r} is not 'glm4_moe_lite'")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError("only hidden_act='silu' is supported")
        kw = hf_config.known_fields(cls, hf)
        kw["rope_theta"] = hf_config.default_rope_theta(hf, check_partial=True)
        if kw.get("mlp_layer_types") is not None:
            kw["mlp_layer_types"] = tuple(kw["mlp_layer_types"])
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json transformers' Glm4MoeLiteForCausalLM (and vLLM) loads."""
        out = hf_config.hf_dict(self, "Glm4MoeLiteForCausalLM")
        sparse = self.sparse_layers
        dense = sparse.index(True) if any(sparse) else len(sparse)
        if all(sparse[dense:]):
            # vLLM 0.32 builds the layers from DeepSeek's key (transformers 5 ignores it).
            out["first_k_dense_replace"] = dense
        return out

    @classmethod
    def from_config_dict(cls, section: Any) -> Glm4MoeLiteConfig:
        """From the `model` section of a run config (run-time keys ignored)."""
        return hf_config.from_section(cls, section, _DERIVED_KEYS)
