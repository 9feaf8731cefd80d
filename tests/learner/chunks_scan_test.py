"""The learner's score-gradient chunk on a scanned-layers graphdef equals the unrolled one."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.learner import chunks
from thundersync_jax.models import qwen3


def test_score_gradient_chunk_with_scanned_layers_equals_the_loop(tiny_qwen3_config):
    cfg = tiny_qwen3_config(num_hidden_layers=3)
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    scanned = nnx.merge(graphdef, params)
    scanned.scan_layers = True
    scanned_graphdef = nnx.split(scanned, nnx.Param)[0]
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, 13)), jnp.int32)
    mask = jnp.asarray((rng.random((2, 13)) < 0.7) & (np.arange(13) > 0), jnp.float32)
    weights = jnp.asarray(rng.normal(0, 1, (2, 13)), jnp.float32)
    got = chunks.make_score_grad_fn(scanned_graphdef, (16,), remat=True)(
        params, tokens, mask, weights
    )
    want = chunks.make_score_grad_fn(graphdef, (16,), remat=True)(params, tokens, mask, weights)
    assert float(want[1]) == float(got[1])
    for g, w in zip(jax.tree.leaves(got[0]), jax.tree.leaves(want[0]), strict=True):
        assert float(jnp.max(jnp.abs(g - w))) <= 1e-6 * float(jnp.max(jnp.abs(w)))
    assert float(jnp.max(jnp.abs(jax.tree.leaves(want[0])[-1]))) > 0.0
