"""The embedded engine on MoE policies: it samples through its cache (MLA: the compressed
one) and reports every fed token's routed experts, equal to a one-shot forward's own routes."""

import os
import sys

import jax
import numpy as np
import pytest

from thundersync_jax.models import sampling
from thundersync_jax.rollout import embedded
from thundersync_jax.rollout.protocol import GenerateRequest

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
)
from moe_models import GLM_SLOW, QWEN, random_model  # noqa: E402  (tiny random MoE models)


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_engine_reports_the_routes_of_every_fed_token(cfg):
    model = random_model(cfg, seed=5)
    engine = embedded.EmbeddedEngine(model, max_batch=2, max_seq_len=40)
    sp = sampling.SamplingParams(temperature=1.0, max_new_tokens=9)
    prompts = [[5, 3, 9, 1, 40], [7, 2] * 6, [11, 12, 13]]  # 3 requests on 2 rows
    for i, p in enumerate(prompts):
        engine.submit(GenerateRequest(f"r{i}", p, sp, (1, 0, i, 0)))
    results = {}
    while engine.has_work():
        results.update({r.request_id: r for r in engine.step()})
    m, k = sum(cfg.sparse_layers), cfg.moe.top_k
    # The one-shot references, jitted: one program per length instead of op-by-op compiles.
    routes_of = jax.jit(lambda m, x: m.hidden_states(x, return_routes=True)[2])
    logits_of = jax.jit(lambda m, x: m(x))
    for i, prompt in enumerate(prompts):
        res = results[f"r{i}"]
        fed = prompt + res.tokens[:-1]
        assert res.routes.shape == (len(fed), m, k)
        own = routes_of(model, np.asarray([fed]))
        np.testing.assert_array_equal(
            np.sort(res.routes, -1), np.sort(np.asarray(own[0]), -1), err_msg=f"request {i}"
        )
        # and the engine's log-probs are the one-shot model's (it samples the same policy)
        logits = logits_of(model, np.asarray([prompt + res.tokens]))
        logp = jax.nn.log_softmax(logits[0, len(prompt) - 1 : -1])
        want = np.take_along_axis(np.asarray(logp), np.asarray(res.tokens)[:, None], 1)[:, 0]
        np.testing.assert_allclose(res.logprobs, want, atol=2e-5)
