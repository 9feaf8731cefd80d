"""Score-gradient chunk with and without the engine/learner gap aux outputs (BENCHMARKS.md,
"Engines and publication"). From the repository root:
PYTHONPATH=. python bench/scripts/gap_overhead.py
"""

import time

import jax
import numpy as np
from flax import nnx

from thundersync_jax.learner import chunks
from thundersync_jax.models import qwen3

cfg = qwen3.Qwen3Config(
    vocab_size=384,
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
)
graphdef, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)), nnx.Param)
rng = np.random.default_rng(0)
B, T = 4, 512
tokens = rng.integers(1, 384, (B, T)).astype(np.int32)
mask = np.zeros((B, T), np.float32)
mask[:, 16:] = 1
w = np.ones((B, T), np.float32)
eng = rng.normal(-6, 1, (B, T)).astype(np.float32)
variants = {}
for cap in (0.0, 2.0):
    f = chunks.make_score_grad_fn(graphdef, (T,), tis_cap=cap)
    variants[f"gap, tis_cap={cap}"] = lambda f=f: jax.block_until_ready(
        f.score_and_gap(params, tokens, mask, w, eng)[0]
    )
plain = chunks.make_score_grad_fn(graphdef, (T,))
noaux = jax.jit(lambda p, t, m, ww: plain._score_grad(p, None, t, m, ww, None)[0])
variants["no aux"] = lambda: jax.block_until_ready(noaux(params, tokens, mask, w))
for v in variants.values():
    v()
times = {k: [] for k in variants}
for _ in range(7):
    for k, v in variants.items():
        t = time.perf_counter()
        v()
        times[k].append(time.perf_counter() - t)
for k, ts in times.items():
    print(k, f"median {np.median(ts) * 1e3:.1f} ms")
