"""Invalid config values fail before any work, naming the key and what would be valid."""

import pytest

from configs import cpu
from thundersync_jax.schedule.config_check import ConfigError, check_config


def test_shipped_configs_pass():
    check_config(cpu.get_config())
    check_config(cpu.get_config("smoke"))


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("schedule", "turbo", "schedule='turbo' is not valid; choose one of: sync, group"),
        ("rl.advantage", "ppo", "rl.advantage='ppo'"),
        ("rl.loss_agg", "mean", "rl.loss_agg='mean'"),
        ("rl.group_size", 0, "rl.group_size=0 must be > 0"),
        ("rollout.top_p", 1.5, "rollout.top_p=1.5"),
        ("rollout.top_p", 0.9, "rollout.top_p=0.9: the learner scores every token"),
        ("optim.learning_rate", -1.0, "optim.learning_rate=-1.0"),
        ("rollout.max_traj_tokens", 10**6, "exceeds model.max_position_embeddings"),
        ("env.family", "chess", "env.family='chess'"),
    ],
)
def test_bad_values_are_named(path, value, message):
    c = cpu.get_config()
    node = c
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    with c.unlocked():
        node[leaf] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        check_config(c)


def test_several_optimizer_steps_per_batch_refused():
    c = cpu.get_config()
    c.optim.steps_per_batch = 2
    with pytest.raises(ConfigError, match="one optimizer step per batch"):
        check_config(c)
