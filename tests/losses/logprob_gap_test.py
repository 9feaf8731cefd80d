"""Gap metric and truncated importance weight vs float64 numpy, by hand where small."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from thundersync_jax.losses import logprob_gap


def test_gap_matches_float64_over_the_masked_tokens():
    rng = np.random.default_rng(3)
    learner = -rng.uniform(0.1, 4.0, size=(3, 7))
    engine = learner + rng.normal(0, 0.3, size=(3, 7))
    mask = rng.uniform(size=(3, 7)) < 0.6
    got = logprob_gap.engine_logprob_gap(engine, learner, mask)
    d = (engine - learner)[mask]
    np.testing.assert_allclose(got["engine_logprob_gap_abs"], np.abs(d).mean(), rtol=1e-6)
    np.testing.assert_allclose(got["engine_logprob_gap_kl"], (np.exp(-d) - 1 + d).mean(), rtol=1e-5)
    np.testing.assert_allclose(got["engine_logprob_gap_max"], np.abs(d).max(), rtol=1e-6)


def test_gap_by_hand_and_zero_when_equal():
    got = logprob_gap.engine_logprob_gap(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -2.0]]))
    assert float(got["engine_logprob_gap_abs"]) == pytest.approx(0.25)
    assert float(got["engine_logprob_gap_kl"]) == pytest.approx((np.exp(-0.5) - 1 + 0.5) / 2)
    same = logprob_gap.engine_logprob_gap(jnp.full((2, 3), -0.7), jnp.full((2, 3), -0.7))
    assert float(same["engine_logprob_gap_kl"]) == 0.0
    with pytest.raises(ValueError, match="differ"):
        logprob_gap.engine_logprob_gap(jnp.zeros((2, 3)), jnp.zeros((3, 2)))


def test_truncated_weight_is_capped_ratio_and_detached():
    learner = jnp.array([-1.0, -1.0, -3.0, -0.1])
    engine = jnp.array([-1.0, -2.0, -1.0, -50.0])
    w = logprob_gap.truncated_importance_weight(learner, engine, cap=2.0)
    want = np.minimum(np.exp(np.float64(learner) - np.float64(engine)), 2.0)
    np.testing.assert_allclose(w, want, rtol=1e-6)
    grad = jax.grad(lambda x: logprob_gap.truncated_importance_weight(x, engine).sum())(learner)
    np.testing.assert_array_equal(grad, np.zeros(4))
    with pytest.raises(ValueError, match="cap must be > 0"):
        logprob_gap.truncated_importance_weight(learner, engine, cap=0.0)


def test_tokens_without_an_engine_logprob_are_left_out_and_weighted_one():
    engine = jnp.array([[-1.0, jnp.nan, -2.0]])
    learner = jnp.array([[-1.5, -0.3, -2.0]])
    sums = logprob_gap.gap_sums(engine, learner)
    assert int(sums["tokens"]) == 2 and float(sums["abs_sum"]) == pytest.approx(0.5)
    w = logprob_gap.truncated_importance_weight(learner, engine, cap=2.0)
    np.testing.assert_allclose(w, [[np.exp(-0.5), 1.0, 1.0]], rtol=1e-6)
    # A step whose engine gave no log-probs has no gap metrics (absent, never 0).
    none = logprob_gap.GapTally().add(
        logprob_gap.gap_sums(jnp.full((2, 3), jnp.nan), learner[:, :3].repeat(2, 0))
    )
    assert none.tokens == 0 and none.metrics() == {}
    folded = logprob_gap.GapTally().add(sums).add(sums)
    assert folded.metrics() == {
        "engine_logprob_gap_abs": pytest.approx(0.25),
        "engine_logprob_gap_kl": pytest.approx((np.exp(-0.5) - 1 + 0.5) / 2, rel=1e-6),
        "engine_logprob_gap_max": pytest.approx(0.5),
    }


@pytest.mark.parametrize("good", [0, 0.0, 1, 2.0, 10])
def test_tis_cap_accepts_off_or_a_cap_of_at_least_one(good):
    assert logprob_gap.check_tis_cap(good) == float(good)


@pytest.mark.parametrize("bad", ["two", True, None, [2.0]])
def test_a_tis_cap_of_another_type_is_refused(bad):
    # (ml_collections already refuses these types on a float field of a config.)
    with pytest.raises(ValueError, match=r"rl.tis_cap=.* is not valid"):
        logprob_gap.check_tis_cap(bad)


@pytest.mark.parametrize("bad", [-1.0, 0.5, float("inf"), float("nan")])
def test_a_bad_tis_cap_is_a_clear_config_error(bad):
    from configs import cpu
    from thundersync_jax import train
    from thundersync_jax.schedule.config_check import ConfigError

    c = cpu.get_config("smoke")
    c.rl.tis_cap = bad
    with pytest.raises(
        ConfigError, match=r"rl.tis_cap=.* is not valid: use 0 .* or a finite cap >= 1"
    ):
        train.check(c)


def test_tis_cap_is_accepted_on_the_segment_paths():
    """GRPO shared prompts and OPD per-turn segments apply the weight in their direct passes
    (tests/algorithms/{grpo,opd}_test.py check the update), so the config check lets it be."""
    from configs import cpu, terminal_opd_cpu
    from thundersync_jax import train

    c = cpu.get_config("smoke")
    c.rl.tis_cap, c.rl.shared_prompt = 2.0, True
    train.check(c)
    c = terminal_opd_cpu.get_config("smoke")
    c.rl.tis_cap, c.rl.opd_granularity = 2.0, "turn"
    train.check(c)
