"""Test-wide settings (CPU only, 8 fake devices for sharding) and shared tiny-model fixtures."""

import os

import pytest

# Must run before jax is imported anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Backend optimization level 0 roughly halves CPU compile time of the tiny test models
# with no measurable slowdown in execution; tests compare against references with tolerances.
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# Prime-ish dims shared by the model and sampling tests: 5 query heads over 1 kv head, head_dim 8,
# hidden 40 != 5*8, vocab 97, so a transposed axis or a wrong head grouping fails a shape check.
TINY_QWEN3_DIMS = dict(
    vocab_size=97,
    hidden_size=40,
    intermediate_size=52,
    num_hidden_layers=2,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=8,
)


@pytest.fixture(scope="session")
def tiny_qwen3_dims():
    """`TINY_QWEN3_DIMS` as a fresh dict (HF config keys), e.g. for a transformers config."""
    return dict(TINY_QWEN3_DIMS)


@pytest.fixture(scope="session")
def tiny_qwen3_config():
    """Factory: `make(**overrides)` -> `qwen3.Qwen3Config` with `TINY_QWEN3_DIMS` and overrides."""
    from thundersync_jax.models import qwen3

    def make(**overrides):
        return qwen3.Qwen3Config(**{**TINY_QWEN3_DIMS, **overrides})

    return make


@pytest.fixture(scope="session")
def random_qwen3():
    """Factory: `make(cfg, seed, **kwargs)` -> `qwen3.Qwen3` with far-from-default random weights.

    Drawn in numpy (`qwen3.random_state_dict`) and loaded through the HF-layout path: no per-op
    XLA compilation as an eager `qwen3.Qwen3(cfg, rngs=...)` init would cost (~1.5 s CPU).
    """
    from thundersync_jax.models import qwen3

    def make(cfg, seed, **kwargs):
        return qwen3.from_hf_state_dict(cfg, qwen3.random_state_dict(cfg, seed), **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_policy():
    """Factory: `make(seed, num_hidden_layers=1)` -> (cfg, graphdef, params) of a random policy.

    Small enough to compile in seconds, with 3 query heads over 1 kv head (GQA exercised);
    shared by the learner, algorithm and schedule tests.
    """
    from flax import nnx

    from thundersync_jax.models import qwen3

    def make(seed: int, num_hidden_layers: int = 1):
        cfg = qwen3.Qwen3Config(
            vocab_size=53,
            hidden_size=24,
            intermediate_size=40,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=8,
            tie_word_embeddings=True,
        )
        graphdef, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
        return cfg, graphdef, params

    return make
