"""experiments.eval_policy: a saved policy played on a config's tasks in the real sandbox."""

import numpy as np
import pytest

from configs import cpu
from experiments import eval_policy
from thundersync_jax.models import qwen3


# in make test, not test-quick: one of the unit tier's slowest (sandboxed episodes)
@pytest.mark.slow
def test_evaluates_a_saved_policy_on_every_task(tmp_path, random_qwen3):
    config = cpu.get_config("smoke")
    policy = tmp_path / "policy"
    model = random_qwen3(qwen3.Qwen3Config.from_config_dict(config.model), seed=3)
    qwen3.save_pretrained(model, str(policy))
    rewards, trajs, _ = eval_policy.evaluate(
        config, str(tmp_path / "wd"), str(policy), samples=2, temperature=1.0, seed=7
    )
    assert rewards.shape == (config.env.num_tasks, 2) and len(trajs) == rewards.size
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    # Every episode really ran: at least one sampled turn, a stop reason from the loop.
    assert all(len(t.turns) >= 1 and t.stop_reason for t in trajs)
    # --tasks=eval: the in-loop evaluation's held-out tasks (another seed's), not the pool.
    held, held_trajs, _ = eval_policy.evaluate(
        config, str(tmp_path / "wd"), str(policy), 1, 1.0, 7, held_out=True
    )
    assert held.shape == (config.eval.num_tasks, 1) and len(held_trajs) == held.size
    train_prompts = {t.ids.prompt: _prompt(t) for t in trajs}
    assert any(_prompt(t) != train_prompts.get(t.ids.prompt) for t in held_trajs)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        eval_policy.evaluate(config, str(tmp_path / "wd"), str(tmp_path), 1, 1.0, 0)


def _prompt(traj):
    """The tokens before the first sampled turn (the task's rendered prompt)."""
    return tuple(int(x) for x in traj.tokens[: traj.prompt_len])
