"""The GPU check script's --cpu path: learner and vLLM parts at tiny sizes, one JSON."""

import json
import subprocess
import sys

import pytest

from thundersync_jax.bench import gpu_check
from thundersync_jax.models import qwen3
from thundersync_jax.rollout import engine_cmd

VLLM_PYTHON = engine_cmd.find_vllm_python()


def test_flops_per_token_by_hand():
    cfg = qwen3.Qwen3Config(**gpu_check.CheckSize.cpu().model)
    # per layer: q,o 128x128 each; k,v 128x64 each; MLP 3 x 128x352; head 384x128 (tied).
    matmul = 2 * (128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 352) + 384 * 128
    assert gpu_check.model_flops_per_token(cfg, 10) == 6 * matmul + 12 * 2 * 10 * 128


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PYTHON is None, reason="needs vLLM's CPU backend (.venv-vllm)")
def test_cpu_check_writes_learner_and_vllm_figures(tmp_path):
    out = tmp_path / "check.json"
    cmd = [sys.executable, "-m", "experiments.gpu_check", "--cpu", f"--out={out}"]
    cmd += [
        f"--workdir={tmp_path / 'work'}",
        "--parts=learner,vllm",
        f"--engine_python={VLLM_PYTHON}",
    ]
    subprocess.run(cmd, check=True, timeout=1200, env=None)
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu" and report["learner"]["tokens_per_s"] > 0
    assert report["learner"]["mfu"] is None  # no known peak for a CPU
    v = report["vllm"]
    assert v["errors"] == 0 and v["generated_tokens"] == 8 * 32
    assert v["generate_tokens_per_s"] > 0 and v["publish_gbytes_per_s"] > 0


@pytest.mark.slow  # a child process
def test_cpu_long_sequence_part_reports_both_attention_paths(tmp_path):
    out = tmp_path / "long.json"
    cmd = [sys.executable, "-m", "experiments.gpu_check", "--cpu", f"--out={out}"]
    cmd += [f"--workdir={tmp_path / 'work'}", "--parts=long"]
    subprocess.run(cmd, check=True, timeout=1200, env=None)
    rows = json.loads(out.read_text())["long"]
    assert [(r["tokens"], r["impl"]) for r in rows] == [
        (256, "auto"), (256, "blockwise"), (512, "auto"), (512, "blockwise")
    ]  # fmt: skip
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)
