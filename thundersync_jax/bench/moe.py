"""Mixture-of-experts measurements: a grouped-matmul MoE layer vs a dense layer of equal
active parameters, and our logits against transformers' on tiny random checkpoints.

    python -m thundersync_jax.bench.moe

Layer timing: forward + backward of one feed-forward block over N tokens, jitted, on CPU.
The MoE block (E experts of width F, top-k, softmax router, dropless `ragged_dot` over
tokens sorted by expert) against a dense SwiGLU of width k·F: the same multiply-adds per
token, so the ratio is the price of routing, sorting, gathering and scattering. Interleaved
repeats, medians after warm-up, in one process.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.models import auto, moe


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def layer_times(tokens=4096, d=512, experts=16, top_k=2, width=256, repeats=7) -> dict:
    """Median seconds of forward+backward: MoE block vs a dense SwiGLU of width top_k·width."""
    spec = moe.MoeSpec(d, experts, top_k, width, scoring="softmax", norm_topk_prob=True)
    kw = dict(dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    blocks = {"moe": moe.SparseMoe(spec, **kw), "dense": moe.SwiGLU(d, top_k * width, **kw)}
    x = jax.random.normal(jax.random.key(0), (1, tokens, d))
    fns = {}
    for name, block in blocks.items():
        graphdef, params = nnx.split(block)

        def loss(p, x, graphdef=graphdef, name=name):
            out = nnx.merge(graphdef, p)(x)
            return jnp.sum((out[0] if name == "moe" else out) ** 2)

        fns[name] = (jax.jit(jax.grad(loss)), params)
    times = {name: [] for name in fns}
    for fn, params in fns.values():
        _timed(fn, params, x)  # compile + warm-up
    for _ in range(repeats):
        for name, (fn, params) in fns.items():
            times[name].append(_timed(fn, params, x))
    out = {name: statistics.median(t) for name, t in times.items()}
    out["ratio"] = out["moe"] / out["dense"]
    return out


def parity_errors() -> dict:
    """max |ours - transformers| / max |transformers| (float32 logits) per architecture."""
    import torch
    import transformers

    common = dict(
        vocab_size=67,
        hidden_size=24,
        intermediate_size=40,
        moe_intermediate_size=11,
        num_hidden_layers=3,
        max_position_embeddings=128,
        num_experts_per_tok=2,
    )
    configs = {
        "qwen3_moe": transformers.Qwen3MoeConfig(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=10,
            num_experts=7,
            norm_topk_prob=True,
        ),
        "glm4_moe_lite": transformers.Glm4MoeLiteConfig(
            **common,
            num_attention_heads=3,
            num_key_value_heads=3,
            n_routed_experts=6,
            n_group=3,
            topk_group=2,
            kv_lora_rank=9,
            q_lora_rank=7,
            qk_rope_head_dim=4,
            qk_nope_head_dim=6,
            v_head_dim=5,
        ),
    }
    errors = {}
    for name, cfg in configs.items():
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation="eager", experts_implementation="eager"
        ).eval()
        with torch.no_grad():
            for tensor_name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
                if p.is_floating_point() and "inv_freq" not in tensor_name:  # not RoPE's
                    p.normal_(0.0, 0.2)
        ids = np.random.default_rng(1).integers(0, 67, (2, 13))
        with torch.no_grad():
            want = hf(torch.tensor(ids)).logits.numpy()
        with tempfile.TemporaryDirectory() as path:
            hf.save_pretrained(path)
            got = np.asarray(auto.from_pretrained(path)(ids))
        errors[name] = float(np.abs(got - want).max() / np.abs(want).max())
    return errors


def main() -> None:
    for name, err in parity_errors().items():
        print(f"parity {name}: max rel logits error {err:.2e}")
    t = layer_times()
    print(
        f"fwd+bwd, 4096 tokens, D=512: MoE (16 experts x 256, top-2) {t['moe'] * 1e3:.1f} ms, "
        f"dense SwiGLU (512) {t['dense'] * 1e3:.1f} ms, ratio {t['ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
