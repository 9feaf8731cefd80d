"""`configs/cpu.py:vllm` end to end with the real vLLM engine (CPU backend): sync == stream.

Runs `python -m experiments.swe_grpo` twice (two steps each, the same seed) through the GPU
check's `stream_sync_part`, so the check script and this test share one code path.
"""

import json

import pytest

from thundersync_jax.bench import gpu_check
from thundersync_jax.rollout import engine_cmd

VLLM_PYTHON = engine_cmd.find_vllm_python()


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PYTHON is None, reason="needs vLLM's CPU backend (.venv-vllm)")
def test_cpu_vllm_variant_sync_and_stream_end_at_the_same_parameters(tmp_path):
    result = gpu_check.stream_sync_part(gpu_check.CheckSize.cpu(), str(tmp_path), VLLM_PYTHON)
    print(json.dumps(result))
    assert result["same_keys"]
    for schedule in ("sync", "stream"):  # both steps took a real optimizer step
        assert result[schedule]["update_skipped"] == [False, False]
        assert min(result[schedule]["grad_norm"]) > 0
    assert result["max_abs_update"] > 0
    # Same trajectories (keyed vLLM seeds), one optimizer step per batch: the updates differ
    # only by float32 summation order.
    assert result["max_abs_param_diff"] <= max(1e-7, 1e-3 * result["max_abs_update"])
    assert result["sync"]["reward_mean"] == result["stream"]["reward_mean"]
    assert result["sync"]["grad_norm"] == pytest.approx(result["stream"]["grad_norm"], rel=1e-5)
