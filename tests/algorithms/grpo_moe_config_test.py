"""GRPO with a mixture-of-experts policy: shared prompts (dense segment programs) are refused."""

import pytest

from configs import cpu
from thundersync_jax import algorithms
from thundersync_jax.schedule.config_check import ConfigError


@pytest.mark.parametrize("variant", ["moe", "moe_glm"])
def test_shared_prompts_are_refused_for_moe_models(variant):
    c = cpu.get_config(variant)
    check = algorithms.get("grpo").check_config
    check(c)  # per-member prompts: fine
    c.rl.shared_prompt = True
    with pytest.raises(ConfigError, match="rl.shared_prompt=True with a mixture-of-experts"):
        check(c)
    check(cpu.get_config("smoke").copy_and_resolve_references())  # dense: untouched
