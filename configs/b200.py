"""SWE GRPO with a 27B-class dense Qwen3 on one 8x B200 node (180 GB per GPU).

    python -m experiments.swe_grpo --config=configs/b200.py \
        --config.env.dataset=/data/swe-smith.parquet --config.env.images=/data/images \
        --config.eval.dataset=/data/swe-bench-verified.parquet      # LoRA (default)
    python -m experiments.swe_grpo --config=configs/b200.py:full ...  # full fine-tuning

Data (the paper's GRPO setting): training tasks are SWE-smith rows (`env.dataset`: the
published parquet, a save_to_disk directory, or hf:SWE-bench/SWE-smith:train from the HF
cache with HF_HUB_OFFLINE=1); each row's `image_name` is found in the image store
`env.images` (`python -m thundersync_jax.envs.images import IMAGE.tar --store DIR` for each
`docker save`d image). Without `env.dataset` the run stops with an error before anything
starts (no fallback to generated tasks); a row that is malformed or whose image is missing
is named in one error, also before anything starts. Every 10 steps the policy is scored
on SWE-bench-format tasks (`eval.dataset`, e.g. SWE-bench Verified, images by the SWE-bench
harness's names in the same store): `eval_pass@1`, `eval_pass@3`, and `time_to_target_s` /
`gpu_hours_to_target` once pass@3 reaches `eval.target` (the paper: 74.01%).

Model: Qwen3-32B's attention and width (hidden 5120, 64 layers, 64 query / 8 key-value heads
of 128, vocabulary 151936, untied head) with an MLP of 19456: 26.7B parameters (Qwen3-32B's
25600 would be 32.8B, too large for full fine-tuning on half an H200 node); bf16, remat, the
64 layers under one `lax.scan` (`model.scan_layers`: one compiled layer body; the forward
stacks a copy of the layer weights and the backward a stacked gradient, 2 x 12.6 GB per GPU).
Point `--config.model.checkpoint=DIR` at an HF Qwen3 directory to start from real weights: its
config.json sets the architecture, its tokenizer (and chat template) replaces the byte tokenizer
(`tokenizer.kind="auto"`), the weights are read shard by shard onto the learner mesh in
`model.param_dtype`, and the SFT warm start is skipped (`sft.on_checkpoint=False`).

Check a recipe without GPUs (compiles the score-gradient chunk and the optimizer update at
these shapes and shardings on fake CPU devices, from abstract params; prints the planner's
per-device GB; exit 0 when it fits; BENCHMARKS.md "Long sequences" has the compile times):

    python -m experiments.swe_grpo --config=configs/b200.py:full --dry_run

Node split (`c.node`): rollout engines and the learner run at the same time on disjoint GPUs, so
gradient streaming overlaps the learner's backward passes with the rollouts.
  lora: 4 rollout GPUs (tensor parallel 4) + 4 learner GPUs (mesh fsdp=1 x tp=4). Params
        16.4 GB/GPU; adapters, their grads, Adam state and 1 + 2·8 open-group tallies are a
        few GB; trajectories up to 64k tokens per chunk (blockwise / flash attention and
        tiled log-probs: ~56 GB of activations at 65,536 tokens). Stream schedule.
  full: 4 rollout GPUs + 4 learner GPUs (mesh fsdp=1 x tp=4). bf16 params 13.4 GB/GPU, one
        f32 gradient 26.7 GB, its w·h staged for the host copy 26.7 GB, Adam 53.4 GB;
        per-open-group f32 tallies (2 x 26.7 GB per GPU
        for each open group) do not fit on the GPUs, so the tallies live in host memory
        (`accum.placement="host"`, as the paper's accumulators): 1 + 2·8 tallies of 106.8 GB
        = 1.82 TB of the node's 2 TB (DGX B200), plus the 53 GB /dev/shm weight snapshot;
        64k-token chunks whose 64 layer inputs (172 GB for the 4 GPUs) wait in host memory
        (`model.remat_offload`), so the stream schedule keeps 7 open groups (1 + 2·7
        tallies). Each chunk copies its w·h (26.7 GB per GPU) to host memory;
        docs/scale_out.md has what that costs per chunk.
        `--config.accum.placement=device --config.schedule=group` is the all-on-GPU fallback
        (no open groups: a group's backward passes start once its rewards are in).
Expect (`python -m thundersync_jax.learner.memory --config=configs/b200.py[:full]` prints the
table): lora ≈ 117 GB and full ≈ 159 GB of the 162 GB usable per learner GPU (each with the
25 GB of scanned-layer copies); full ≈ 1.83 TB
of the 1.95 TB of host memory budgeted per learner process.
Step time depends on rollout length; the learner is idle for less than the rollout tail.
"""

from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ("lora", "full")
# Chunk lengths up to agent-length trajectories: blockwise / flash attention and tiled log-probs
# keep a chunk's working set linear in its length (`learner.activations`).
LONG_BUCKETS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def qwen3_27b_model() -> ml_collections.ConfigDict:
    """A 27B-class dense Qwen3 (HF config.json fields) in bf16 with per-layer remat.

    Qwen3-32B's attention and width (hidden 5120, 64 layers, 64 query / 8 key-value heads of
    128, vocabulary 151936, untied head) with an MLP of 19456: 26.7B parameters.
    """
    model = common.tiny_qwen3_model()
    model.update(
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=19456,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        dtype="bfloat16",
        param_dtype="bfloat16",
        remat=True,
        # One compiled layer body instead of 64 (minutes of compile); costs a stacked copy of
        # the layer weights and their gradient per step (the planner's "scanned layers" row).
        scan_layers=True,
        attention_block=512,  # blockwise tile on a GPU (the tiny CPU model's is 256)
    )
    return model


def node_config(gpu: str, gpu_memory_gb: float, variant: str) -> ml_collections.ConfigDict:
    """The full run config for one 8-GPU node of `gpu`, variant 'lora' or 'full'."""
    if variant not in VARIANTS:
        raise ValueError(f"config variant {variant!r} is not one of {VARIANTS}")
    c = common.get_base_config()
    c.model = qwen3_27b_model()
    c.rl.num_groups = 8
    c.rl.group_size = 8
    c.rl.max_open_groups = 8
    c.rollout.engine = "vllm"
    c.rollout.max_batch = 64
    c.rollout.max_turns = 30
    c.rollout.max_new_tokens_per_turn = 1024
    c.rollout.max_traj_tokens = 65536  # agent-length trajectories
    c.env.family = "swe_dataset"
    c.env.dataset = ""  # required: --config.env.dataset=<SWE-smith rows>
    c.env.images = ""  # the image store holding every row's image_name
    c.env.num_tasks = 1_000_000  # every row (SWE-smith has ~37k)
    c.env.sandbox_timeout_s = 300.0
    c.env.sandbox_memory_mb = 8192
    c.eval.update(every_steps=10, dataset="", num_tasks=500, k=3, temperature=1.0)
    c.eval.target = 0.7401  # the paper's pass@3 on SWE-bench Verified
    c.learner.seq_buckets = LONG_BUCKETS
    # DGX B200 and DGX H200: 2 TB of system memory, 5% (102 GB) of it left to the OS, the
    # engine processes and page cache; host-resident tallies live in the rest. One rollout
    # engine, tensor parallel over the 4 rollout GPUs; the learner on the other 4.
    c.node = common.gpu_node(gpu=gpu, gpu_memory_gb=gpu_memory_gb, host_memory_gb=2048.0)
    c.mesh.fsdp, c.mesh.tp = 1, 4
    if variant == "lora":
        c.lora.enabled = True
        c.lora.rank = 16
        c.lora.alpha = 32.0
        c.lora.publish = "merged"  # vLLM loads full weights (merged in the learner per step)
        c.optim.learning_rate = 1e-5
    else:
        c.lora.enabled = False
        c.accum.placement = "host"  # open-group tallies do not fit the GPUs: see the docstring
        # The 64 layer inputs of a 65,536-token chunk (43 GB per GPU) wait in host memory.
        c.model.remat_offload = True
        # ... beside 1 + 2·7 host tallies (172 GB of offloaded inputs leave room for 7 open
        # groups of the 8, not 8).
        c.rl.max_open_groups = 7
        c.optim.learning_rate = 1e-6
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`configs/b200.py` (LoRA) or `configs/b200.py:full`."""
    return node_config("B200", 180.0, arg or "lora")
