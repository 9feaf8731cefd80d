"""vLLM engine pieces that need no vLLM: snapshot -> HF conversion (vs transformers), seeds.

The engine itself runs in vllm_cpu_test.py (vLLM's CPU backend)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3, sampling
from thundersync_jax.rollout import snapshots, vllm_engine, vllm_weights
from thundersync_jax.rollout.protocol import GenerateRequest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_logits(state_dict, cfg, ids):
    """transformers' logits with `state_dict` loaded (a tied head shares the embedding)."""
    config = transformers.Qwen3Config(**cfg.to_hf())
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    tensors = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in state_dict.items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    tied_head = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    assert not unexpected and set(missing) <= tied_head, (missing, unexpected)
    with torch.no_grad():
        return hf.float().eval()(torch.from_numpy(ids).long()).logits.numpy()


@pytest.mark.parametrize("tied", [False, True])
def test_snapshot_converts_to_hf_names_with_transformers_logits(tiny, tmp_path, tied):
    cfg = qwen3.Qwen3Config(**{**tiny.cfg.__dict__, "tie_word_embeddings": tied})
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(5))
    path = snapshots.publish(nnx.split(model, nnx.Param)[1], 3, str(tmp_path))
    state_dict = vllm_weights.snapshot_to_hf_state_dict(path, 3, cfg)
    assert ("lm_head.weight" in state_dict) != tied
    assert state_dict["model.layers.1.self_attn.o_proj.weight"].shape == (
        cfg.hidden_size,
        cfg.num_attention_heads * cfg.head_dim,
    )
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 11))
    ours = np.asarray(model(jnp.asarray(ids)))
    theirs = _hf_logits(state_dict, cfg, ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-5 * np.abs(theirs).max())


def test_conversion_refuses_adapters_and_wrong_versions(tiny, tmp_path):
    adapters = {"q_proj": {"a": np.ones((5, 2), np.float32)}}
    path = snapshots.publish(adapters, 1, str(tmp_path), kind="lora_adapters")
    with pytest.raises(snapshots.SnapshotError, match="LoRA adapters"):
        vllm_weights.snapshot_to_hf_state_dict(path, 1, tiny.cfg)
    model_path = snapshots.publish(nnx.split(tiny.model(), nnx.Param)[1], 2, str(tmp_path))
    with pytest.raises(snapshots.SnapshotError, match="holds version 2, expected 4"):
        vllm_weights.snapshot_to_hf_state_dict(model_path, 4, tiny.cfg)


def test_bfloat16_arrays_reach_torch_bit_exact():
    x = np.asarray(jnp.asarray([1.5, -2.25, 3e-3], jnp.bfloat16))
    t = vllm_weights.to_torch(x)
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(t.float().numpy(), x.astype(np.float32))


def test_vllm_seed_depends_only_on_the_key_ids():
    sp = sampling.SamplingParams()
    a = GenerateRequest("a", [1], sp, (1, 2, 3, 4))
    b = GenerateRequest("b", [9, 9], sp, (1, 2, 3, 4))
    c = GenerateRequest("c", [1], sp, (1, 2, 3, 4), turn=1)
    assert vllm_engine.request_seed(a) == vllm_engine.request_seed(b) != vllm_engine.request_seed(c)
    assert 0 <= vllm_engine.request_seed(a) < 2**63
