"""End to end: a user's tiny MoE checkpoint trained by the one loop, sync vs stream.

`configs/cpu.py:smoke` with `model.checkpoint` = a random Qwen3-MoE (default suite) or
GLM-4.7-Flash (nightly) written by transformers, with its own BPE tokenizer. The embedded
engine reports each token's routed experts, the learner replays them
(`model.routing="replay"`): sync and stream must end at the same parameters (≤ 1e-3 of the
update), the engine's and the learner's routers must agree on every token (same float32
numerics: `routing_disagreement` 0) and the engine log-probs must match the learner's.
"""

import os
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint  # noqa: E402  (the test-made user checkpoint)

from configs import cpu
from thundersync_jax import train
from thundersync_jax.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _config(schedule, checkpoint, base):
    c = cpu.get_config("smoke")
    c.schedule, c.seed, c.model.checkpoint = schedule, 42, checkpoint
    # A random checkpoint solves nothing: rewards tie and the GRPO term is zero, so the
    # entropy bonus makes a real update to compare; the full learning rate from step 0.
    c.rl.entropy_coef = 0.01
    c.optim.warmup_steps = c.optim.decay_steps = 0
    # One group of 4 with 3-turn episodes (the smoke run: 2 groups, 6 turns): a random policy
    # runs every episode to its turn limit, and what this test adds to the dense runs is the
    # replayed routing of a multi-turn group under both schedules (suite time, issue 23).
    c.rl.num_groups, c.rollout.max_turns = 1, 3
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every = 0
    c.metrics.tensorboard = False
    return c


def _dist(a, b):
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


def _sync_equals_stream(arch, base):
    user = str(base / "user")
    hf_checkpoint.make_user_checkpoint(user, arch=arch)
    final = {}
    for schedule in ("sync", "stream"):
        workdir = str(base / schedule)
        train.run(_config(schedule, user, base), workdir)
        final[schedule] = load_file(os.path.join(workdir, "final", "model.safetensors"))
        (m,) = read_metrics(os.path.join(workdir, "metrics.jsonl"))
        assert m["routing_disagreement"] == 0.0, (schedule, m)
        assert m["engine_logprob_gap_abs"] < 1e-5, (schedule, m)
    init = load_file(os.path.join(user, "model.safetensors"))
    moved = _dist(final["sync"], init)
    gap = _dist(final["stream"], final["sync"])
    print(f"{arch}: |stream - sync| = {gap:.3e}, |sync - init| = {moved:.3e}")  # BENCHMARKS
    assert moved > 0
    assert gap <= 1e-3 * moved


def test_qwen3_moe_sync_and_stream_reach_the_same_parameters(tmp_path):
    _sync_equals_stream("qwen3_moe", tmp_path)


@pytest.mark.nightly
def test_glm4_moe_lite_sync_and_stream_reach_the_same_parameters(tmp_path):
    _sync_equals_stream("glm4_moe_lite", tmp_path)
