"""The trainable side of the policy: full parameters, or LoRA adapters over a frozen base.

With `lora.enabled`, the train state, gradients, accumulator tallies and optimizer state
cover only the adapters (`models.lora.Adapters`); the warm-started weights are the frozen
base and also the reference policy (fresh adapters have B = 0, so base + adapters = base at
step 0). Engines receive merged weights (`lora.publish='merged'`) or the adapters alone
(`'adapters'`, for an engine that holds the same base); the final export is always merged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from thundersync_jax.models import lora
from thundersync_jax.schedule.config_check import ConfigError

PUBLISH_MODES = ("adapters", "merged")


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
    if c.publish not in PUBLISH_MODES:
        raise ConfigError(f"lora.publish={c.publish!r} is not valid; choose one of {PUBLISH_MODES}")
    if c.publish == "adapters" and config.rollout.engine == "embedded":
        # The fleet starts embedded engines from the model config, not from the warm start,
        # so they hold no base to add adapters to (and reject adapter snapshots on load).
        raise ConfigError(
            "lora.publish='adapters' needs an engine that holds the warm-started base weights; "
            "the embedded engine loads full weights: use lora.publish='merged'"
        )


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the learner trains and what stays frozen.

    Attributes:
      trainable: the initial trainable pytree: the full params, or fresh LoRA adapters.
      base: the frozen full params under the adapters (None without LoRA).
      publish_kind: snapshot kind the engines receive ("params", "merged", "lora_adapters").
    """

    trainable: Any
    base: Any
    publish_kind: str

    @property
    def is_lora(self) -> bool:
        return self.base is not None

    def full_params(self, trainable: Any) -> Any:
        """The model's full params for `trainable` (merged with the base under LoRA)."""
        return _merge(self.base, trainable) if self.is_lora else trainable

    def publishable(self, trainable: Any) -> Any:
        """What goes into the engines' snapshot for `trainable` (see `publish_kind`)."""
        if self.publish_kind == "merged":
            return self.full_params(trainable)
        return trainable


@jax.jit
def _merge(base, adapters):
    return lora.merge(base, adapters)


def make_policy(config, params: Any) -> Policy:
    """The run's `Policy` from the warm-started full `params` and the `lora` config section."""
    c = config.lora
    if not c.enabled:
        return Policy(params, None, "params")
    adapters = lora.init(
        params,
        int(c.rank),
        float(c.alpha),
        tuple(c.targets),
        key=jax.random.fold_in(jax.random.key(int(config.seed)), 0x10AA),
    )
    kind = "merged" if c.publish == "merged" else "lora_adapters"
    return Policy(adapters, params, kind)
