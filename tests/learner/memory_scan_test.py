"""Memory planner: `model.scan_layers` adds the stacked layer weights and their gradient."""

import pytest

from configs import b200, common, h200
from thundersync_jax.learner import memory


def _tiny(tp, lora_enabled):
    c = common.get_base_config()
    c.model.update(vocab_size=52, hidden_size=20, intermediate_size=44, num_attention_heads=8)
    c.model.update(num_key_value_heads=4, head_dim=6, num_hidden_layers=3, param_dtype="bfloat16")
    c.mesh.fsdp, c.mesh.tp = 1, tp
    c.lora.enabled = lora_enabled
    c.rollout.max_traj_tokens = 100
    c.node = common.gpu_node(
        gpu="cpu", gpu_memory_gb=1.0, memory_headroom=1.0, rollout_gpus=0, rollout_tp=1,
        learner_gpus=tp,
    )  # fmt: skip
    return c


@pytest.mark.parametrize("tp, lora_enabled", [(1, False), (2, False), (2, True)])
def test_scan_counts_two_copies_of_the_layer_params(tp, lora_enabled):
    c = _tiny(tp, lora_enabled)
    d, f, q, kv, h = 20, 44, 8 * 6, 4 * 6, 6
    # Independent count: q/k/v/o, gate/up/down, two RMSNorms and the q/k norms (replicated).
    split = (d * q + 2 * d * kv + q * d + 3 * d * f) // tp
    per_layer = split + 2 * d + 2 * h
    unrolled = memory.plan(c)
    c.model.scan_layers = True
    scanned = memory.plan(c)
    assert unrolled.scan_copies == 0
    assert scanned.scan_copies == 2 * 3 * per_layer * 2  # 2 copies x 3 layers x bf16
    assert scanned.total - unrolled.total == scanned.scan_copies
    assert "scanned layers" in scanned.table()


def test_gpu_recipes_scan_where_the_copy_fits():
    # b200 (LoRA, full) and h200 LoRA afford the stacked copy; h200:full (27B over 5 GPUs,
    # everything on the device) does not, and compiles its 64 layers unrolled.
    for config in (b200.get_config("lora"), b200.get_config("full"), h200.get_config("lora")):
        assert config.model.scan_layers and memory.plan(config).fits
    full = h200.get_config("full")
    assert not full.model.scan_layers and memory.plan(full).fits
    full.model.scan_layers = True
    assert not memory.plan(full).fits
