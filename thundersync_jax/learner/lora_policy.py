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
