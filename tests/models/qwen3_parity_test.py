"""Logits of our Qwen3/Qwen2 equal transformers' (torch CPU, float32) through HF checkpoints.

Tiny prime-ish configs (hidden 40, 5 query heads over 1 kv head, head_dim 8, vocab 97) with every
parameter randomized, norm scales included, so a transposed axis or a skipped norm shows up.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.models import qwen3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RTOL = 1e-4  # max |ours - transformers| / max |transformers|

# The shared tiny dims (tests/conftest.py) plus what transformers needs explicitly.
_HF_EXTRA = dict(rms_norm_eps=1e-6, max_position_embeddings=128)

# name -> (transformers config class, overrides of the tiny dims; Qwen2 derives head_dim = 40 / 5)
CONFIGS = {
    "qwen3_untied": ("Qwen3Config", dict(rope_theta=5000.0)),
    "qwen3_tied_bias": (
        "Qwen3Config",
        dict(head_dim=12, tie_word_embeddings=True, attention_bias=True),
    ),
    "qwen2_untied": ("Qwen2Config", dict(rope_theta=7000.0)),
    "qwen2_tied": ("Qwen2Config", dict(num_key_value_heads=5, tie_word_embeddings=True)),
}


def _randomize(model, seed: int) -> None:
    """Every parameter random; norm scales around 1 but not 1, biases nonzero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)


def _hf_model(name: str, dims: dict):
    cls_name, overrides = CONFIGS[name]
    if cls_name == "Qwen2Config":
        dims = {k: v for k, v in dims.items() if k != "head_dim"}
    cfg = getattr(transformers, cls_name)(**{**dims, **_HF_EXTRA, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    _randomize(model, seed=list(CONFIGS).index(name))
    return model.eval()


def _inputs():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 97, size=(3, 13)).astype(np.int32)
    mask = np.ones((3, 13), bool)
    mask[1, :4] = False  # left padding
    mask[2, 9:] = False  # right padding
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return ids, mask, positions


def _hf_logits(model, ids, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def _rel_err(ours, ref, mask) -> float:
    ours, ref = np.asarray(ours)[mask], np.asarray(ref)[mask]
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_qwen3_dims):
    """For each config: the HF model, its single-file and sharded checkpoints, and HF logits."""
    ids, mask, positions = _inputs()
    out = {}
    for name in CONFIGS:
        model = _hf_model(name, tiny_qwen3_dims)
        root = tmp_path_factory.mktemp(name)
        model.save_pretrained(root / "single")
        model.save_pretrained(root / "sharded", max_shard_size="20KB")
        out[name] = dict(
            model=model,
            single=str(root / "single"),
            sharded=str(root / "sharded"),
            logits=_hf_logits(model, ids, mask, positions),
        )
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_transformers_checkpoint_loads_with_equal_logits(checkpoints, name, layout):
    ckpt = checkpoints[name]
    if layout == "sharded":
        with open(os.path.join(ckpt["sharded"], qwen3._hf_io.INDEX_FILE)) as f:
            assert len(set(json.load(f)["weight_map"].values())) > 1
    model = qwen3.from_pretrained(ckpt[layout], dtype=jnp.float32)
    ids, mask, positions = _inputs()
    logits = model(ids, positions=positions, attention_mask=mask)
    assert logits.dtype == jnp.float32 and logits.shape == (3, 13, 97)
    err = _rel_err(logits, ckpt["logits"], mask)
    print(f"transformers -> ours {name} {layout}: max rel err {err:.2e}")
    assert err < RTOL
    # Default positions (cumsum of the mask) are the ones passed above.
    assert _rel_err(model(ids, attention_mask=mask), ckpt["logits"], mask) < RTOL


@pytest.mark.parametrize("name", list(CONFIGS))
def test_our_checkpoint_loads_in_transformers_with_equal_logits(checkpoints, name, tmp_path):
    ours = qwen3.from_pretrained(checkpoints[name]["single"])
    qwen3.save_pretrained(ours, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        written = json.load(f)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        has_head = "lm_head.weight" in f.keys()
    assert has_head == (not written["tie_word_embeddings"])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(reloaded).__name__ == type(checkpoints[name]["model"]).__name__
    ids, mask, positions = _inputs()
    ref = _hf_logits(reloaded, ids, mask, positions)
    err = _rel_err(ours(ids, positions=positions, attention_mask=mask), ref, mask)
    print(f"ours -> transformers {name}: max rel err {err:.2e}")
    assert err < RTOL
    assert _rel_err(ref, checkpoints[name]["logits"], mask) < RTOL


def test_bf16_params_load_and_round_trip(checkpoints, tmp_path):
    ckpt = checkpoints["qwen3_untied"]
    model = qwen3.from_pretrained(ckpt["single"], dtype=jnp.bfloat16)
    assert model.layers[0].self_attn.q_proj.kernel[...].dtype == jnp.bfloat16
    ids, mask, positions = _inputs()
    logits = model(ids, positions=positions, attention_mask=mask)
    assert logits.dtype == jnp.float32
    err = _rel_err(logits, ckpt["logits"], mask)
    print(f"bf16 params vs float32 transformers: max rel err {err:.2e}")
    # bf16 weights and activations: a few percent of the logit scale, not 1e-4.
    assert err < 5e-2
    qwen3.save_pretrained(model, str(tmp_path))
    again = qwen3.from_pretrained(str(tmp_path), dtype=jnp.bfloat16)
    for a, b in zip(
        qwen3.to_hf_state_dict(model, model.cfg).values(),
        qwen3.to_hf_state_dict(again, again.cfg).values(),
        strict=True,
    ):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert next(hf_bf16.parameters()).dtype == torch.bfloat16


def test_bad_checkpoints_name_the_tensor(checkpoints):
    ckpt = checkpoints["qwen3_untied"]
    cfg = qwen3.read_config(ckpt["single"])
    sd = qwen3.read_safetensors(ckpt["single"])
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_norm.weight"}
    with pytest.raises(KeyError, match="model.layers.1.self_attn.k_norm.weight"):
        qwen3.from_hf_state_dict(cfg, missing)
    with pytest.raises(ValueError, match="model.layers.0.mlp.extra.weight"):
        qwen3.from_hf_state_dict(
            cfg, {**sd, "model.layers.0.mlp.extra.weight": sd["lm_head.weight"]}
        )
    bad = {**sd, "model.layers.0.mlp.up_proj.weight": sd["model.layers.0.mlp.up_proj.weight"].T}
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.weight has shape \(40, 52\)"):
        qwen3.from_hf_state_dict(cfg, bad)
    # torch tensors are accepted as well (ENGINE's conversions).
    as_torch = {k: torch.from_numpy(np.array(v)) for k, v in sd.items()}
    model = qwen3.from_hf_state_dict(cfg, as_torch)
    ids, mask, positions = _inputs()
    assert (
        _rel_err(model(ids, positions=positions, attention_mask=mask), ckpt["logits"], mask) < RTOL
    )
