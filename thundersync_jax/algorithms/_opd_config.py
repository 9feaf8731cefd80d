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
    """MoE routing replay runs under `trajectory` granularity only: the per-turn segment
    passes (`turn`, and `auto`, which may pick it) route every token by themselves."""
    if str(config.model.routing) != "replay" or config.rl.opd_granularity == "trajectory":
        return
    if any(auto.layer_pattern(auto.config_from_section(config.model))):
        raise ConfigError(
            f"rl.opd_granularity={config.rl.opd_granularity!r} with model.routing='replay': "
            "the per-turn segments do not replay the engine's routes; use "
            "rl.opd_granularity='trajectory' (or model.routing='recompute')"
        )
