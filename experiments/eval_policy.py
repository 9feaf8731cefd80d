r"""Success rate and pass@k of a saved policy on a run's tasks or on any dataset.

    python -m experiments.eval_policy --config=configs/cpu.py --workdir=runs/cpu \
        --policy=runs/cpu/final [--samples=8] [--k=2] [--temperature=0.5] [--out=FILE.json]
    python -m experiments.eval_policy --config=configs/cpu.py --policy=DIR --tasks=eval
    python -m experiments.eval_policy --config=configs/b200.py --policy=DIR \
        --dataset=verified.parquet --config.env.images=/data/images --k=3

`--tasks=train` plays the config's training pool; `--tasks=eval` the held-out tasks the
in-loop evaluation plays (`eval.dataset`, or held-out generated tasks; `--dataset=SPEC`
sets eval.dataset), scored the same way: pass@1 and pass@k by the unbiased estimator
(thundersync_jax/evaluation.py) over `--samples` samples per task (at least k).

`--policy` is an HF directory (config.json + model.safetensors): `DIR/final/` of a run,
or its warm start `DIR/sft/student-*/`. Every task of the config's pool is played
`--samples` times in the real sandbox with the config's loop limits and its rollout
temperature (unless `--temperature` is given), with the embedded sampler in this
process, and scored by the verifier. Prints the success rate per task and overall
and a few failed transcripts' last turns; `--out` also writes them as JSON. Sampling
keys are fixed by `--seed`, so evaluating two policies compares them on equal terms.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from thundersync_jax import evaluation
from thundersync_jax.envs import play, task_families
from thundersync_jax.models import qwen3
from thundersync_jax.models import tokenizer as tokenizers

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/eval", "Where the task pool is materialized.")
_POLICY = flags.DEFINE_string("policy", None, "HF directory of the policy to evaluate.")
_SAMPLES = flags.DEFINE_integer("samples", 8, "Episodes per task.")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Default: config.rollout.temperature.")
_SEED = flags.DEFINE_integer("seed", 1234, "Sampling seed (the step id of the episodes).")
_SHOW = flags.DEFINE_integer("show_failures", 3, "Failed transcripts to print (last turn).")
_OUT = flags.DEFINE_string("out", "", "Optional JSON file for the per-task results.")
_TASKS = flags.DEFINE_enum("tasks", "train", ["train", "eval"], "Training pool or held-out.")
_DATASET = flags.DEFINE_string("dataset", "", "A SWE dataset to evaluate on (implies eval).")
_K = flags.DEFINE_integer("k", None, "pass@k's k (default: config.eval.k).")


def evaluate(
    config,
    workdir: str,
    policy_dir: str,
    samples: int,
    temperature: float,
    seed: int,
    held_out: bool = False,
):
    """Plays every task `samples` times; returns (rewards [tasks, samples], trajectories, tok).

    `held_out`: the in-loop evaluation's tasks (`task_families.eval_tasks`) instead of the
    training pool."""
    if samples < 1:
        raise ValueError(f"--samples={samples} must be >= 1")
    if not os.path.isfile(os.path.join(policy_dir, "model.safetensors")):
        raise FileNotFoundError(
            f"--policy={policy_dir!r} holds no model.safetensors; pass a run's DIR/final or "
            "DIR/sft/student-*"
        )
    if held_out:
        tasks = task_families.eval_tasks(config, workdir)
    else:
        tasks = play.build_tasks(config, workdir)
    model = qwen3.from_pretrained(policy_dir)
    tok = tokenizers.from_config(config)
    trajs = play.play_tasks(config, workdir, tasks, model, tok, samples, temperature, seed)
    rewards = np.zeros((len(tasks), samples))
    for tr in trajs:
        rewards[tr.ids.prompt, tr.ids.member] = tr.reward
    return rewards, trajs, tok


def main(argv):
    del argv
    config = _CONFIG.value
    temperature = (
        float(config.rollout.temperature) if _TEMPERATURE.value is None else _TEMPERATURE.value
    )
    if _DATASET.value:
        config.eval.dataset = _DATASET.value
    k = int(config.eval.k) if _K.value is None else _K.value
    samples = max(_SAMPLES.value, k)
    rewards, trajs, tok = evaluate(
        config,
        _WORKDIR.value,
        _POLICY.value,
        samples,
        temperature,
        _SEED.value,
        held_out=_TASKS.value == "eval" or bool(_DATASET.value),
    )
    per_task = rewards.mean(axis=1)
    correct = (rewards >= 1.0).sum(axis=1).tolist()
    pass_at = {f"pass@{j}": evaluation.mean_pass_at_k(correct, samples, j) for j in (1, k)}
    print(f"policy {_POLICY.value} at temperature {temperature:g}, {samples} samples/task")
    for i, p in enumerate(per_task):
        print(f"  task {i}: {p:.3f}")
    print(f"mean reward {rewards.mean():.3f} over {rewards.size} episodes; "
          + ", ".join(f"{name} {v:.3f}" for name, v in pass_at.items()))  # fmt: skip
    failed = [t for t in trajs if t.reward < 1.0][: _SHOW.value]
    for tr in failed:
        last = tr.turns[-1] if tr.turns else None
        text = tok.decode(list(tr.tokens[last.start : last.end])) if last else ""
        print(f"-- failed: task {tr.ids.prompt} ({tr.stop_reason}): ...{text[-200:]!r}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(
                {
                    "policy": _POLICY.value,
                    "temperature": temperature,
                    "samples": samples,
                    **pass_at,
                    "seed": _SEED.value,
                    "per_task": per_task.tolist(),
                    "mean": float(rewards.mean()),
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "policy"])
    app.run(main)
