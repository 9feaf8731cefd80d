"""Memory planner: the GPU configs fit, and its counts match the real model, sharding and LoRA."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs import b200, common, h200
from thundersync_jax.learner import memory
from thundersync_jax.models import lora, qwen3, sharding


@pytest.mark.parametrize("module", [b200, h200])
@pytest.mark.parametrize("variant", ["lora", "full"])
def test_gpu_configs_fit(module, variant):
    plan = memory.plan(module.get_config(variant))
    assert plan.fits, plan.table()
    assert 20e9 < plan.num_params < 30e9  # 27B class
    assert (plan.trainable_params < 1e9) == (variant == "lora")


def test_full_stream_with_open_group_tallies_does_not_fit_on_b200():
    c = b200.get_config("full")
    c.accum.placement = "device"  # 1 + 2·7 param-sized float32 tallies on the GPUs
    plan = memory.plan(c)
    assert c.schedule == "stream" and plan.open_group_tallies == 14 and not plan.fits


def test_full_b200_keeps_7_open_groups_with_host_tallies_and_offloaded_layer_inputs():
    c = b200.get_config("full")
    plan = memory.plan(c)
    assert c.schedule == "stream" and c.accum.placement == "host"
    assert plan.open_group_tallies == 2 * 7 and plan.fits, plan.table()
    assert plan.tallies == 0 and plan.staging == plan.grads  # the w·h copy is staged on device
    # 15 tallies of every trainable param, f32, for the process's 4 devices: 1.6 TB of host,
    # beside 64 layer inputs of a 65,536-token chunk per device (bf16, remat_offload).
    assert plan.host_tallies == 15 * 4 * plan.grads
    assert plan.host_activations == 4 * 64 * 65536 * 5120 * 2
    assert 1.5e12 < plan.host_total < plan.host_capacity < 2048e9
    c.node.host_memory_gb = 1024.0  # a node with 1 TB of host memory cannot hold them
    assert not memory.plan(c).fits


def _tiny_config(fsdp, tp, lora_enabled=False):
    c = common.get_base_config()
    c.model.update(vocab_size=52, hidden_size=20, intermediate_size=44, num_attention_heads=8)
    c.model.update(num_key_value_heads=4, head_dim=6, num_hidden_layers=3)
    c.mesh.fsdp, c.mesh.tp = fsdp, tp
    c.lora.enabled, c.lora.rank = lora_enabled, 3
    c.rl.max_open_groups = 3
    c.rollout.max_traj_tokens = 100
    c.node = common.gpu_node(
        gpu="cpu",
        num_gpus=8,
        gpu_memory_gb=1.0,
        memory_headroom=1.0,
        rollout_gpus=8 - fsdp * tp,
        rollout_tp=1,
        learner_gpus=fsdp * tp,
    )
    return c


@pytest.mark.parametrize("fsdp, tp", [(2, 4), (4, 2)])
def test_param_bytes_match_real_shards_on_the_mesh(fsdp, tp):
    """Per-device param bytes equal the shard sizes jax actually places on one device."""
    c = _tiny_config(fsdp, tp)
    plan = memory.plan(c)
    cfg = qwen3.Qwen3Config.from_config_dict(c.model)
    abstract = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param)[1]
    shardings = sharding.param_shardings(
        abstract, sharding.DEFAULT_RULES, sharding.make_mesh(fsdp, tp)
    )
    local = sum(
        int(np.prod(s.shard_shape(x.shape)))
        for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
    )
    assert plan.num_params == sum(x.size for x in jax.tree.leaves(abstract))
    assert plan.params == 4 * local
    # Full fine-tuning: h, 2 Adam moments and 1 + 2·3 tallies, all float32 and sharded alike.
    assert plan.grads == 4 * local
    assert plan.optimizer == 8 * local
    assert plan.tallies == 7 * 4 * local
    assert plan.chunk_tokens == 128


def test_lora_counts_match_real_adapters():
    c = _tiny_config(2, 4, lora_enabled=True)
    plan = memory.plan(c)
    cfg = qwen3.Qwen3Config.from_config_dict(c.model)
    abstract = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param)[1]
    adapters = jax.eval_shape(lambda p: lora.init(p, rank=3, alpha=6.0), abstract)
    n = lora.num_params(adapters)
    assert plan.trainable_params == n
    assert plan.grads == 4 * n and plan.optimizer == 8 * n and plan.tallies == 7 * 4 * n


def test_activations_shrink_with_remat_and_grow_quadratically_on_the_naive_paths():
    m = b200.get_config().model
    m.attention_impl, m.logits_tile = "naive", 0
    long = memory.activation_bytes(m, rows=1, tokens=8192, tp=4, remat=False)
    assert memory.activation_bytes(m, 1, 8192, 4, remat=True) < long / 10
    short = memory.activation_bytes(m, rows=1, tokens=4096, tp=4, remat=False)
    assert 2 < long / short < 4  # linear terms plus the [T, T] attention scores


def test_activations_grow_linearly_on_the_long_paths():
    m = b200.get_config().model  # blockwise / flash attention, tiled log-probs
    for remat in (False, True):
        short = memory.activation_bytes(m, rows=1, tokens=16384, tp=4, remat=remat)
        long = memory.activation_bytes(m, rows=1, tokens=65536, tp=4, remat=remat)
        assert long / short <= 4.05
    m.remat_offload = True  # the layer inputs are counted in host memory instead
    assert memory.activation_bytes(m, 1, 65536, 4, remat=True) < long - 40e9


def test_mesh_must_match_learner_gpus():
    c = _tiny_config(2, 4)
    c.node.learner_gpus = 4
    with pytest.raises(ValueError, match="learner_gpus=4"):
        memory.plan(c)


def test_segment_caches_are_planned_for_open_opd_trajectories():
    """The plan's segment bytes are what the learner's real caches hold (`Trajectory.nbytes`),
    times the open-trajectory cap; `trajectory` granularity and GRPO keep none."""
    from thundersync_jax.learner import segments

    c = _tiny_config(1, 1)
    c.node.rollout_gpus, c.node.learner_gpus = 7, 1
    assert memory.plan(c).segments == 0  # GRPO
    c.rl.algorithm = "opd"
    c.rl.max_open_trajectories = 3
    plan = memory.plan(c)
    cfg = qwen3.Qwen3Config.from_config_dict(c.model)
    graphdef = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param)[0]
    fns = segments.make_segment_fns(graphdef, cfg, cache_buckets=tuple(c.learner.seq_buckets))
    one = fns.open(int(c.rollout.max_traj_tokens)).nbytes
    assert plan.open_trajectories == 3 and plan.segments == 3 * one
    assert "segment caches (3 trajectories)" in plan.table()
    c.rl.opd_granularity = "trajectory"
    assert memory.plan(c).segments == 0
