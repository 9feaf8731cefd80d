"""Rollout engines behind one protocol, and weight publication to them.

    from thundersync_jax import rollout
    mgr = rollout.EngineManager(server_args, num_engines=2).start()
    path = mgr.publish(params, version, rollout.snapshots.default_root("run0"))
    for res in mgr.generate([rollout.GenerateRequest(rid, prompt, sp, (seed, step, k, i))]):
        rollout.check_version(res.policy_version, version)

The transport side (protocol, client, manager, server) imports no JAX; `snapshots`, `embedded`
and `vllm_engine` are loaded on first attribute access.
"""

import importlib

from thundersync_jax.rollout.client import EngineClient
from thundersync_jax.rollout.manager import EngineManager
from thundersync_jax.rollout.protocol import (
    EngineError,
    EngineLimits,
    GenerateRequest,
    GenerateResult,
    RequestError,
)
from thundersync_jax.rollout.staleness import StalePolicyError, check_version

_LAZY_MODULES = ("snapshots", "embedded", "vllm_engine", "server")


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"thundersync_jax.rollout.{name}")
    raise AttributeError(f"module 'thundersync_jax.rollout' has no attribute {name!r}")


__all__ = [
    "EngineClient",
    "EngineError",
    "EngineLimits",
    "EngineManager",
    "GenerateRequest",
    "GenerateResult",
    "RequestError",
    "StalePolicyError",
    "check_version",
]
