"""Step progress bar."""

import io

from thundersync_jax import metrics


def test_progress_shows_reward_and_step_time():
    out = io.StringIO()
    with metrics.StepProgress(total=3, desc="grpo", file=out, mininterval=0) as bar:
        first = bar.update({"reward_mean": 0.5, "step_time_s": 2.0})
        second = bar.update({"reward_mean": 0.25, "step_time_s": 4.0})
        third = bar.update({"tokens": 10})  # no reward or time: nothing to show
        assert bar.n == 3
    assert first == {"reward": "0.500", "step_s": "2.00", "mean_step_s": "2.00"}
    assert second == {"reward": "0.250", "step_s": "4.00", "mean_step_s": "3.00"}
    assert third == {}
    text = out.getvalue()
    assert "grpo" in text and "3/3" in text and "reward=0.250" in text
