r"""GRPO on mini-SWE with a tiny Qwen3, on a laptop or CI (2 CPU cores).

Command (what `make run` does):

    python -m experiments.swe_grpo --config=configs/cpu.py --workdir=runs/cpu

What to expect: a supervised warm start on scripted demonstrations (cached in
the workdir, ~2-3 min), then GRPO steps of a few seconds each with the
embedded engine in its own process, real bubblewrap-sandboxed tool calls and
pytest verifiers; mean reward rises by >= 0.2 between the first and last five
steps; the final policy is exported to runs/cpu/final/.

Variants (`--config=configs/cpu.py:VARIANT`):
  smoke   one small step in under 30 s (2 groups x 2 members, short warm start)
"""

from __future__ import annotations

from configs.common import get_base_config


def get_config(arg: str | None = None):
    c = get_base_config()
    c.num_steps = 40
    c.schedule = "stream"
    c.rl.num_groups = 4
    c.rl.group_size = 4
    c.optim.learning_rate = 3e-4
    c.env.family = "mini_swe"
    c.env.difficulty = "easy"
    c.env.num_tasks = 16
    c.checkpoint.every = 5
    if arg == "smoke":
        c.num_steps = 1
        c.rl.num_groups = 2
        c.rl.group_size = 2
        c.rollout.max_turns = 6
        c.rollout.max_traj_tokens = 1536
        c.sft.steps = 20
        c.env.num_tasks = 4
        c.checkpoint.every = 1
    elif arg not in (None, ""):
        raise ValueError(f"configs/cpu.py: unknown variant {arg!r}; valid: smoke")
    return c
