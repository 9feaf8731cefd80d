"""On-policy distillation on terminal tasks on one 8x B200 node: student, teacher, tasks.

    python -m experiments.terminal_opd --config=configs/b200_opd.py \\
        --config.model.checkpoint=/models/Qwen3-8B --config.teacher.checkpoint=/models/Qwen3-32B \\
        --config.env.dataset=/data/seta-env/tasks --config.env.images=/data/images \\
        --config.eval.dataset=/data/terminal-bench-2/tasks

The paper's OPD setting: a Qwen3-8B-class student learns from a larger teacher's per-token
log-probabilities on its own trajectories through terminal tasks. Tasks are published task
directories (`env.family="terminal_bench"`: Terminal-Bench 2's task.toml / instruction.md /
tests/test.sh / solution/solve.sh layout, in which harbor's registry publishes SETA-Env
(`seta-env@1.0`), or Terminal-Bench 1's task.yaml / run-tests.sh); each task's image
(task.toml's docker_image, else `<task>:latest`) is found by name in the image store
`env.images` (`python -m thundersync_jax.envs.images import IMAGE.tar --store DIR`).
Missing `env.dataset` is an error before anything starts (no generated tasks on this
recipe), as is any task whose image the store lacks. Every 10 steps the student plays
held-out Terminal-Bench tasks (`eval.dataset`): `eval_pass@1`, `eval_pass@3`.

Placement (`c.node`, rollout/engine_cmd.py): GPUs 0-1 the student's vLLM engine (tensor
parallel 2), GPUs 2-3 two teacher engines (one GPU each: a 32B teacher in bf16 is 66 GB of
a B200's 180 GB), GPUs 4-7 the learner (mesh tp=4; full fine-tuning of the 8B student:
bf16 params 4 GB/GPU, f32 gradient 8 GB, Adam 16 GB, 16 open trajectories' KV caches of up
to 8k tokens 58 GB: 108.6 of 162 GB usable, `python -m thundersync_jax.learner.memory
--config=configs/b200_opd.py`).
Check without GPUs (not run yet for this recipe):
`python -m experiments.terminal_opd --config=configs/b200_opd.py --dry_run`.
"""

from __future__ import annotations

import ml_collections

from configs import b200, terminal_opd_cpu


def qwen3_8b_model() -> ml_collections.ConfigDict:
    """Qwen3-8B's architecture (HF config.json fields), bf16 with per-layer remat."""
    model = b200.qwen3_27b_model()
    model.update(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    return model


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, ""):
        raise ValueError(f"configs/b200_opd.py has no variant {arg!r}")
    c = b200.node_config("B200", 180.0, "full")
    c.model = qwen3_8b_model()
    c.rl.algorithm = "opd"
    c.rl.loss_agg = "token-mean"
    c.rl.opd_granularity = "turn"
    c.rl.num_groups, c.rl.group_size = 16, 4
    # Each open trajectory keeps its learner KV cache (8k tokens: 3.6 GB/GPU); 16 at once fit.
    c.rl.max_open_trajectories = 16
    c.schedule, c.accum.placement = "stream", "device"
    c.optim.learning_rate = 1e-6
    c.rollout.max_turns = 40
    c.rollout.max_new_tokens_per_turn = 1024
    c.rollout.max_traj_tokens = 8192
    c.learner.seq_buckets = (1024, 2048, 4096, 8192)
    c.env.family = "terminal_bench"
    c.env.dataset = ""  # required: --config.env.dataset=<task directories>
    c.env.images = ""
    c.env.num_tasks = 1_000_000  # every task (SETA-Env has 4,333)
    c.eval.update(every_steps=10, dataset="", num_tasks=89, k=3, temperature=1.0, target=0.0)
    c.teacher = terminal_opd_cpu.get_config().teacher
    c.teacher.model = b200.qwen3_27b_model()  # the shape; teacher.checkpoint sets the weights
    c.teacher.num_engines = 2
    c.teacher.max_batch = 32
    c.node.update(rollout_gpus=2, rollout_tp=2, teacher_gpus=2, teacher_tp=1, learner_gpus=4)
    c.rollout.num_engines = 1
    c.mesh.fsdp, c.mesh.tp = 1, 4
    return c
