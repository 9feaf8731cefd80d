"""The learner's GPUs and XLA memory settings, checked for every shipped config."""

import json
import os
import subprocess
import sys

import jax
import pytest

from configs import b200, cpu, h200, terminal_opd_cpu
from thundersync_jax import gpu_node
from thundersync_jax.learner import memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GPU_CONFIGS = {
    "b200": (b200.get_config(), "4,5,6,7"),
    "b200:full": (b200.get_config("full"), "4,5,6,7"),
    "h200": (h200.get_config(), "4,5,6,7"),
    "h200:full": (h200.get_config("full"), "3,4,5,6,7"),
}


@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_gpu_configs_give_the_learner_only_its_own_gpus(name):
    config, gpus = GPU_CONFIGS[name]
    env = gpu_node.learner_env(config)
    assert env["CUDA_VISIBLE_DEVICES"] == gpus
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    # the fraction XLA takes of each own GPU is the capacity the planner budgets
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == config.node.memory_headroom
    assert len(gpus.split(",")) == config.mesh.fsdp * config.mesh.tp
    assert memory.plan(config).fits


@pytest.mark.parametrize(
    "config", [cpu.get_config(), cpu.get_config("smoke"), terminal_opd_cpu.get_config()]
)
def test_cpu_configs_set_nothing(config):
    assert gpu_node.learner_env(config) == {}
    assert gpu_node.apply_learner_env(config, environ={}) == {}


def test_apply_sets_the_env_before_jax_starts_and_keeps_a_launchers_device_choice():
    code = (
        "import json; from configs import b200; from thundersync_jax import gpu_node;"
        "e = {}; gpu_node.apply_learner_env(b200.get_config(), environ=e);"
        "k = {'CUDA_VISIBLE_DEVICES': '7'}; gpu_node.apply_learner_env(b200.get_config(), k);"
        "print(json.dumps([e, k]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["PYTHONPATH"] = REPO
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    fresh, launched = json.loads(out.stdout.strip().splitlines()[-1])
    assert fresh == gpu_node.learner_env(b200.get_config())
    assert launched["CUDA_VISIBLE_DEVICES"] == "7"  # the launcher's choice stands
    assert launched["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"


def test_a_started_cpu_backend_or_forced_cpu_is_left_alone():
    jax.devices()  # this test process runs on CPU
    assert gpu_node.apply_learner_env(b200.get_config(), environ={}) == {}
    assert gpu_node.apply_learner_env(b200.get_config(), environ={"JAX_PLATFORMS": "cpu"}) == {}


def test_mesh_that_does_not_match_the_learner_gpus_is_named():
    config = b200.get_config()
    config.mesh.tp = 2
    with pytest.raises(ValueError, match=r"fsdp=1 x tp=2 = 2 devices, but node.learner_gpus=4"):
        gpu_node.learner_env(config)
    config = h200.get_config("full")
    config.node.learner_gpus = 6
    config.mesh.fsdp = 6
    with pytest.raises(ValueError, match=r"learner_gpus 6 > num_gpus 8"):
        gpu_node.learner_env(config)
