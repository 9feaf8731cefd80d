"""End to end through `experiments.swe_grpo`: a sharded learner, a user's own checkpoint.

* (nightly) A stream run on 8 fake CPU devices with mesh fsdp=4 x tp=2 ends at the single-device
  run's parameters (the update, final - initial, within 1e-4 relative) with equal rewards.
* A tiny Qwen3 checkpoint with its own BPE tokenizer and chat template, both made by
  transformers/tokenizers, trains a step in bfloat16 via `--config.model.checkpoint=DIR`;
  `final/` is BF16 safetensors and loads in transformers with the same tokenizer.
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint  # noqa: E402  (the test-made user checkpoint)

from configs import cpu
from thundersync_jax import train
from thundersync_jax.metrics import read_metrics

# Three trainer runs each; a loaded 2-core machine needs more than the default 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = [
    "--config=configs/cpu.py:smoke",
    "--config.seed=42",
    # The entropy bonus keeps the update non-zero whatever the sampled rewards are (a step
    # whose groups all tie has no policy-gradient term), so the runs compare a real update.
    "--config.rl.entropy_coef=0.01",
]


# The full learning rate from the first step: with the smoke config's warmup the first update
# is ~1e-8 per weight, near float32's spacing at the weights' size, so rounding of
# params + update (not the sharded gradient) would dominate the comparison.
FULL_STEP = ["--config.optim.warmup_steps=0", "--config.optim.decay_steps=0"]


def _train_cli(workdir, *flags):
    # The session's XLA_FLAGS (8 fake devices, tests/conftest.py): the same flags as every
    # other experiments.* process, so the shared compilation cache serves this one too.
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    cmd = [sys.executable, "-m", "experiments.swe_grpo", f"--workdir={workdir}", *COMMON, *flags]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]


def _config(steps, base):
    c = cpu.get_config("smoke")
    c.seed, c.num_steps, c.rl.entropy_coef = 42, steps, 0.01
    c.optim.warmup_steps = c.optim.decay_steps = 0  # see `FULL_STEP`
    c.sft.cache_dir = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    return c


def _final(workdir):
    return load_file(os.path.join(workdir, "final", "model.safetensors"))


def _norm(tensors):
    return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in tensors.values())))


# Folded: tests/train_multiprocess_test.py runs the same stream config on fsdp=2 x tp=2 meshes
# (2 processes) and on one device and asserts the same 1e-4 bound and equal rewards (issue 23).
@pytest.mark.nightly
def test_fsdp4_tp2_stream_run_matches_the_single_device_run(tmp_path):
    init, single, sharded = (str(tmp_path / n) for n in ("init", "single", "sharded"))
    train.run(_config(0, tmp_path), init)  # the warm start, exported as it is
    train.run(_config(1, tmp_path), single)  # mesh 1 x 1: the first of the 8 devices
    _train_cli(
        sharded,
        "--config.num_steps=1",
        f"--config.sft.cache_dir={os.environ.get('TSJ_TEST_SFT_CACHE') or tmp_path / 'sft'}",
        f"--config.rollout.snapshot_root={tmp_path / 'shm'}",
        "--config.mesh.fsdp=4",
        "--config.mesh.tp=2",
        *FULL_STEP,
    )
    p0, p1, p8 = _final(init), _final(single), _final(sharded)
    update = {k: p1[k].astype(np.float64) - p0[k] for k in p0}
    gap = {k: p8[k].astype(np.float64) - p1[k] for k in p0}
    assert _norm(update) > 0
    assert _norm(gap) <= 1e-4 * _norm(update), (_norm(gap), _norm(update))
    rewards = [
        [m["reward_mean"] for m in read_metrics(os.path.join(w, "metrics.jsonl"))]
        for w in (single, sharded)
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 1


def _safetensors_dtypes(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_user_checkpoint_trains_in_bf16_and_final_loads_in_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    user = str(tmp_path / "user")
    hf_checkpoint.make_user_checkpoint(user)
    work = str(tmp_path / "run")
    # One step of one group of 2: the test is about the checkpoint, tokenizer, dtype and
    # export (most of its time is compiling this model's programs; a second step of 8 bf16
    # trajectories was another ~24 s on a loaded machine).
    _train_cli(
        work,
        "--config.num_steps=1",
        "--config.rl.num_groups=1",
        "--config.rl.group_size=2",
        f"--config.model.checkpoint={user}",
        "--config.model.param_dtype=bfloat16",
        f"--config.rollout.snapshot_root={tmp_path / 'shm'}",
    )
    (m,) = read_metrics(os.path.join(work, "metrics.jsonl"))
    assert m["tokens"] > 0 and not m["update_skipped"] and m["grad_norm"] > 0, m
    final = os.path.join(work, "final")
    assert _safetensors_dtypes(os.path.join(final, "model.safetensors")) == {"BF16"}
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert os.path.exists(os.path.join(final, name)), name

    ours, theirs = AutoTokenizer.from_pretrained(final), AutoTokenizer.from_pretrained(user)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.chat_template == theirs.chat_template
    text = "def test_add():\n    assert add(1, 2) == 3  <|im_end|>"
    assert ours.encode(text) == theirs.encode(text)
    with open(os.path.join(final, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["eos_token_id"] == theirs.eos_token_id
    assert cfg["pad_token_id"] == theirs.pad_token_id
    with open(os.path.join(final, "generation_config.json")) as f:
        assert theirs.eos_token_id in json.load(f)["eos_token_id"]

    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.dtype == torch.bfloat16
    ids = torch.tensor([ours.encode(text)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 512) and torch.isfinite(logits).all()
    # the trained weights are the ones exported: the update moved them off the user's init
    start = AutoModelForCausalLM.from_pretrained(user).model.embed_tokens.weight.float()
    assert not torch.equal(model.model.embed_tokens.weight.float(), start)
