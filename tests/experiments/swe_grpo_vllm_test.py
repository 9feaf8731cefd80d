"""`configs/cpu.py:vllm` end to end with the real vLLM engine (CPU backend): sync == stream.

Runs `python -m experiments.swe_grpo` twice (two steps each, the same seed) through the GPU
check's `stream_sync_part`, so the check script and this test share one code path. Both runs
use the truncated importance weight (`rl.tis_cap=2`), so its per-token weights from vLLM's
log-probs are part of what must agree, and a one-step warm start: the tiny policy earns reward
0 after any short warm start (the entropy term gives the update), and the 120 SFT steps of the
variant were most of this test's time.
"""

import json

import pytest

from thundersync_jax.bench import gpu_check
from thundersync_jax.rollout import engine_cmd

VLLM_PYTHON = engine_cmd.find_vllm_python()


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PYTHON is None, reason="needs vLLM's CPU backend (.venv-vllm)")
def test_cpu_vllm_variant_sync_and_stream_end_at_the_same_parameters(tmp_path):
    flags = ("--config.sft.steps=1", "--config.rl.tis_cap=2.0")
    result = gpu_check.stream_sync_part(
        gpu_check.CheckSize.cpu(), str(tmp_path), VLLM_PYTHON, extra_flags=flags
    )
    print(json.dumps(result))
    assert result["same_keys"]
    for schedule in ("sync", "stream"):  # both steps took a real optimizer step
        assert result[schedule]["update_skipped"] == [False, False]
        assert min(result[schedule]["grad_norm"]) > 0
        # vLLM's float32 log-probs of its own samples, against the learner's: written every
        # step, and small (its load probe measured 4.8e-7 nats; untempered or stale log-probs
        # would be off by tenths of a nat).
        gap_abs, gap_max = (
            result[schedule][k] for k in ("engine_logprob_gap_abs", "engine_logprob_gap_max")
        )
        assert all(g is not None and 0 <= g < 1e-3 for g in gap_abs), gap_abs
        assert all(g < 1e-2 for g in gap_max), gap_max
    assert result["max_abs_update"] > 0
    # Same trajectories (keyed vLLM seeds), one optimizer step per batch: the updates differ
    # only by float32 summation order.
    assert result["max_abs_param_diff"] <= max(1e-7, 1e-3 * result["max_abs_update"])
    assert result["sync"]["reward_mean"] == result["stream"]["reward_mean"]
    assert result["sync"]["grad_norm"] == pytest.approx(result["stream"]["grad_norm"], rel=1e-5)
