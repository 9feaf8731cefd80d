"""SWE GRPO with a 27B-class dense Qwen3 on one 8x H200 node (141 GB per GPU).

    python -m experiments.swe_grpo --config=configs/h200.py          # LoRA (default)
    python -m experiments.swe_grpo --config=configs/h200.py:full     # full fine-tuning

Same model and RL settings as configs/b200.py (26.7B parameters, bf16, per-layer remat);
only the memory budget differs (127 GB usable per GPU after 10% runtime headroom).
  lora: 4 rollout GPUs (one engine, tensor parallel 4) + 4 learner GPUs (mesh fsdp=1 x tp=4),
        stream schedule with up to 8 open groups, chunks up to 64k tokens (~92 GB per GPU).
  full: 3 rollout GPUs (three engines, one GPU each: 53 GB of bf16 weights leave ~70 GB of KV
        cache) + 5 learner GPUs (mesh fsdp=5 x tp=1; 5 divides every "embed" dim). bf16
        params, one f32 gradient, one global f32 tally and f32 Adam moments of 26.7B params
        are 96 GB per learner GPU, so there is no room for open-group tallies (group
        schedule); chunks up to 32k tokens (~22 GB of activations, the 64 layer inputs in
        host memory: `model.remat_offload`), ~118 GB per GPU.
Print the plan with `python -m thundersync_jax.learner.memory --config=configs/h200.py:full`;
compile the learner at these shapes on fake CPU devices (nothing allocated) with
`python -m experiments.swe_grpo --config=configs/h200.py:full --dry_run`.
"""

from __future__ import annotations

import ml_collections

from configs import b200

VARIANTS = b200.VARIANTS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`configs/h200.py` (LoRA) or `configs/h200.py:full`."""
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
    return c
