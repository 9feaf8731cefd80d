r"""On-policy distillation on terminal tasks with a tiny Qwen3 student, on CPU (2 cores).

Command:

    python -m experiments.terminal_opd --config=configs/terminal_opd_cpu.py --workdir=runs/opd

What to expect: two supervised warm starts on the scripted terminal demonstrations, cached
in the workdir — the student (2 layers, 60 steps) and a larger, longer-trained teacher
(3 layers, 400 steps; together ~5-8 min the first time) — then OPD steps of ~15-40 s: the
student's episodes run in its engine process with sandboxed bash tool calls, every sampled
turn is scored by the teacher in its own engine process while the tool call runs, and the
learner streams per-turn gradients. `reverse_kl` in metrics.jsonl (the sampled-token estimate
of KL(student ‖ teacher)) falls over the steps; `learner_idle_frac` is well below the sync
schedule's (`--config.schedule=sync`).

Use a Qwen3 HF checkpoint as the teacher with `--config.teacher.checkpoint=DIR` (same
tokenizer as the student).

Variants (`--config=configs/terminal_opd_cpu.py:VARIANT`):
  smoke   one or two small steps in about a minute (2 groups x 2 members, short warm starts)
"""

from __future__ import annotations

import ml_collections

from configs.common import get_base_config, tiny_qwen3_model

VARIANTS = (None, "smoke")

# replace_in_files demonstrations exceed 1024 byte tokens at every difficulty.
SHORT_FAMILIES = (
    "find_by_name",
    "find_by_content",
    "count_matching",
    "top_words",
    "organize_by_extension",
    "csv_sum",
)


def teacher_model() -> ml_collections.ConfigDict:
    """The embedded teacher: the student's vocabulary, a larger network."""
    m = tiny_qwen3_model()
    m.hidden_size = 96
    m.intermediate_size = 256
    m.num_hidden_layers = 3
    m.num_attention_heads = 6
    m.num_key_value_heads = 2
    return m


def get_config(arg: str | None = None):
    c = get_base_config()
    c.num_steps = 10
    c.schedule = "stream"
    c.rl.algorithm = "opd"
    c.rl.loss_agg = "token-mean"  # OPD: −(1/N) Σ over the batch's scored tokens
    c.rl.num_groups = 2
    c.rl.group_size = 2
    c.optim.learning_rate = 3e-4
    c.rollout.max_batch = 8
    c.rollout.max_turns = 5
    c.rollout.max_new_tokens_per_turn = 96
    c.rollout.max_traj_tokens = 1024
    c.learner.seq_buckets = (128, 256, 512, 1024)
    c.env.family = "terminal"
    c.env.difficulty = "easy"
    c.env.num_tasks = 12
    c.env.terminal_families = SHORT_FAMILIES
    c.sft.steps = 40
    c.checkpoint.every = 5
    c.teacher = ml_collections.ConfigDict(
        dict(
            checkpoint="",  # a Qwen3 HF directory; empty = the embedded teacher below
            model=teacher_model(),
            sft_steps=120,
            sft_learning_rate=3e-3,
            max_batch=8,  # turns per teacher score call
            num_engines=1,
        )
    )
    if arg == "smoke":
        c.num_steps = 2
        c.rollout.max_turns = 4
        c.rollout.max_new_tokens_per_turn = 32
        c.env.num_tasks = 4
        c.sft.steps = 4
        c.teacher.sft_steps = 8
        c.checkpoint.every = 1
        c.metrics.timeline_every = 1
        c.metrics.tensorboard = False
    elif arg not in (None, ""):
        raise ValueError(f"configs/terminal_opd_cpu.py: unknown variant {arg!r}; valid: smoke")
    return c
