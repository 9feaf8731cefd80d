"""Start-up checks: invalid values and exactness-breaking setups fail before any work.

DESIGN §2 lists what makes streaming exact: one optimizer step per batch, the
sampling policy version equal to the learner's, log-probs from the learner's
forward, float32 accumulation, no sequence mixing (group, bucket) slots. The
trainer enforces the last three by construction; the first two can be broken
by configuration, so they are refused here with the offending key named.
"""

from __future__ import annotations

from thundersync_jax import accumulators
from thundersync_jax.envs import task_families
from thundersync_jax.losses import logprob_gap
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.schedule import schedules


class ConfigError(ValueError):
    """A configuration value that is invalid or would break the exactness invariants."""


def _choice(name: str, value, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(valid)}")


def _positive(name: str, value, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name}={value!r} must be {bound}")


def _registered(lookup, name):
    try:
        return lookup(name)
    except ValueError as e:  # the registries' errors already name the valid choices
        raise ConfigError(str(e)) from None


def check_config(c) -> None:
    """Raises ConfigError naming the first bad value; returns None when the config is usable.

    Names are checked against the registries (schedules, advantage estimators, loss
    aggregations, engines, task families), so whatever is registered is accepted. The
    algorithm's own checks (`algorithms.get(name).check_config`) come on top (`train.check`
    runs both).
    """
    _registered(schedules.get, c.schedule)
    _positive("num_steps", c.num_steps, allow_zero=True)
    _check_rl(c)
    _check_optim(c)
    _check_rollout(c)
    _check_env(c)
    _positive("checkpoint.every", c.checkpoint.every, allow_zero=True)
    _positive("checkpoint.keep", c.checkpoint.keep)
    _positive("sft.steps", c.sft.steps, allow_zero=True)
    if c.lora.enabled:
        _positive("lora.rank", c.lora.rank)
        _choice("lora.publish", c.lora.publish, ("adapters", "merged"))


def _check_rl(c) -> None:
    if not callable(c.rl.advantage):
        _choice("rl.advantage", c.rl.advantage, accumulators.advantage_names())
    _choice("rl.loss_agg", c.rl.loss_agg, accumulators.loss_agg_names())
    _positive("rl.num_groups", c.rl.num_groups)
    _positive("rl.group_size", c.rl.group_size)
    _positive("rl.eps", c.rl.eps)
    _positive("rl.max_open_groups", c.rl.max_open_groups, allow_zero=True)
    _positive("rl.max_open_trajectories", c.rl.get("max_open_trajectories", 0), allow_zero=True)
    _positive("rl.kl_coef", c.rl.kl_coef, allow_zero=True)
    _positive("rl.entropy_coef", c.rl.entropy_coef, allow_zero=True)
    if c.rl.std_ddof not in (0, 1):
        raise ConfigError(f"rl.std_ddof={c.rl.std_ddof!r} must be 0 or 1")
    _choice("accum.placement", accumulators.tally_placement(c), accumulators.TALLY_PLACEMENTS)
    try:
        # Every path that scores sampled tokens applies it: the score-gradient chunk, OPD's
        # per-turn segments and GRPO's shared-prompt members (their direct passes).
        logprob_gap.check_tis_cap(c.rl.get("tis_cap", 0.0))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(c.rl.get("deterministic", False), bool):
        raise ConfigError(f"rl.deterministic={c.rl.deterministic!r} must be True or False")
    if c.rl.loss_agg == "seq-mean-token-sum-norm" and not (
        c.rl.max_len or c.rollout.max_traj_tokens
    ):
        raise ConfigError("rl.loss_agg=seq-mean-token-sum-norm needs rl.max_len > 0")


def _check_optim(c) -> None:
    # One optimizer step per batch is what makes streaming exact.
    if c.get("optim") is not None and c.optim.get("steps_per_batch", 1) != 1:
        raise ConfigError(
            f"optim.steps_per_batch={c.optim.steps_per_batch}: gradient streaming is exact only "
            "with one optimizer step per batch (PPO ratio 1); use 1"
        )
    _positive("optim.learning_rate", c.optim.learning_rate)
    _positive("optim.max_grad_norm", c.optim.max_grad_norm, allow_zero=True)
    _positive("optim.warmup_steps", c.optim.get("warmup_steps", 0), allow_zero=True)
    _positive("optim.decay_steps", c.optim.get("decay_steps", 0), allow_zero=True)


def _check_rollout(c) -> None:
    _choice("rollout.engine", c.rollout.engine, engine_cmd.ENGINES)
    _positive("rollout.num_engines", c.rollout.num_engines)
    _positive("rollout.max_batch", c.rollout.max_batch)
    _positive("rollout.temperature", c.rollout.temperature)
    if not 0 < c.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p={c.rollout.top_p!r} must be in (0, 1]")
    if c.rollout.top_p != 1:
        # The learner scores tokens under the full softmax(logits / temperature); a nucleus
        # cut samples from another distribution, so the update would be silently off-policy.
        raise ConfigError(
            f"rollout.top_p={c.rollout.top_p!r}: the learner scores every token under the "
            "full softmax at rollout.temperature, so top_p < 1 would train off-policy; use "
            "top_p=1.0 (lower rollout.temperature to sharpen sampling instead)"
        )
    _positive("rollout.max_turns", c.rollout.max_turns)
    _positive("rollout.max_error_turns", c.rollout.get("max_error_turns", 0), allow_zero=True)
    _positive("rollout.max_new_tokens_per_turn", c.rollout.max_new_tokens_per_turn)
    _positive("rollout.max_traj_tokens", c.rollout.max_traj_tokens)
    if c.rollout.max_traj_tokens > c.model.max_position_embeddings:
        raise ConfigError(
            f"rollout.max_traj_tokens={c.rollout.max_traj_tokens} exceeds "
            f"model.max_position_embeddings={c.model.max_position_embeddings}"
        )
    if max(c.learner.seq_buckets) < c.rollout.max_traj_tokens:
        raise ConfigError(
            f"learner.seq_buckets={tuple(c.learner.seq_buckets)} must reach "
            f"rollout.max_traj_tokens={c.rollout.max_traj_tokens}"
        )


def _check_env(c) -> None:
    family = _registered(task_families.get, c.env.family)
    try:
        family.check(c)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _positive("env.num_tasks", c.env.num_tasks)
    _positive("env.sandbox_timeout_s", c.env.sandbox_timeout_s)
    _positive("env.sandbox_memory_mb", c.env.sandbox_memory_mb)
