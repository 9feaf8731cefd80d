"""SWE-bench-format tasks: instances, the sandboxed environment and verifier, mini-SWE."""

from thundersync_jax.envs.swe import factory, mini_swe
from thundersync_jax.envs.swe.environment import SweEnvironment, demonstration_from_patch
from thundersync_jax.envs.swe.instance import (
    DEFAULT_TEST_CMD,
    SweInstance,
    dump_jsonl,
    load_jsonl,
    load_predictions,
)
from thundersync_jax.envs.swe.verifier import evaluate_patch

__all__ = [
    "DEFAULT_TEST_CMD",
    "SweEnvironment",
    "SweInstance",
    "demonstration_from_patch",
    "dump_jsonl",
    "evaluate_patch",
    "factory",
    "load_jsonl",
    "load_predictions",
    "mini_swe",
]
