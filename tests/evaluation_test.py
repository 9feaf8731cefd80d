"""Held-out evaluation in the loop: the pass@k estimator, and a run with evaluation on that
writes eval_pass@1 / eval_pass@2 per step while training exactly as it would without it.

The run is the session's `deterministic_run` (tests/conftest.py, EVAL_FLAGS): it evaluates
after every step, and the runs that must reproduce its bits do not evaluate
(tests/train_deterministic_test.py's `group` run, tests/train_multiprocess_test.py's 2-process
run), so their bitwise comparisons prove that evaluation leaves training unchanged: one run
instead of an evaluating and a non-evaluating one here (82 CPU-s, BENCHMARKS.md "Test suite")."""

import itertools
import json
import math
import os

import pytest

from thundersync_jax import evaluation
from thundersync_jax.metrics import read_metrics


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


@pytest.mark.slow
def test_eval_every_step_writes_pass_at_k(deterministic_run):
    run = deterministic_run()
    with open(os.path.join(run, "config.json")) as f:
        ev = json.load(f)["eval"]
    assert (ev["every_steps"], ev["k"], ev["num_tasks"], ev["target"]) == (1, 2, 2, 1e-9), ev
    metrics = read_metrics(os.path.join(run, "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in ("eval_pass@1", "eval_pass@2"):
            assert 0.0 <= m[key] <= 1.0, m
        # 2 tasks x 2 samples: pass@1 is a multiple of 1/4, pass@2 of 1/2, pass@2 >= pass@1
        assert m["eval_pass@1"] * 4 == int(m["eval_pass@1"] * 4)
        assert m["eval_pass@2"] * 2 == int(m["eval_pass@2"] * 2)
        assert m["eval_pass@2"] >= m["eval_pass@1"] and m["eval_failures"] == 0
        # Training went on: an update that moved, every step (the runs that reproduce these
        # bits without evaluating are the comparison; see the module docstring).
        assert not m["update_skipped"] and m["grad_norm"] > 0
    # The target (any success; 1e-9) is reported at most once, at the first step reaching it.
    reached = [m for m in metrics if "time_to_target_s" in m]
    first = next((m for m in metrics if m["eval_pass@2"] >= 1e-9), None)
    assert reached == ([first] if first else []), reached
    assert os.listdir(os.path.join(run, "tensorboard"))
    assert os.listdir(os.path.join(run, "eval", "verdicts"))  # the held-out tasks were verified
