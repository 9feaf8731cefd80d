"""SWE GRPO with a 27B-class dense Qwen3 on one 8x H200 node (141 GB per GPU).

    python -m experiments.swe_grpo --config=configs/h200.py          # LoRA (default)
    python -m experiments.swe_grpo --config=configs/h200.py:full     # full fine-tuning

Same model and RL settings as configs/b200.py (26.7B parameters, bf16, per-layer remat);
only the memory budget differs (127 GB usable per GPU after 10% runtime headroom).
  lora: 4 rollout GPUs (one engine, tensor parallel 4) + 4 learner GPUs (mesh fsdp=1 x tp=4),
        stream schedule with up to 8 open groups, chunks up to 64k tokens (~117 GB per GPU
        with the scanned layers' 25 GB of stacked copies, configs/b200.py).
  full: 3 rollout GPUs (three engines, one GPU each: 53 GB of bf16 weights leave ~70 GB of KV
        cache) + 5 learner GPUs (mesh fsdp=5 x tp=1; 5 divides every "embed" dim). bf16
        params, one f32 gradient, one global f32 tally and f32 Adam moments of 26.7B params
        are 96 GB per learner GPU, so there is no room for open-group tallies (group
        schedule); chunks up to 32k tokens (~22 GB of activations, the 64 layer inputs in
        host memory: `model.remat_offload`), ~118 GB per GPU. Its layers stay unrolled
        (`model.scan_layers=False`): the scan's stacked copies (+20 GB) would not fit, so its
        dry run compiles 64 layer bodies (minutes).
Print the plan with `python -m thundersync_jax.learner.memory --config=configs/h200.py:full`;
compile the learner at these shapes on fake CPU devices (nothing allocated) with
`python -m experiments.swe_grpo --config=configs/h200.py:full --dry_run`.

  glm_flash: GLM-4.7-Flash (`glm4_moe_lite`: 47 layers, the first dense, 64 routed experts
        top-4 + 1 shared, MLA with a 512 + 64 compressed cache; 29.9B parameters, ~3.9B
        active per token incl. embeddings), LoRA rank 8 on o_proj, the shared and every routed
        expert, routing replay. 4 rollout GPUs (one engine, tensor parallel 4) + 4 learner
        GPUs (mesh fsdp=4 x tp=1, experts split over "fsdp": 16 per GPU), stream with up to
        4 open groups, chunks up to 8k tokens.
        Point `--config.model.checkpoint` at the HF checkpoint (zai-org/GLM-4.7-Flash).
        `python -m experiments.swe_grpo --config=configs/h200.py:glm_flash --dry_run`.
"""

from __future__ import annotations

import ml_collections

from configs import b200

VARIANTS = (*b200.VARIANTS, "glm_flash")


def glm_flash_model() -> ml_collections.ConfigDict:
    """GLM-4.7-Flash's config.json shapes (transformers' Glm4MoeLiteConfig defaults) in bf16
    with per-layer remat, and the run-time keys of the `model` section."""
    # The long-sequence keys (attention path and tile, LM-head tile, offload) as the dense
    # recipe sets them: the planner and the model read every one.
    dense = b200.qwen3_27b_model()
    long_sequence = ("remat_offload", "attention_impl", "attention_block", "logits_tile")
    return ml_collections.ConfigDict(
        dict(
            **{k: dense[k] for k in long_sequence},
            model_type="glm4_moe_lite",
            vocab_size=154880,
            hidden_size=2048,
            intermediate_size=10240,
            moe_intermediate_size=1536,
            num_hidden_layers=47,
            num_attention_heads=20,
            num_key_value_heads=20,
            n_shared_experts=1,
            n_routed_experts=64,
            num_experts_per_tok=4,
            routed_scaling_factor=1.8,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            kv_lora_rank=512,
            q_lora_rank=768,
            qk_rope_head_dim=64,
            qk_nope_head_dim=192,
            v_head_dim=256,
            rope_theta=1000000.0,
            rope_interleave=True,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            attention_bias=False,
            max_position_embeddings=202752,
            checkpoint="",
            dtype="bfloat16",
            param_dtype="bfloat16",
            remat=True,
            scan_layers=False,  # the MoE decoder runs its layers unrolled
            routing="replay",
        )
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`configs/h200.py` (LoRA), `configs/h200.py:full` or `configs/h200.py:glm_flash`."""
    if arg == "glm_flash":
        c = b200.node_config("H200", 141.0, "lora")
        c.model = glm_flash_model()
        c.mesh.fsdp, c.mesh.tp = 4, 1
        c.mesh.rules = (("expert", "fsdp"),)
        # Per-expert adapters are most of LoRA's size (rank r costs r·(D+F) per expert, x3
        # projections x 64 experts x 46 layers: 0.25B adapter params at r=8), so the rank,
        # the open groups (each holds 2 adapter-sized f32 tallies) and the longest chunk
        # (materialized [T, T] scores of 20 heads and [T, 154880] logits) are sized to fit.
        c.lora.rank, c.lora.alpha = 8, 16.0
        c.rl.max_open_groups = 4
        c.rollout.max_traj_tokens = 8192
        c.learner.seq_buckets = (1024, 2048, 4096, 8192)
        return c
    c = b200.node_config("H200", 141.0, arg or "lora")
    if c.lora.enabled:
        return c
    # This recipe keeps everything on the GPUs (configs/b200.py:full moves the tallies to host).
    c.schedule, c.accum.placement = "group", "device"
    c.node.rollout_gpus, c.node.rollout_tp, c.node.learner_gpus = 3, 1, 5
    c.rollout.num_engines = 3
    c.mesh.fsdp, c.mesh.tp = 5, 1
    c.rollout.max_traj_tokens = 32768
    c.learner.seq_buckets = tuple(b for b in b200.LONG_BUCKETS if b <= 32768)
    # The 64 layer inputs of a 32,768-token chunk (21 GB per GPU) wait in host memory.
    c.model.remat_offload = True
    # Unrolled: the scanned layers' stacked copy of the weights and their gradient (+20 GB per
    # GPU) would not fit beside everything this recipe keeps on the device (138 of 127 GB).
    c.model.scan_layers = False
    return c
