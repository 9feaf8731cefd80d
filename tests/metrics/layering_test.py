"""`thundersync_jax.metrics` is the bottom layer: importing it loads no upper layer."""

import json
import os
import subprocess
import sys

import thundersync_jax

UPPER_LAYERS = ("sim", "schedule", "envs", "rollout")


def _modules_after_import(statement: str) -> list[str]:
    """Names in sys.modules after running `statement` in a fresh interpreter."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    root = os.path.dirname(os.path.dirname(thundersync_jax.__file__))  # this checkout's package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _upper_layer_modules(modules: list[str]) -> list[str]:
    prefixes = tuple(f"thundersync_jax.{p}" for p in UPPER_LAYERS)
    return [m for m in modules if m in prefixes or m.startswith(tuple(p + "." for p in prefixes))]


def test_importing_metrics_loads_no_upper_layer():
    modules = _modules_after_import("import thundersync_jax.metrics")
    assert "thundersync_jax.metrics._timeline" in modules  # the import really happened
    assert _upper_layer_modules(modules) == []


def test_the_check_sees_an_upper_layer_when_one_is_loaded():
    # Guards the test above against a filter that could never match.
    modules = _modules_after_import("import thundersync_jax.metrics\nimport thundersync_jax.sim")
    assert "thundersync_jax.sim" in _upper_layer_modules(modules)


def test_the_simulator_bridges_are_not_in_metrics():
    """They live above it, in `thundersync_jax.sim.timelines` (no forwarding shim)."""
    from thundersync_jax import metrics

    for name in ("arrivals_from_timeline", "export_arrivals", "timeline_from_sim"):
        assert not hasattr(metrics, name)
