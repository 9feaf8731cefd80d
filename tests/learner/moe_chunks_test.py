"""The score-gradient chunk on a MoE policy: routing replay and routing_disagreement.

Replaying the learner's own routes is the plain forward; replaying other routes changes the
gradient under `replay` but not under `recompute`; the disagreement counts exactly the
token x layer sets that were changed (padding and -1 "none reported" rows excluded).
"""

import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.learner import chunks

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
)
from moe_models import GLM, GLM_SLOW, QWEN, random_model  # noqa: E402  (tiny random MoE models)


def _max_diff(a, b):
    return max(
        float(np.abs(x - y).max())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("cfg", [QWEN, GLM_SLOW], ids=["qwen3_moe", "glm4_moe_lite"])
def test_replay_and_recompute_and_disagreement(cfg):
    model = random_model(cfg, seed=6)
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    mask = np.ones((2, 12), np.float32)
    mask[:, 0] = 0
    own = np.asarray(model.hidden_states(tokens, return_routes=True)[2])  # [2, 12, M, K]
    fns = {
        r: chunks.make_score_grad_fn(graphdef, (16,), routing=r) for r in ("replay", "recompute")
    }
    plain, n, _ = fns["replay"].score_and_gap(params, tokens, mask, None, None)
    h_own, _, gap = fns["replay"].score_and_gap(params, tokens, mask, None, None, routes=own)
    # The same math in another program (float32 summation order: measured 0 to 1.3e-5 by XLA
    # flags), against > 1 when the routes differ.
    assert _max_diff(h_own, plain) < 1e-4
    # every given (token, layer) set is compared (own routes cover all 12 tokens); none differ.
    assert (float(gap["route_differ"]), float(gap["route_sets"])) == (0.0, 2 * 12 * own.shape[2])

    other = own.copy()
    # one token x layer set changed: its first expert swapped for one it did not have...
    other[0, 3, 0, 0] = next(e for e in range(cfg.moe.num_experts) if e not in own[0, 3, 0])
    other[1, 5:] = -1  # ...and row 1 reports no routes from token 5 on
    h_rep, _, gap = fns["replay"].score_and_gap(params, tokens, mask, None, None, routes=other)
    h_rec, _, gap_rec = fns["recompute"].score_and_gap(
        params, tokens, mask, None, None, routes=other
    )
    sets = (12 + 5) * own.shape[2]
    assert (float(gap["route_differ"]), float(gap["route_sets"])) == (1.0, sets)
    assert (float(gap_rec["route_differ"]), float(gap_rec["route_sets"])) == (1.0, sets)
    assert _max_diff(h_rec, plain) < 1e-4  # recompute ignores the given routes
    assert _max_diff(h_rep, plain) > 1e-2  # replay used them (measured 1.08 and 4.83)


def test_adamw_weight_decay_leaves_the_router_correction_bias_alone():
    """A zero gradient with weight decay: every param shrinks except the correction bias."""

    from configs import common
    from thundersync_jax.learner import train_state

    cfg = common.get_base_config().optim  # the base defaults, then this test's values
    cfg.update(name="adamw", learning_rate=0.1, b1=0.9, b2=0.999, weight_decay=0.5)
    cfg.max_grad_norm = 0.0
    model = random_model(GLM, seed=1)
    _, params = nnx.split(model, nnx.Param)
    opt = train_state.make_optimizer(cfg)
    zeros = jax.tree.map(np.zeros_like, params)
    updates, _ = opt.update(zeros, opt.init(params), params)
    gate = nnx.to_pure_dict(updates)["layers"][1]["mlp"]["gate"]
    assert np.abs(np.asarray(gate["e_score_correction_bias"])).max() == 0
    assert np.abs(np.asarray(gate["kernel"])).max() > 0  # decayed
