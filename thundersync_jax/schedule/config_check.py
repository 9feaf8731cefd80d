"""Start-up checks: invalid values and exactness-breaking setups fail before any work.

DESIGN §2 lists what makes streaming exact: one optimizer step per batch, the
sampling policy version equal to the learner's, log-probs from the learner's
forward, float32 accumulation, no sequence mixing (group, bucket) slots. The
trainer enforces the last three by construction; the first two can be broken
by configuration, so they are refused here with the offending key named.
"""

from __future__ import annotations

from collections.abc import Callable

from thundersync_jax import accumulators
from thundersync_jax.envs import task_families
from thundersync_jax.learner import regularizers, train_state
from thundersync_jax.losses import logprob_gap
from thundersync_jax.models import lora, tokenizer
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.schedule import schedules

# Keys whose value is a name, and where the valid names come from: the registries, so that
# whatever is registered (`accumulators.register_advantage`, ...) is valid at once.
# `rl.algorithm` is checked by `train.check` against `algorithms.NAMES` (algorithms sit above
# this module).
CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "schedule": lambda: schedules.NAMES,
    "rl.advantage": accumulators.advantage_names,
    "rl.loss_agg": accumulators.loss_agg_names,
    "rl.kl_estimator": lambda: tuple(regularizers.KL_ESTIMATORS),
    "accum.placement": lambda: accumulators.TALLY_PLACEMENTS,
    "optim.name": lambda: train_state.OPTIMIZERS,
    "rollout.engine": lambda: engine_cmd.ENGINES,
    "env.family": lambda: task_families.NAMES,
    "tokenizer.kind": lambda: tokenizer.TOKENIZER_KINDS,
    "lora.publish": lambda: LORA_PUBLISH,
}
LORA_PUBLISH = ("adapters", "merged")  # engines get the adapters, or the merged weights
# Sections whose keys differ between configs: `model` holds the HF config.json fields of
# whichever architecture; `teacher` (OPD) and `node` (GPU recipes) exist only where needed.
OPEN_SECTIONS = ("model", "teacher", "node")


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


def _lookup(c, path: str):
    node = c
    for part in path.split("."):
        if part not in node:
            raise ConfigError(f"the config has no {path} (configs.common.get_base_config has it)")
        node = node[part]
    return node


def check_keys(c, base) -> None:
    """Every key of `c` exists in `base` (the defaults, `configs.common.get_base_config()`)
    with a value of the default's type; ConfigError naming the key and what is valid."""
    for section, value in c.items():
        if section not in base and section not in OPEN_SECTIONS:
            valid = ", ".join(sorted({*base.keys(), *OPEN_SECTIONS}))
            raise ConfigError(f"unknown config section {section!r}; valid: {valid}")
        if section in OPEN_SECTIONS or not hasattr(value, "items"):
            if section in base:
                _check_type(section, value, base[section])
            continue
        for key, leaf in value.items():
            if key not in base[section]:
                valid = ", ".join(sorted(base[section].keys()))
                raise ConfigError(f"unknown key {section}.{key}; {section} has: {valid}")
            _check_type(f"{section}.{key}", leaf, base[section][key])


def _check_type(path: str, value, default) -> None:
    if hasattr(default, "items") or default is None or callable(value):
        return
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,), tuple: (tuple, list)}
    wanted = kinds.get(type(default), (type(default),))
    if not isinstance(value, wanted) or (wanted != (bool,) and isinstance(value, bool)):
        raise ConfigError(
            f"{path}={value!r} has type {type(value).__name__}; it must be "
            f"{type(default).__name__} (default {default!r})"
        )


def check_choices(c) -> None:
    """Every name-valued key (`CHOICES`) names something registered."""
    for path, names in CHOICES.items():
        value = _lookup(c, path)
        if path == "rl.advantage" and callable(value):
            continue  # a callable estimator, not a name
        _choice(path, value, names())


def check_config(c) -> None:
    """Raises ConfigError naming the first bad value; returns None when the config is usable.

    Names are checked against the registries (schedules, advantage estimators, loss
    aggregations, engines, task families), so whatever is registered is accepted. The
    algorithm's own checks (`algorithms.get(name).check_config`) come on top (`train.check`
    runs both).
    """
    check_choices(c)
    _positive("num_steps", c.num_steps, allow_zero=True)
    _check_rl(c)
    _check_optim(c)
    _check_rollout(c)
    _check_env(c)
    _positive("checkpoint.every", c.checkpoint.every, allow_zero=True)
    _positive("checkpoint.keep", c.checkpoint.keep)
    _positive("sft.steps", c.sft.steps, allow_zero=True)
    check_lora_config(c)


def _check_rl(c) -> None:
    _positive("rl.num_groups", c.rl.num_groups)
    _positive("rl.group_size", c.rl.group_size)
    _positive("rl.eps", c.rl.eps)
    _positive("rl.max_open_groups", c.rl.max_open_groups, allow_zero=True)
    _positive("rl.max_open_trajectories", c.rl.max_open_trajectories, allow_zero=True)
    _positive("rl.kl_coef", c.rl.kl_coef, allow_zero=True)
    _positive("rl.entropy_coef", c.rl.entropy_coef, allow_zero=True)
    if c.rl.std_ddof not in (0, 1):
        raise ConfigError(f"rl.std_ddof={c.rl.std_ddof!r} must be 0 or 1")
    try:
        # Every path that scores sampled tokens applies it: the score-gradient chunk, OPD's
        # per-turn segments and GRPO's shared-prompt members (their direct passes).
        logprob_gap.check_tis_cap(c.rl.tis_cap)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(c.rl.deterministic, bool):
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
    _positive("optim.warmup_steps", c.optim.warmup_steps, allow_zero=True)
    _positive("optim.decay_steps", c.optim.decay_steps, allow_zero=True)


def _check_rollout(c) -> None:
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
    _positive("rollout.max_error_turns", c.rollout.max_error_turns, allow_zero=True)
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


def check_lora_config(config) -> None:
    """Raises ConfigError for LoRA settings the trainer cannot run (before any work starts)."""
    c = config.lora
    if not c.enabled:
        return
    if int(c.rank) < 1:
        raise ConfigError(f"lora.rank={c.rank!r} must be >= 1")
    if not float(c.alpha) > 0:
        raise ConfigError(f"lora.alpha={c.alpha!r} must be > 0")
    bad = [t for t in c.targets if t not in lora.HF_TARGETS]
    if bad or not c.targets:
        raise ConfigError(
            f"lora.targets={tuple(c.targets)!r} is not valid; choose from {lora.HF_TARGETS}"
        )
    if c.publish == "adapters" and config.rollout.engine == "embedded":
        # The fleet starts embedded engines from the model config, not from the warm start,
        # so they hold no base to add adapters to (and reject adapter snapshots on load).
        raise ConfigError(
            "lora.publish='adapters' needs an engine that holds the warm-started base weights; "
            "the embedded engine loads full weights: use lora.publish='merged'"
        )
