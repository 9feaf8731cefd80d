"""SWE GRPO with a 27B-class dense Qwen3 on one 8x H200 node (141 GB per GPU).

    python -m experiments.swe_grpo --config=configs/h200.py          # LoRA (default)
    python -m experiments.swe_grpo --config=configs/h200.py:full     # full fine-tuning

Same model and RL settings as configs/b200.py (26.7B parameters, bf16, per-layer remat);
only the memory budget differs (127 GB usable per GPU after 10% runtime headroom).
  lora: 4 rollout GPUs (one engine, tensor parallel 4) + 4 learner GPUs (mesh fsdp=1 x tp=4),
        stream schedule with up to 8 open groups, chunks up to 16k tokens.
  full: 4 rollout + 4 learner GPUs (mesh 1 x 4): f32 gradient, one global f32 tally and f32
        Adam moments of 26.7B params take ~107 GB per learner GPU, so there is no room for
        open-group tallies (group schedule) and chunks stop at 4k tokens.
Print the plan with `python -m thundersync_jax.learner.memory --config=configs/h200.py:full`.
"""

from __future__ import annotations

import ml_collections

from configs import b200


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`configs/h200.py` (LoRA) or `configs/h200.py:full`."""
    c = b200.node_config("H200", 141.0, arg or "lora")
    if c.lora.enabled:
        return c
    c.rollout.max_traj_tokens = 4096
    c.learner.seq_buckets = (1024, 2048, 4096)
    return c
