"""Invalid config values fail before any work, naming the key and what would be valid."""

import jax.numpy as jnp
import pytest

from configs import cpu
from thundersync_jax import accumulators, train
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


def _half_centered(offsets, mask, shift, *, eps, std_ddof):
    """A = (r − μ)/2 as (scale, offset) on shifted rewards."""
    del shift, eps, std_ddof
    mean = jnp.sum(jnp.where(mask, offsets, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
    return jnp.float32(0.5), -0.5 * mean


def test_registered_estimator_and_aggregation_are_accepted_by_name():
    """Validation asks the registries: what `register_*` adds is valid in the config at once."""
    if "config-check-half" not in accumulators.advantage_names():
        accumulators.register_advantage("config-check-half", _half_centered, affine=True)
    if "config-check-sum" not in accumulators.loss_agg_names():
        accumulators.register_loss_agg(
            "config-check-sum", lambda n: jnp.float32(1.0), lambda b, n, m: jnp.float32(1.0)
        )
    c = cpu.get_config()
    c.rl.advantage = "config-check-half"
    c.rl.loss_agg = "config-check-sum"
    algo, schedule, family = train.check(c)  # every start-up check, as a run does them
    assert (algo.name, schedule.name, family.name) == ("grpo", c.schedule, c.env.family)
    c.rl.advantage = "config-check-halt"  # a typo is refused, naming the registered ones
    with pytest.raises(ConfigError, match="config-check-half"):
        train.check(c)
