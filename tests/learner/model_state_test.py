"""Model, params and train state made on the learner mesh in one call (8 fake CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from configs import cpu
from thundersync_jax import accumulators
from thundersync_jax.learner import model_state
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import make_apply_update
from thundersync_jax.models import qwen3


def _config(**model):
    c = cpu.get_config("smoke")
    c.optim.name = "adamw"
    c.mesh.fsdp, c.mesh.tp = 4, 2
    c.model.num_hidden_layers = 1
    c.model.update(model)
    return c


def _leaf(tree, *path):
    for key in path:
        tree = tree[key]
    return tree.get_value()


def test_bf16_params_f32_moments_all_sharded_like_the_params():
    built = model_state.build_learner_model(_config(param_dtype="bfloat16"))
    q = _leaf(built.state.params, "layers", 0, "self_attn", "q_proj", "kernel")
    assert q.dtype == jnp.bfloat16 and q.sharding.spec == P("fsdp", "tp", None)
    # adamw state: (clip, (adam(mu, nu), decay, lr)); mu and nu are float32 by choice
    moments = [
        leaf
        for leaf in jax.tree.leaves(built.state.opt_state)
        if leaf.shape == q.shape and leaf.ndim == 3
    ]
    assert len(moments) == 2
    for m in moments:
        assert m.dtype == jnp.float32 and m.sharding == q.sharding
    assert built.state.step.sharding.spec == P()
    assert built.rows.spec == P("fsdp", None)
    # accumulator tallies (float32) are laid out like the params they sum gradients of
    tallies = accumulators.grpo(num_groups=2, group_size=2).init(built.state.params)
    q_tally = _leaf(tallies.total, "layers", 0, "self_attn", "q_proj", "kernel")
    assert q_tally.dtype == jnp.float32 and q_tally.sharding == q.sharding
    # the graphdef computes in model.dtype over the stored dtype
    logits = nnx.merge(built.graphdef, built.params)(jnp.ones((1, 4), jnp.int32))
    assert logits.shape == (1, 4, 384)


def test_checkpoint_loads_in_param_dtype_and_resume_restores_into_shardings(tmp_path):
    ckpt_dir = str(tmp_path / "hf")
    c = _config()
    model = qwen3.Qwen3(qwen3.Qwen3Config.from_config_dict(c.model), rngs=nnx.Rngs(5))
    qwen3.save_pretrained(model, ckpt_dir)  # float32 on disk
    c = _config(checkpoint=ckpt_dir, param_dtype="bfloat16")
    built = model_state.build_learner_model(c)
    embed = _leaf(built.params, "embed_tokens", "embedding")
    assert embed.dtype == jnp.bfloat16 and embed.sharding.spec == P("tp", "fsdp")
    np.testing.assert_array_equal(
        np.asarray(embed, np.float32),
        np.asarray(model.embed_tokens.embedding.get_value().astype(jnp.bfloat16), np.float32),
    )
    saver = Checkpointer(str(tmp_path / "run"))
    saver.save(built.state)
    saver.close()
    ckpt = Checkpointer(str(tmp_path / "run"))
    again = model_state.build_learner_model(c, checkpointer=ckpt)
    ckpt.close()
    assert again.resumed
    for a, b in zip(jax.tree.leaves(again.state), jax.tree.leaves(built.state), strict=True):
        assert a.sharding == b.sharding and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_warm_model_is_cast_and_placed_and_the_update_donates_the_state():
    c = _config(param_dtype="bfloat16")
    warm = qwen3.Qwen3(qwen3.Qwen3Config.from_config_dict(c.model), rngs=nnx.Rngs(9))
    built = model_state.build_learner_model(c, warm_model=warm)
    down = _leaf(built.params, "layers", 0, "mlp", "down_proj", "kernel")
    assert down.dtype == jnp.bfloat16 and down.sharding.spec == P("tp", "fsdp")
    np.testing.assert_array_equal(
        np.asarray(down, np.float32),
        np.asarray(
            warm.layers[0].mlp.down_proj.kernel.get_value().astype(jnp.bfloat16), np.float32
        ),
    )
    grads = jax.tree.map(lambda x: jnp.ones(x.shape, jnp.float32), built.state.params)
    apply = make_apply_update(built.optimizer)
    new, applied, _ = apply(built.state, grads)
    assert bool(applied) and down.is_deleted()  # the old state's buffers were donated
    new_down = _leaf(new.params, "layers", 0, "mlp", "down_proj", "kernel")
    assert new_down.dtype == jnp.bfloat16 and new_down.sharding.spec == P("tp", "fsdp")


def test_lora_adapters_are_replicated_and_the_base_stays_sharded():

    c = _config()
    c.lora.enabled, c.lora.publish = True, "merged"
    built = model_state.build_learner_model(c)
    assert built.policy.base is built.params
    for leaf in jax.tree.leaves(built.state.params):
        assert leaf.sharding.spec == P()
    assert _leaf(built.params, "embed_tokens", "embedding").sharding.spec == P("tp", "fsdp")


@pytest.mark.parametrize(
    "checkpoint, steps, on_checkpoint, expected",
    [("", 200, False, 200), ("/ckpt", 200, False, 0), ("/ckpt", 200, True, 200), ("", 0, False, 0)],
)
def test_warm_start_is_off_with_a_checkpoint_unless_asked(
    checkpoint, steps, on_checkpoint, expected
):
    c = cpu.get_config()
    c.model.checkpoint, c.sft.steps, c.sft.on_checkpoint = checkpoint, steps, on_checkpoint
    assert model_state.warm_start_steps(c) == expected
