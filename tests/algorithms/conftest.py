"""Shared setup for the schedule tests: one tiny Qwen3 policy shape for every learner test."""

import pytest
from flax import nnx

from thundersync_jax.models import qwen3


def tiny_policy_config(num_hidden_layers: int = 1) -> qwen3.Qwen3Config:
    """Small enough to compile in seconds, with 3 query heads over 1 kv head (GQA exercised)."""
    return qwen3.Qwen3Config(
        vocab_size=53,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )


@pytest.fixture(scope="session")
def tiny_policy():
    """Factory: `make(seed, num_hidden_layers=1)` -> (cfg, graphdef, params) of a random policy."""

    def make(seed: int, num_hidden_layers: int = 1):
        cfg = tiny_policy_config(num_hidden_layers)
        graphdef, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
        return cfg, graphdef, params

    return make
