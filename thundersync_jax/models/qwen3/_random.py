"""Random HF-layout weights drawn on the host, for tests and benchmarks of tiny models."""

from __future__ import annotations

import numpy as np

from thundersync_jax.models.qwen3._config import Qwen3Config
from thundersync_jax.models.qwen3._hf_io import tensor_table


def random_state_dict(cfg: Qwen3Config, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 numpy weights: norm scales 1 + 0.3 N(0,1), the rest scale N(0,1).

    Unlike the module initializers (std 0.02, norm scales exactly 1), these make next-token
    distributions far from uniform and let a norm applied to the wrong tensor, or a transposed
    axis, change the output. Drawn in numpy, so building a model costs no per-shape XLA
    compilation: `qwen3.from_hf_state_dict(cfg, qwen3.random_state_dict(cfg, seed))`.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for t in tensor_table(cfg):
        noise = rng.standard_normal(t.hf_shape).astype(np.float32)
        out[t.hf_name] = 1.0 + 0.3 * noise if t.hf_name.endswith("norm.weight") else scale * noise
    return out
