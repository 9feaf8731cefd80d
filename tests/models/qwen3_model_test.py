"""Model structure: logical axis names, plain-pytree use, padding, remat, dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.models import qwen3


@pytest.fixture(scope="module")
def cfg(tiny_qwen3_config):
    return tiny_qwen3_config()


@nnx.jit
def _forward(model, ids, mask):
    return model(ids, attention_mask=mask)


@jax.jit
def _plain_forward(graphdef, params, ids, mask):
    """Plain-pytree use: the parameters travel as a pytree and are merged inside the function."""
    return nnx.merge(graphdef, params)(ids, attention_mask=mask)


LOGICAL_AXES = {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm"}


def test_every_param_has_logical_axes_of_its_rank(cfg):
    model = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    for path, param in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = param.get_metadata()["out_sharding"]
        assert len(names) == len(param.get_value().shape), path
        assert set(names) <= LOGICAL_AXES, (path, names)
    q = specs["layers"][0]["self_attn"]["q_proj"]["kernel"]
    assert tuple(q.get_value()) == ("embed", "q_heads", "head_dim")
    assert tuple(specs["lm_head"]["kernel"].get_value()) == ("embed", "vocab")


def test_padding_and_other_rows_do_not_change_a_rows_logits(cfg, random_qwen3):
    model = random_qwen3(cfg, seed=1)
    seq = np.array([[3, 14, 15, 92, 65, 35]], np.int32)
    alone = _forward(model, seq, seq >= 0)
    batch = np.array([[0, 0, 3, 14, 15, 92, 65, 35], [3, 14, 15, 92, 65, 35, 0, 0]], np.int32)
    mask = batch != 0
    graphdef, params = nnx.split(model, nnx.Param)
    logits = _plain_forward(graphdef, params, batch, mask)
    assert logits.shape == (2, 8, 97) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits[0, 2:], alone[0], atol=2e-5)
    np.testing.assert_allclose(logits[1, :6], alone[0], atol=2e-5)
    assert np.isfinite(np.asarray(logits)).all()  # padded queries see nothing, but no NaN


def test_remat_gives_the_same_gradient(cfg, random_qwen3):
    ids = jnp.array([[5, 7, 11, 13, 17]], jnp.int32)

    def grad_of(remat):
        model = random_qwen3(cfg, seed=2)
        model.remat = remat
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p):
            logits = nnx.merge(graphdef, p)(ids)
            return -jnp.mean(jax.nn.log_softmax(logits)[0, :-1, :].max(-1))

        return jax.jit(jax.grad(loss))(params)

    for a, b in zip(jax.tree.leaves(grad_of(False)), jax.tree.leaves(grad_of(True)), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_bf16_compute_keeps_float32_logits_and_param_dtype(cfg, random_qwen3):
    model = random_qwen3(cfg, seed=3, dtype=jnp.bfloat16)
    ref = random_qwen3(cfg, seed=3)
    assert model.embed_tokens.embedding[...].dtype == jnp.bfloat16
    ids = jnp.array([[1, 2, 3, 4, 5, 6]], jnp.int32)  # the padding test's shape: no new compile
    logits, want = _forward(model, ids, ids >= 0), _forward(ref, ids, ids >= 0)
    assert logits.dtype == jnp.float32
    assert float(jnp.abs(logits - want).max()) < 0.05 * float(jnp.abs(want).max())
