"""The one GPU check (issue 18 item 7): learner speed, vLLM speed, publication, stream vs sync.

    python -m experiments.gpu_check --out=runs/gpu_check.json          # one H200: ~5-8 min
    python -m experiments.gpu_check --cpu --out=runs/gpu_check_cpu.json  # tiny, on CPU

Five parts, each timed after a warm-up, written to one JSON:
  learner     score-gradient chunks (the learner's own `make_score_grad_fn`) of a ~0.5B bf16
              Qwen3 (Qwen3-0.6B's shape): tokens/s and MFU = 6·N·tokens/s (plus attention
              FLOPs) over the device's peak bf16 FLOP/s (None where the peak is not known).
  vllm        the vLLM engine process (engine_cmd's interpreter): start time, publish + verified
              load of a snapshot (bytes / s), generation tokens/s of a batch of requests.
  long        score-gradient tokens/s and MFU of one row at 8k and 32k tokens (bf16, remat),
              cuDNN flash (`auto`) vs the blockwise attention (`bench.gpu_check_long`).
  stream_sync `experiments.swe_grpo --config=configs/cpu.py:vllm` for two steps under `sync`
              and under `stream` (same seed): both end at the same parameters (max |Δ|).
The device, jax/vLLM versions and every setting go into the JSON beside the numbers.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from thundersync_jax.bench.flops import device_peak_flops, median_time, model_flops_per_token


@dataclasses.dataclass(frozen=True)
class CheckSize:
    """How big each part runs: `gpu()` for one H200, `cpu()` for a tiny run on 2 cores."""

    model: dict[str, Any]
    dtype: str
    learner_rows: int
    learner_seq: int
    learner_repeats: int
    vllm_requests: int
    vllm_prompt: int
    vllm_new_tokens: int
    vllm_memory_fraction: float
    steps: int

    @classmethod
    def gpu(cls) -> CheckSize:
        qwen3_0_6b = dict(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        )  # fmt: skip
        return cls(qwen3_0_6b, "bfloat16", 8, 2048, 10, 256, 256, 512, 0.3, 2)

    @classmethod
    def cpu(cls) -> CheckSize:
        tiny = dict(
            vocab_size=384, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True,
        )  # fmt: skip
        return cls(tiny, "float32", 2, 128, 3, 8, 16, 32, 0.1, 2)


def learner_part(size: CheckSize) -> dict[str, Any]:
    """Score-gradient tokens/s and MFU of the learner's jitted chunk function."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.learner import chunks
    from thundersync_jax.models import qwen3

    cfg = qwen3.Qwen3Config(**size.model)
    dtype = jnp.dtype(size.dtype)
    model = qwen3.Qwen3(cfg, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    fn = chunks.make_score_grad_fn(graphdef, (size.learner_seq,), remat=False)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (size.learner_rows, size.learner_seq), np.int32)
    mask = np.ones_like(tokens, np.float32)
    mask[:, 0] = 0

    def call():
        h, _ = fn(params, tokens, mask)
        jax.block_until_ready(h)

    seconds = median_time(call, size.learner_repeats)
    tokens_per_s = tokens.size / seconds
    peak = device_peak_flops(jax.devices()[0])
    flops = model_flops_per_token(cfg, size.learner_seq) * tokens_per_s
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return {
        "params": int(n_params),
        "dtype": size.dtype,
        "chunk": [size.learner_rows, size.learner_seq],
        "seconds_per_chunk": seconds,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_s": flops / 1e12,
        "mfu": None if peak is None else flops / peak,
        "peak_bf16_tflops": None if peak is None else peak / 1e12,
    }


def vllm_part(size: CheckSize, workdir: str, python: str) -> dict[str, Any]:
    """vLLM engine start, publish + verified load bandwidth, generation tokens/s."""
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.models import qwen3, sampling
    from thundersync_jax.rollout import load_probe
    from thundersync_jax.rollout import server as rollout_server
    from thundersync_jax.rollout.manager import EngineManager
    from thundersync_jax.rollout.protocol import GenerateRequest

    cfg = qwen3.Qwen3Config(**size.model)
    dtype = jnp.dtype(size.dtype)
    model = qwen3.Qwen3(cfg, param_dtype=dtype, rngs=nnx.Rngs(0))
    qwen3.save_pretrained(model, os.path.join(workdir, "hf"))
    max_len = size.vllm_prompt + size.vllm_new_tokens
    args = rollout_server.server_args(
        engine="vllm", checkpoint=os.path.join(workdir, "hf"), dtype=size.dtype,
        param_dtype=size.dtype, max_batch=min(size.vllm_requests, 256), max_seq_len=max_len,
        memory_fraction=size.vllm_memory_fraction, vllm_kwargs={"enforce_eager": True},
    )  # fmt: skip
    probe = load_probe.learner_probe(cfg, atol=load_probe.default_atol(size.dtype))
    t0 = time.perf_counter()
    manager = EngineManager(
        args, python=python, engine_envs=[{"JAX_PLATFORMS": "cpu"}], load_probe=probe,
        start_timeout_s=900, heartbeat_timeout_s=900, request_timeout_s=900,
    ).start()  # fmt: skip
    start_s = time.perf_counter() - t0
    try:
        params = nnx.split(qwen3.Qwen3(cfg, param_dtype=dtype, rngs=nnx.Rngs(1)), nnx.Param)[1]
        probe(params)  # compile the learner-side probe outside the timed publishes
        nbytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in _leaves(params))
        loads = []
        for version in (1, 2):
            t = time.perf_counter()
            manager.publish(params, version, os.path.join(workdir, "snap"))
            loads.append(time.perf_counter() - t)
        rng = np.random.default_rng(0)
        sp = sampling.SamplingParams(temperature=1.0, max_new_tokens=size.vllm_new_tokens)

        def batch(tag: str):
            return [
                GenerateRequest(f"{tag}{i}", rng.integers(0, cfg.vocab_size, size.vllm_prompt)
                                .tolist(), sp, (0, 0, i, 0))
                for i in range(size.vllm_requests)
            ]  # fmt: skip

        list(manager.generate(batch("warm")))
        t = time.perf_counter()
        results = list(manager.generate(batch("timed")))
        gen_s = time.perf_counter() - t
    finally:
        manager.close()
    generated = sum(len(r.tokens) for r in results)
    return {
        "start_s": start_s,
        "publish_load_verify_s": loads[-1],
        "snapshot_bytes": nbytes,
        "publish_gbytes_per_s": nbytes / loads[-1] / 1e9,
        "requests": size.vllm_requests,
        "generated_tokens": generated,
        "generate_s": gen_s,
        "generate_tokens_per_s": generated / gen_s,
        "errors": sum(not r.ok for r in results),
    }


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def stream_sync_part(
    size: CheckSize, workdir: str, python: str, extra_flags: Sequence[str] = ()
) -> dict[str, Any]:
    """Two steps of configs/cpu.py:vllm under sync and under stream; same final parameters.

    `extra_flags` are appended to both command lines (e.g. `--config.rl.tis_cap=2`).
    """
    import safetensors.numpy

    runs = {}
    for schedule in ("sync", "stream"):
        out = os.path.join(workdir, schedule)
        cmd = [sys.executable, "-m", "experiments.swe_grpo", "--config=configs/cpu.py:vllm"]
        cmd += [f"--workdir={out}", f"--config.schedule={schedule}"]
        cmd += [f"--config.num_steps={size.steps}", f"--config.rollout.engine_python={python}"]
        cmd += [f"--config.rollout.snapshot_root={os.path.join(workdir, 'shm')}"]
        cmd += [f"--config.sft.cache_dir={os.path.join(workdir, 'sft')}"]
        # The tiny warm start earns reward 0 everywhere (zero advantages, skipped updates); the
        # entropy term gives every step a non-zero gradient, so the comparison has content.
        cmd += ["--config.rl.entropy_coef=0.01", *extra_flags]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=_repo_root(), timeout=1800)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            metrics = [json.loads(line) for line in f if line.strip()]
        runs[schedule] = {
            "wall_s": time.perf_counter() - t,
            "params": safetensors.numpy.load_file(os.path.join(out, "final", "model.safetensors")),
            "step_time_s": [m["step_time_s"] for m in metrics],
            "reward_mean": [m["reward_mean"] for m in metrics],
            "grad_norm": [m["grad_norm"] for m in metrics],
            "update_skipped": [m["update_skipped"] for m in metrics],
            # None: the step had no engine log-probs (the metric is absent, never 0).
            "engine_logprob_gap_abs": [m.get("engine_logprob_gap_abs") for m in metrics],
            "engine_logprob_gap_max": [m.get("engine_logprob_gap_max") for m in metrics],
        }
    a, b = runs["sync"].pop("params"), runs["stream"].pop("params")
    start_dir = glob.glob(os.path.join(workdir, "sft", "sft", "student-*"))[0]
    start = safetensors.numpy.load_file(os.path.join(start_dir, "model.safetensors"))
    gap = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)
    moved = max(float(np.max(np.abs(a[k].astype(np.float64) - start[k]))) for k in a)
    return {
        "max_abs_param_diff": gap,  # sync vs stream final parameters
        "max_abs_update": moved,  # sync final vs the warm start: what the two steps changed
        "same_keys": sorted(a) == sorted(b),
        **runs,
    }


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*, cpu: bool, workdir: str, python: str, parts: tuple[str, ...]) -> dict[str, Any]:
    """Runs the requested parts ("learner", "vllm", "stream_sync", "long"); one report."""
    import jax

    from thundersync_jax.bench import gpu_check_long

    size = CheckSize.cpu() if cpu else CheckSize.gpu()
    report: dict[str, Any] = {
        "mode": "cpu" if cpu else "gpu",
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "size": dataclasses.asdict(size),
    }
    t = time.perf_counter()
    for part in parts:
        sub = os.path.join(workdir, part)
        os.makedirs(sub, exist_ok=True)
        if part == "learner":
            report[part] = learner_part(size)
        elif part == "vllm":
            report[part] = vllm_part(size, sub, python)
        elif part == "stream_sync":
            report[part] = stream_sync_part(size, sub, python)
        elif part == "long":
            report[part] = gpu_check_long.long_part(size, cpu)
        else:
            raise ValueError(f"unknown part {part!r}; valid: learner, vllm, stream_sync, long")
    report["total_s"] = time.perf_counter() - t
    return report
