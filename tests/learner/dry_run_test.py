"""`--dry_run`: the learner of a config compiled on fake CPU devices from abstract params."""

import os
import subprocess
import sys

import pytest

from configs import common, cpu
from thundersync_jax.learner import dry_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiny_with_node(gpu_memory_gb):
    c = cpu.get_config("smoke")
    c.mesh.fsdp, c.mesh.tp = 4, 2
    c.node = common.gpu_node(
        gpu="test",
        num_gpus=8,
        gpu_memory_gb=gpu_memory_gb,
        rollout_gpus=0,
        rollout_tp=1,
        learner_gpus=8,
    )
    return c


def test_moe_dry_run_compiles_its_programs_without_a_segment_step(capsys):
    # GLM-4.7-Flash's layout in miniature (MLA, dense-first layer, shared expert): the dense
    # decoder's segment program does not apply; the score gradient and the update compile.
    c = _tiny_with_node(gpu_memory_gb=80.0)
    c.model = cpu.get_config("moe_glm").model
    assert dry_run.main(c) == 0
    out = capsys.readouterr().out
    assert "score gradient [4 x 1536]" in out and "optimizer update" in out
    assert "segment gradient" not in out and "no segment program: MoE" in out
    assert "planner verdict: fits" in out


def test_report_shows_compiled_sizes_beside_the_planners_verdict(capsys):
    assert dry_run.main(_tiny_with_node(gpu_memory_gb=80.0)) == 0
    out = capsys.readouterr().out
    assert "score gradient [4 x 1536]" in out  # 1 row padded to the 4 fsdp shards
    assert "optimizer update" in out and "arguments GB" in out
    assert "memory planner (learner/memory.py), per learner device" in out
    assert "planner verdict: fits" in out
    assert "does not model GPU buffer assignment" in out


def test_a_config_that_does_not_fit_exits_nonzero(capsys):
    assert dry_run.main(_tiny_with_node(gpu_memory_gb=1e-4)) == 1
    assert "planner verdict: DOES NOT FIT" in capsys.readouterr().out


def _run(args, env=None, timeout=1800):
    env = dict(os.environ if env is None else env, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


# A child process that imports JAX twice (the re-exec), ~14 s of the unit tier: `slow`.
@pytest.mark.slow
def test_fake_devices_are_set_by_re_executing_when_jax_already_started():
    code = (
        "import jax; jax.devices(); from thundersync_jax.learner import dry_run;"
        "dry_run.use_fake_cpu_devices(5); print('devices', len(jax.devices()))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = _run(["-c", code], env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "devices 5"


@pytest.mark.slow
@pytest.mark.timeout(2400)  # up to ~10 min each unrolled (h200:full); more on a loaded machine
@pytest.mark.parametrize(
    "experiment, config, override",
    [
        # make test compiles one recipe per learner code path at its real widths, lengths
        # and mesh but two layers: full fine-tuning with host-resident tallies and offloaded
        # layer inputs (its layers under one lax.scan, `model.scan_layers`), LoRA at 65,536
        # tokens, and OPD. Two scanned layers compile the same layer body as 64 (27 s vs
        # 127 s on an idle machine); the full-depth plans are checked without compiling by
        # tests/learner/memory_test.py. The full-depth recipes are nightly (h200:full's 64
        # unrolled layers take ~10 min).
        ("swe_grpo", "configs/b200.py", "--config.model.num_hidden_layers=2"),
        ("swe_grpo", "configs/b200.py:full", "--config.model.num_hidden_layers=2"),
        pytest.param("swe_grpo", "configs/b200.py", "", marks=pytest.mark.nightly),
        pytest.param("swe_grpo", "configs/b200.py:full", "", marks=pytest.mark.nightly),
        pytest.param("swe_grpo", "configs/h200.py", "", marks=pytest.mark.nightly),
        pytest.param("swe_grpo", "configs/h200.py:full", "", marks=pytest.mark.nightly),
        ("terminal_opd", "configs/terminal_opd_cpu.py", ""),
    ],
)
def test_gpu_recipes_compile_on_8_fake_devices_and_fit(experiment, config, override):
    # The session's compilation cache (tests/conftest.py) is inherited: b200 and h200 (LoRA)
    # compile the same programs.
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    args = ["-m", f"experiments.{experiment}", f"--config={config}", "--dry_run"]
    out = _run(args + ([override] if override else []), env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "score gradient" in out.stdout and "optimizer update" in out.stdout
    assert "segment gradient [1024 new vs" in out.stdout
    if "opd" not in config:
        assert "planner verdict: fits" in out.stdout
        assert "| total learner |" in out.stdout
