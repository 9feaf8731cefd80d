"""Test-wide settings: CPU only, 8 fake devices for sharding tests."""

import os

# Must run before jax is imported anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Backend optimization level 0 roughly halves CPU compile time of the tiny test models
# with no measurable slowdown in execution; tests compare against references with tolerances.
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
