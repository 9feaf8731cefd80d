"""OPD's start-up check beyond the common one (`train.check` calls it through the Algorithm)."""

from __future__ import annotations

from thundersync_jax import accumulators
from thundersync_jax.algorithms import _opd_trajectories as _trajs
from thundersync_jax.models import auto
from thundersync_jax.schedule.config_check import ConfigError


def check_config(config) -> None:
    """What OPD needs beyond the common check; raises ConfigError naming the bad value."""
    if config.rl.loss_agg != "token-mean":
        # Per-turn items would get per-turn (not per-trajectory) weights under other modes.
        raise ConfigError(
            f"rl.loss_agg={config.rl.loss_agg!r}: OPD is −(1/N) Σ over scored tokens; use "
            "'token-mean'"
        )
    try:
        _trajs.check_granularity(config.rl.opd_granularity)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_routing(config)
    if accumulators.tally_placement(config) == "host":
        raise ConfigError(
            "accum.placement='host' moves GRPO's per-open-group tallies to host memory; OPD "
            "keeps one global tally and no per-group ones: use accum.placement='device'"
        )
    if config.get("teacher") is None:
        raise ConfigError(
            "rl.algorithm='opd' needs a `teacher` section (see configs/terminal_opd_cpu.py)"
        )
    if not config.teacher.checkpoint and config.teacher.sft_steps < 1:
        raise ConfigError(
            "teacher.checkpoint is empty and teacher.sft_steps < 1: give a teacher checkpoint "
            "or train the embedded teacher for >= 1 step"
        )


def _check_routing(config) -> None:
    """Mixture-of-experts policies train whole trajectories: the per-turn segment programs
    (`turn`, and `auto`, which may pick it) run the dense decoder only, and would route every
    token themselves instead of replaying the engine's routes."""
    if config.rl.opd_granularity == "trajectory":
        return
    if any(auto.layer_pattern(auto.config_from_section(config.model))):
        raise ConfigError(
            f"rl.opd_granularity={config.rl.opd_granularity!r} with a mixture-of-experts "
            f"model (model_type={config.model.model_type!r}): the per-turn segments run the "
            "dense decoder only and do not replay the engine's routes; use "
            "rl.opd_granularity='trajectory'"
        )
