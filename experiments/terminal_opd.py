r"""On-policy distillation: teacher-scored turns, streamed gradients (`train.run`, opd).

    python -m experiments.terminal_opd --config=configs/terminal_opd_cpu.py --workdir=runs/opd \
        [--config.schedule=sync|group|stream|async] [--config.num_steps=N] [--config.seed=S] \
        [--config.teacher.checkpoint=HF_DIR] [--config.env.family=terminal|mini_swe|swe_jsonl]

Writes DIR/metrics.jsonl (DESIGN §6 names plus reverse_kl), DIR/checkpoints/, DIR/final/
(HF safetensors) and timelines; rerunning the same command after a crash resumes.
"""

from experiments._entry import run_entry_point

if __name__ == "__main__":
    run_entry_point("opd", "runs/terminal_opd")
