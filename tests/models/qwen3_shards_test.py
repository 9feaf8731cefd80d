"""Safetensors read shard by shard straight into NamedShardings (8 fake CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from thundersync_jax.models import qwen3, sharding
from thundersync_jax.models.qwen3 import _shards

# Divisible where the default rules shard on a 4 x 2 mesh; otherwise distinct sizes.
CFG = qwen3.Qwen3Config(
    vocab_size=58,
    hidden_size=20,
    intermediate_size=46,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=6,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt"))
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(3))
    qwen3.save_pretrained(model, path)
    return path


def _shardings(param_dtype=jnp.float32):
    abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(CFG, param_dtype=param_dtype, rngs=nnx.Rngs(0))),
        nnx.Param,
    )[1]
    mesh = sharding.make_mesh(4, 2)
    return sharding.param_shardings(abstract, sharding.DEFAULT_RULES, mesh)


def test_each_param_lands_on_its_spec_with_the_checkpoint_values(checkpoint):
    shardings = _shardings()
    params = _shards.load_sharded_params(checkpoint, CFG, shardings, jnp.float32)
    reference = nnx.split(qwen3.from_pretrained(checkpoint), nnx.Param)[1]
    layer = params["layers"][1]
    got = {
        "q": layer["self_attn"]["q_proj"]["kernel"].get_value(),
        "o": layer["self_attn"]["o_proj"]["kernel"].get_value(),
        "down": layer["mlp"]["down_proj"]["kernel"].get_value(),
        "embed": params["embed_tokens"]["embedding"].get_value(),
        "head": params["lm_head"]["kernel"].get_value(),
    }
    assert got["q"].sharding.spec == P("fsdp", "tp", None)
    assert got["o"].sharding.spec == P("tp", None, "fsdp")
    assert got["down"].sharding.spec == P("tp", "fsdp")
    assert got["embed"].sharding.spec == P("tp", "fsdp")
    assert got["head"].sharding.spec == P("fsdp", "tp")
    # each device holds only its block: q's [20, 4, 6] splits into [5, 2, 6]
    assert {s.data.shape for s in got["q"].addressable_shards} == {(5, 2, 6)}
    specs = jax.tree.leaves(shardings)
    for (path, a), b, s in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(reference), specs, strict=True
    ):
        assert a.sharding == s, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


def test_bfloat16_checkpoint_loads_in_the_asked_dtype(tmp_path, checkpoint):
    bf16 = str(tmp_path / "bf16")
    model = qwen3.from_pretrained(checkpoint, param_dtype=jnp.bfloat16)
    qwen3.save_pretrained(model, bf16)
    views = _shards.tensor_views(bf16)
    assert views["model.embed_tokens.weight"].dtype == jnp.bfloat16  # BF16 on disk
    params = _shards.load_sharded_params(bf16, CFG, _shardings(jnp.bfloat16), jnp.bfloat16)
    leaves = jax.tree.leaves(params)
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
    ref = nnx.split(model, nnx.Param)[1]
    for a, b in zip(leaves, jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_wrong_tensors_are_named_before_reading(tmp_path, checkpoint):
    other = qwen3.Qwen3Config(**{**CFG.__dict__, "intermediate_size": 48})
    with pytest.raises(ValueError, match=r"mlp.gate_proj.weight has shape \(46, 20\)"):
        _shards.load_sharded_params(checkpoint, other, _shardings(), jnp.float32)
    tied = qwen3.Qwen3Config(**{**CFG.__dict__, "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        _shards.load_sharded_params(checkpoint, tied, _shardings(), jnp.float32)
    with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
        _shards.tensor_views(str(tmp_path))
