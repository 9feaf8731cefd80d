"""Held-out evaluation in the loop: the pass@k estimator, and a run with evaluation on ends at
the parameters of the same run without it while writing eval_pass@1 / eval_pass@2 per step."""

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import cpu
from thundersync_jax import evaluation, train
from thundersync_jax.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("n, c, k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 2), (5, 2, 4),
                                     (6, 0, 3), (6, 4, 3), (7, 3, 7), (4, 4, 2)])  # fmt: skip
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_success(n, c, k):
    # Reference: every k-subset of the n samples (c of them correct), counted.
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    want = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(evaluation.pass_at_k(n, c, k), want, rel_tol=1e-12)
    if k == 1:
        assert math.isclose(evaluation.pass_at_k(n, c, 1), c / n)
    with pytest.raises(ValueError):
        evaluation.pass_at_k(n, c, n + 1)


def _config(base):
    c = cpu.get_config("smoke")
    c.schedule = "sync"  # a fixed chunk order: runs that sample the same batches are bitwise equal
    c.num_steps = 2
    c.seed = 42
    c.sft.steps = 4  # plumbing, not learning: a short warm start ...
    c.rl.entropy_coef = 0.01  # ... and an entropy term, so every update moves the weights
    c.rollout.max_turns = 3
    c.rl.num_groups, c.rl.group_size = 1, 2  # the smallest batch with a group
    c.sft.cache_dir = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every = 0
    c.metrics.tensorboard = False
    return c


@pytest.mark.slow
def test_eval_every_step_writes_pass_at_k_and_leaves_training_unchanged(tmp_path):
    off = str(tmp_path / "off")
    train.run(_config(tmp_path), off)
    on = str(tmp_path / "on")
    c = _config(tmp_path)
    overrides = [
        f"--config.{k}={v}"
        for k, v in [
            ("schedule", c.schedule), ("num_steps", c.num_steps), ("seed", c.seed),
            ("sft.steps", c.sft.steps), ("rl.entropy_coef", c.rl.entropy_coef),
            ("rollout.max_turns", c.rollout.max_turns), ("sft.cache_dir", c.sft.cache_dir),
            ("rl.num_groups", c.rl.num_groups), ("rl.group_size", c.rl.group_size),
            ("rollout.snapshot_root", c.rollout.snapshot_root),
            ("metrics.timeline_every", 0), ("metrics.tensorboard", True),
            ("eval.every_steps", 1), ("eval.k", 2), ("eval.num_tasks", 2), ("eval.target", 1e-9),
        ]
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "experiments.swe_grpo", "--config=configs/cpu.py:smoke",
           f"--workdir={on}", *overrides]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]

    m_on = read_metrics(os.path.join(on, "metrics.jsonl"))
    m_off = read_metrics(os.path.join(off, "metrics.jsonl"))
    assert [m["step"] for m in m_on] == [0, 1]
    for m in m_on:
        for key in ("eval_pass@1", "eval_pass@2"):
            assert 0.0 <= m[key] <= 1.0, m
        # 2 tasks x 2 samples: pass@1 is a multiple of 1/4, pass@2 of 1/2, pass@2 >= pass@1
        assert m["eval_pass@1"] * 4 == int(m["eval_pass@1"] * 4)
        assert m["eval_pass@2"] >= m["eval_pass@1"] and m["eval_failures"] == 0
    # The target (any success; 1e-9) is reported at most once, at the first step reaching it.
    reached = [m for m in m_on if "time_to_target_s" in m]
    first = next((m for m in m_on if m["eval_pass@2"] >= 1e-9), None)
    assert reached == ([first] if first else []), reached
    assert all("eval_pass@1" not in m for m in m_off)
    assert os.listdir(os.path.join(on, "tensorboard"))
    # Training is untouched: the same rewards, an update that moved, the same parameters.
    assert [m["reward_mean"] for m in m_on] == [m["reward_mean"] for m in m_off]
    assert all(not m["update_skipped"] and m["grad_norm"] > 0 for m in m_off)
    a = load_file(os.path.join(on, "final", "model.safetensors"))
    b = load_file(os.path.join(off, "final", "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
