"""Arrival traces: JSONL round trip, validation, lognormal generator statistics."""

import json

import numpy as np
import pytest

from thundersync_jax import sim
from thundersync_jax.sim import Arrival


def _log_durations(trace, num_groups, group_size):
    return np.log([a.arrival_s for a in trace]).reshape(num_groups, group_size)


def _anova_icc(x):
    """One-way random-effects ICC(1) of a [groups, members] array."""
    k, g = x.shape
    msb = g * np.var(x.mean(axis=1), ddof=1)
    msw = np.mean(np.var(x, axis=1, ddof=1))
    between = (msb - msw) / g
    return between / (between + msw)


@pytest.mark.parametrize("sigma,icc", [(0.7, 0.4), (1.2, 0.0), (0.5, 0.8)])
def test_lognormal_recovers_sigma_icc_and_mean(sigma, icc):
    k, g = 500, 8
    trace = sim.lognormal_trace(k, g, sigma=sigma, group_icc=icc, mean_s=30.0, seed=11)
    x = _log_durations(trace, k, g)
    assert np.std(x, ddof=1) == pytest.approx(sigma, rel=0.06)
    assert _anova_icc(x) == pytest.approx(icc, abs=0.06)
    durations = np.exp(x)
    # The sample mean of a lognormal is noisy for large sigma: allow 4 standard errors.
    se = np.std(durations) / np.sqrt(durations.size)
    assert abs(durations.mean() - 30.0) < 4 * se


def test_tokens_track_duration_and_rewards_are_binary():
    trace = sim.lognormal_trace(200, 8, sigma=0.8, group_icc=0.3, mean_s=30.0, seed=2)
    d = np.log([a.arrival_s for a in trace])
    n = np.log([a.tokens for a in trace])
    assert np.corrcoef(d, n)[0, 1] > 0.85
    assert np.mean([a.tokens for a in trace]) == pytest.approx(1024, rel=0.1)
    assert {a.reward for a in trace} == {0.0, 1.0}
    assert [(a.group, a.member) for a in trace[:3]] == [(0, 0), (0, 1), (0, 2)]


def test_icc_one_gives_equal_durations_within_a_group():
    trace = sim.lognormal_trace(5, 4, sigma=1.0, group_icc=1.0, mean_s=3.0, seed=0)
    x = _log_durations(trace, 5, 4)
    np.testing.assert_allclose(x, x[:, :1].repeat(4, axis=1))


def test_same_seed_same_trace():
    a = sim.lognormal_trace(3, 3, 0.5, 0.2, 10.0, seed=4)
    assert a == sim.lognormal_trace(3, 3, 0.5, 0.2, 10.0, seed=4)
    assert a != sim.lognormal_trace(3, 3, 0.5, 0.2, 10.0, seed=5)


def test_jsonl_round_trip_with_steps(tmp_path):
    path = tmp_path / "trace.jsonl"
    s0 = sim.lognormal_trace(2, 3, 0.5, 0.2, 10.0, seed=0, step=0)
    s1 = sim.lognormal_trace(2, 3, 0.5, 0.2, 10.0, seed=1, step=1)
    sim.write_trace(path, s0)
    sim.write_trace(path, s1, append=True)
    lines = path.read_text().splitlines()
    assert len(lines) == 12
    assert set(json.loads(lines[0])) == {
        "step",
        "traj_id",
        "group",
        "member",
        "arrival_s",
        "tokens",
        "reward",
    }
    assert sim.read_trace(path) == s0 + s1
    assert sim.read_trace(path, step=1) == s1
    assert sim.split_steps(sim.read_trace(path)) == {0: s0, 1: s1}


def test_bad_trace_records_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"traj_id": 0, "group": 0}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a trace record"):
        sim.read_trace(path)
    ok = Arrival(0, 0, 0, 1.0, 10, 1.0)
    with pytest.raises(ValueError, match="arrival_s=-1.0"):
        sim.validate_trace([ok._replace(arrival_s=-1.0)])
    with pytest.raises(ValueError, match="mixes steps"):
        sim.validate_trace([ok, Arrival(1, 0, 1, 1.0, 10, 1.0, step=3)])
    with pytest.raises(ValueError, match="group=0 member=0 appears twice"):
        sim.validate_trace([ok, ok._replace(traj_id=1)])
    with pytest.raises(ValueError, match="group_icc=1.5"):
        sim.lognormal_trace(2, 2, 1.0, 1.5, 1.0, 0)


def test_a_rewritten_step_replaces_the_earlier_block(tmp_path):
    # A resumed run re-exports step 1: the reader keeps the later block only.
    path = tmp_path / "sub" / "trace.jsonl"  # parent directories are created
    first = sim.lognormal_trace(2, 2, 0.5, 0.2, 10.0, seed=0, step=0)
    stale = sim.lognormal_trace(2, 2, 0.5, 0.2, 10.0, seed=1, step=1)
    redo = sim.lognormal_trace(2, 2, 0.5, 0.2, 10.0, seed=2, step=1)
    for block in (first, stale, redo):
        sim.write_trace(path, block, append=True)
    assert sim.read_trace(path, step=1) == redo
    assert sim.read_trace(path) == first + redo
