r"""GRPO with gradient streaming: `thundersync_jax.train.run` for rl.algorithm=grpo.

    python -m experiments.swe_grpo --config=configs/cpu.py --workdir=runs/cpu \
        [--config.schedule=sync|group|stream|async] [--config.num_steps=N] [--config.seed=S] \
        [--config.env.family=mini_swe|swe_jsonl|terminal]

Writes DIR/metrics.jsonl, DIR/checkpoints/, DIR/final/ (HF safetensors) and
timeline pictures; rerunning the same command after a crash resumes.
"""

from experiments._entry import run_entry_point

if __name__ == "__main__":
    run_entry_point("grpo", "runs/swe_grpo")
