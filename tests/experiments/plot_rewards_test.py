"""experiments.plot_rewards: reward and held-out pass@k read from a metrics.jsonl and drawn."""

import json

import numpy as np

from experiments import plot_rewards


def _write(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_eval_curves_are_read_only_at_evaluated_steps_and_drawn(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "reward_mean": 0.1 * s} for s in range(6)]
    for row in rows[2::3]:  # eval.every_steps=3: after steps 2 and 5
        row.update({"eval_pass@1": row["step"] / 10, "eval_pass@2": row["step"] / 8})
    rows.append({"step": 5, "reward_mean": 0.55, "eval_pass@1": 0.6, "eval_pass@2": 0.7})  # rerun
    _write(metrics, rows)
    steps, rewards = plot_rewards.read_rewards(str(metrics))
    np.testing.assert_allclose(rewards, [0.0, 0.1, 0.2, 0.3, 0.4, 0.55])
    evals = plot_rewards.read_eval(str(metrics))
    assert sorted(evals) == ["eval_pass@1", "eval_pass@2"]
    at, values = evals["eval_pass@1"]
    assert at.tolist() == [2, 5] and values.tolist() == [0.2, 0.6]  # the last line of a step
    out = tmp_path / "curve.png"
    plot_rewards.plot(steps, rewards, 2, str(out), "t", evals)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_evaluation_has_no_eval_curves(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [{"step": 0, "reward_mean": 0.5}])
    assert plot_rewards.read_eval(str(metrics)) == {}
