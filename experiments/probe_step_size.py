r"""How far one GRPO step can go: log-probabilities along one batch's gradient.

    python -m experiments.probe_step_size --config=configs/cpu.py --workdir=runs/probe \
        --policy=runs/cpu/sft/student-<hash> [--steps=0.02,0.05,0.1,0.2]

Samples one batch (every task `rl.group_size` times, the config's temperature and loop
limits, real sandbox and verifier) from `--policy`, finalizes its GRPO gradient with
the training run's own score-gradient function and accumulator, then moves the
parameters by plain L2 steps of the listed lengths along −∇L/‖∇L‖ and reports, per
step length, the change of the summed log-probability (at the rollout temperature) of
the batch's successful and failed trajectories and of the warm start's transcripts:
per task, the demonstration (fix) minus its decoy (no-op edit) when `sft.decoys` is on.
This is the measurement behind configs/cpu.py's optimizer choice (BENCHMARKS.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from thundersync_jax import accumulators
from thundersync_jax.envs import agent_demos, play
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.learner import chunks, sft
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.models import qwen3
from thundersync_jax.models import tokenizer as tokenizers

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/probe", "Where the task pool is materialized.")
_POLICY = flags.DEFINE_string("policy", None, "HF directory of the policy (e.g. a warm start).")
_STEPS = flags.DEFINE_list("steps", ["0.02", "0.05", "0.1", "0.2"], "L2 step lengths.")
_SEED = flags.DEFINE_integer("seed", 2, "Sampling seed (the step id of the episodes).")


def _sequence_logprobs(logprob_fn: TokenLogprobFn, params, rows) -> np.ndarray:
    """Summed tempered log-probability of each (tokens, loss_mask) row's masked tokens."""
    return np.asarray(
        [float(np.sum(logprob_fn(params, tokens[None])[0] * mask)) for tokens, mask in rows]
    )


def main(argv):
    del argv
    config, workdir = _CONFIG.value, _WORKDIR.value
    temperature = float(config.rollout.temperature)
    steps = [float(s) for s in _STEPS.value]
    if any(not s > 0 for s in steps):
        raise ValueError(f"--steps={_STEPS.value}: every step length must be > 0")
    tasks = play.build_tasks(config, workdir)
    tok = tokenizers.from_config(config)
    limits = LoopLimits.from_config(config.rollout)
    model = qwen3.from_pretrained(_POLICY.value)
    group_size = int(config.rl.group_size)
    trajs = play.play_tasks(
        config, workdir, tasks, model, tok, group_size, temperature, _SEED.value
    )
    rewards = np.array([t.reward for t in trajs])
    print(f"batch: {len(trajs)} trajectories, mean reward {rewards.mean():.3f}")

    graphdef, params = nnx.split(model, nnx.Param)
    score = chunks.make_score_grad_fn(
        graphdef, tuple(config.learner.seq_buckets), pad_id=tok.pad_id, temperature=temperature
    )
    acc = accumulators.grpo(
        num_groups=len(tasks),
        group_size=group_size,
        loss_agg=config.rl.loss_agg,
        max_len=int(config.rl.max_len or config.rollout.max_traj_tokens),
    )
    state = acc.init(params)
    for t in trajs:
        grad, n = score(params, t.tokens[None], t.loss_mask[None])
        state = acc.add(state, group=t.ids.prompt, reward=t.reward, grad=grad, num_tokens=n)
    grad = acc.finalize(state)
    norm = float(jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grad))))
    print(f"|grad L| = {norm:.4f}")
    if norm == 0:
        print("every group's rewards are equal: no gradient, nothing to probe")
        return

    demos = agent_demos.demonstration_examples(
        [lambda t=t: play.make_env(config, t, workdir) for t in tasks],
        tok,
        limits,
        decoys=bool(config.sft.decoys),
    )
    demo_rows = list(zip(*sft.pad_examples(demos), strict=True))
    traj_rows = [(t.tokens, t.loss_mask) for t in trajs]
    logprob_fn = TokenLogprobFn(score)  # the forward the gradient was taken through
    base_demo = _sequence_logprobs(logprob_fn, params, demo_rows)
    base_traj = _sequence_logprobs(logprob_fn, params, traj_rows)
    for step in steps:
        moved = jax.tree.map(lambda p, g, s=step: p - s * g / norm, params, grad)
        d_traj = _sequence_logprobs(logprob_fn, moved, traj_rows) - base_traj
        d_demo = _sequence_logprobs(logprob_fn, moved, demo_rows) - base_demo
        line = (
            f"L2 step {step:g}: successful trajectories {d_traj[rewards == 1].mean():+.2f} nats, "
            f"failed {d_traj[rewards < 1].mean():+.2f}"
        )
        if config.sft.decoys:
            margin = d_demo[0::2] - d_demo[1::2]
            line += f"; per task, fix-minus-decoy margin {np.round(margin, 2).tolist()}"
        else:
            line += f"; demonstrations {np.round(d_demo, 2).tolist()}"
        print(line)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "policy"])
    app.run(main)
