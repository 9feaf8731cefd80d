"""vLLM engine: snapshot -> HF conversion on CPU (vs transformers); generation on a GPU."""

import importlib.util
import json
import os
import subprocess
import sys
import uuid

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3, sampling
from thundersync_jax.rollout import snapshots, vllm_engine
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
    state_dict = vllm_engine.snapshot_to_hf_state_dict(path, 3, cfg)
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
        vllm_engine.snapshot_to_hf_state_dict(path, 1, tiny.cfg)
    model_path = snapshots.publish(nnx.split(tiny.model(), nnx.Param)[1], 2, str(tmp_path))
    with pytest.raises(snapshots.SnapshotError, match="holds version 2, expected 4"):
        vllm_engine.snapshot_to_hf_state_dict(model_path, 4, tiny.cfg)


def test_bfloat16_arrays_reach_torch_bit_exact():
    x = np.asarray(jnp.asarray([1.5, -2.25, 3e-3], jnp.bfloat16))
    t = vllm_engine._to_torch(x)
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(t.float().numpy(), x.astype(np.float32))


def test_vllm_seed_depends_only_on_the_key_ids():
    sp = sampling.SamplingParams()
    a = GenerateRequest("a", [1], sp, (1, 2, 3, 4))
    b = GenerateRequest("b", [9, 9], sp, (1, 2, 3, 4))
    c = GenerateRequest("c", [1], sp, (1, 2, 3, 4), turn=1)
    assert vllm_engine.request_seed(a) == vllm_engine.request_seed(b) != vllm_engine.request_seed(c)
    assert 0 <= vllm_engine.request_seed(a) < 2**63


def _vllm_on_gpu() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(
    not _vllm_on_gpu(), reason="needs vLLM and a CUDA GPU: pip install 'thundersync-jax[vllm]'"
)
def test_vllm_server_generates_and_loads_published_weights(tmp_path):
    from thundersync_jax.rollout.client import EngineClient

    # vLLM's attention kernels want head_dim 64/128; vocabulary of the byte tokenizer.
    cfg = qwen3.Qwen3Config(
        vocab_size=384,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
    )
    qwen3.save_pretrained(qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)), str(tmp_path / "hf"))
    address = f"ipc://{tmp_path}/vllm-{uuid.uuid4().hex[:6]}.sock"
    vllm_kwargs = {
        "skip_tokenizer_init": True,
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
    }
    cmd = [sys.executable, "-m", "thundersync_jax.rollout.server", "--engine", "vllm"]
    cmd += ["--address", address, "--checkpoint", str(tmp_path / "hf"), "--max-seq-len", "256"]
    cmd += ["--max-batch", "8", "--vllm-kwargs", json.dumps(vllm_kwargs), "--dtype", "float32"]
    proc = subprocess.Popen(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    client = EngineClient(address, timeout_s=600)
    try:
        client.wait_ready(timeout_s=600)
        new_model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(1))
        new_model.norm.scale[...] = new_model.norm.scale[...] * 40.0  # peaked: greedy is stable
        path = snapshots.publish(nnx.split(new_model, nnx.Param)[1], 1, str(tmp_path / "snap"))
        assert client.load_weights(path, 1) == 1
        greedy = sampling.SamplingParams(temperature=0.0, max_new_tokens=12)
        prompts = [[5, 6, 7], [100, 200, 300, 17, 3]]
        reqs = [GenerateRequest(f"g{i}", p, greedy, (0, 0, i, 0)) for i, p in enumerate(prompts)]
        results = {r.request_id: r for r in client.generate(reqs)}
        keys = [sampling.sequence_key(0, 0, i, 0) for i in range(2)]
        ref = sampling.generate(new_model, prompts, keys, greedy)
        for i in range(2):
            assert results[f"g{i}"].policy_version == 1
            assert results[f"g{i}"].tokens == ref[i].tokens
        scored = client.score([prompts[1] + ref[1].tokens])[0]
        ids = jnp.asarray([prompts[1] + ref[1].tokens])
        logp = np.asarray(jax_log_softmax(new_model(ids)))[0, :-1]
        want = np.take_along_axis(logp, np.asarray(ids)[0, 1:, None], axis=-1)[:, 0]
        np.testing.assert_allclose(scored, want, atol=1e-3)
    finally:
        try:
            client.shutdown(timeout_s=30)
            proc.wait(timeout=60)
        except Exception:
            proc.kill()
        client.close()


def jax_log_softmax(logits):
    import jax

    return jax.nn.log_softmax(logits, axis=-1)
