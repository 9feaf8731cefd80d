"""Qwen3-MoE and GLM-4.7-Flash (glm4_moe_lite) logits equal transformers' (torch CPU, float32).

Tiny random checkpoints written by transformers' own `save_pretrained` (per-expert tensors),
every parameter and the router's correction bias randomized, loaded by `auto.from_pretrained`.
Prime-ish sizes (hidden 24, 7 experts / 6 in 3 groups, expert width 11) catch transposed axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.models import auto

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RTOL = 1e-5  # max |ours - transformers| / max |transformers|
_COMMON = dict(
    vocab_size=67,
    hidden_size=24,
    intermediate_size=40,
    moe_intermediate_size=11,
    num_hidden_layers=3,
    max_position_embeddings=128,
)

CONFIGS = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=10,
            num_experts=7,
            num_experts_per_tok=3,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            rope_theta=5000.0,
        ),
    ),
    "qwen3_moe_tied_unnormed": (
        "Qwen3MoeConfig",
        dict(
            num_attention_heads=3,
            num_key_value_heads=3,
            head_dim=8,
            num_experts=5,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            tie_word_embeddings=True,
        ),
    ),
    "glm4_moe_lite": (
        "Glm4MoeLiteConfig",
        dict(
            num_attention_heads=3,
            num_key_value_heads=3,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_group=3,
            topk_group=2,
            kv_lora_rank=9,
            q_lora_rank=7,
            qk_rope_head_dim=4,
            qk_nope_head_dim=6,
            v_head_dim=5,
            routed_scaling_factor=1.7,
            rope_theta=3000.0,
        ),
    ),
    "glm4_moe_lite_noqlora_rotatehalf_tied": (
        "Glm4MoeLiteConfig",
        dict(
            num_attention_heads=2,
            num_key_value_heads=2,
            n_routed_experts=5,
            num_experts_per_tok=3,
            kv_lora_rank=8,
            q_lora_rank=None,
            qk_rope_head_dim=6,
            qk_nope_head_dim=4,
            v_head_dim=7,
            rope_interleave=False,
            tie_word_embeddings=True,
            n_shared_experts=2,
            mlp_layer_types=["dense", "sparse", "dense"],
        ),
    ),
}


def _randomize(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.2 * noise)


def write_checkpoint(name: str, path: str, seed: int = 0):
    """A random tiny `name` model saved by transformers to `path`; returns the torch model."""
    cls_name, overrides = CONFIGS[name]
    cfg = getattr(transformers, cls_name)(**{**_COMMON, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", experts_implementation="eager"
    )
    _randomize(model, seed)
    model.eval().save_pretrained(path)
    return model


def _torch_logits(model, ids, mask=None):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=None if mask is None else torch.tensor(mask, dtype=torch.long),
        )
    return out.logits.float().numpy()


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = write_checkpoint(request.param, path, seed=list(CONFIGS).index(request.param))
    return request.param, hf, path


def test_logits_match_transformers(pair):
    name, hf, path = pair
    ours = auto.from_pretrained(path, dtype=jnp.float32)
    ids = np.random.default_rng(1).integers(0, _COMMON["vocab_size"], (2, 13))
    want = _torch_logits(hf, ids)
    got = np.asarray(jax.jit(lambda m, x: m(x))(ours, ids))
    assert got.shape == want.shape and got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= RTOL, f"{name}: relative error {err:.2e}"


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    name, hf, path = pair
    ours = auto.from_pretrained(path)
    auto.save_pretrained(ours, str(tmp_path))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="eager", experts_implementation="eager"
    ).eval()
    ids = np.random.default_rng(2).integers(0, _COMMON["vocab_size"], (1, 9))
    np.testing.assert_array_equal(_torch_logits(reloaded, ids), _torch_logits(hf, ids))


def test_cached_decode_equals_one_shot(pair):
    """Prefill 6 tokens then decode 3 one by one through the cache (MLA: the compressed one)
    gives the one-shot logits, and the own routing of each token is the same."""
    name, _, path = pair
    model = auto.from_pretrained(path)
    ids = np.random.default_rng(3).integers(0, _COMMON["vocab_size"], (2, 9))
    # Jitted: one program per shape instead of op-by-op compiles (suite time).
    cached = jax.jit(lambda m, x, c: m(x, cache=c))
    full = np.asarray(jax.jit(lambda m, x: m(x))(model, ids))
    cache = auto.init_cache(model.cfg, 2, 16)
    logits, cache = cached(model, ids[:, :6], cache)
    steps = [np.asarray(logits)]
    for t in range(6, 9):
        logits, cache = cached(model, ids[:, t : t + 1], cache)
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
