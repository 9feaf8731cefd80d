"""Learner cost model: bucket padding and the least-squares fit."""

import numpy as np
import pytest

from thundersync_jax.sim import CostModel


def test_padding_to_buckets():
    c = CostModel(0.0, 1.0, buckets=(64, 128, 256))
    assert [c.padded(t) for t in (0, 1, 64, 65, 128, 200, 256)] == [64, 64, 64, 128, 128, 256, 256]
    # Above the largest bucket: whole multiples of it.
    assert [c.padded(t) for t in (257, 512, 513)] == [512, 512, 768]
    assert CostModel(0.0, 1.0).padded(77) == 77


def test_chunk_cost_is_affine_in_padded_tokens():
    c = CostModel(fixed_s=0.5, per_token_s=0.01, buckets=(100, 200))
    assert c.chunk_s(150) == pytest.approx(0.5 + 0.01 * 200)
    assert c.chunk_s(30) == pytest.approx(0.5 + 0.01 * 100)


def test_fit_recovers_parameters_exactly_without_noise():
    samples = [(t, 0.02 + 3e-5 * t) for t in (128, 256, 512, 1024, 2048)]
    c = CostModel.fit(samples, opt_s=0.3, pub_s=0.1)
    assert c.fixed_s == pytest.approx(0.02, rel=1e-9)
    assert c.per_token_s == pytest.approx(3e-5, rel=1e-9)
    assert (c.opt_s, c.pub_s) == (0.3, 0.1)


def test_fit_recovers_parameters_from_noisy_timings():
    rng = np.random.default_rng(0)
    tokens = rng.integers(64, 4096, size=400)
    seconds = 0.05 + 2e-5 * tokens + rng.normal(0, 2e-3, size=tokens.size)
    c = CostModel.fit(zip(tokens, seconds, strict=True))
    assert c.fixed_s == pytest.approx(0.05, rel=0.05)
    assert c.per_token_s == pytest.approx(2e-5, rel=0.02)


def test_fit_pads_samples_with_the_buckets():
    # Timings really depend on the padded count; fitting on it recovers the line.
    c0 = CostModel(0.1, 1e-3, buckets=(256, 512, 1024))
    samples = [(t, c0.chunk_s(t)) for t in (100, 300, 700, 1000, 200)]
    c = CostModel.fit(samples, buckets=(256, 512, 1024))
    assert (c.fixed_s, c.per_token_s) == pytest.approx((0.1, 1e-3))


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="distinct padded token counts"):
        CostModel.fit([(100, 1.0), (100, 1.1)])
    with pytest.raises(ValueError, match="fixed_s=-1"):
        CostModel(-1, 0.0)
    with pytest.raises(ValueError, match="strictly ascending"):
        CostModel(0.0, 0.0, buckets=(256, 128))
    with pytest.raises(ValueError, match="tokens=-3"):
        CostModel(0.0, 0.0).padded(-3)


def test_row_padding_area_and_fit():
    c = CostModel(0.2, 0.001, buckets=(16, 32, 64), row_padding=True)
    assert c.padded_area([10]) == 16
    assert c.padded_area([10, 40]) == 2 * 64
    assert c.padded_area([1, 1, 1]) == 4 * 16
    assert CostModel(0.2, 0.001, buckets=(16, 32, 64)).padded_area([10, 40]) == 64
    areas = [c.padded_area(lens) for lens in ([10], [40], [10, 40], [3, 3, 3, 3, 3])]
    fitted = CostModel.fit(
        [(a, 0.2 + 0.001 * a) for a in areas], buckets=(16, 32, 64), row_padding=True
    )
    assert fitted.fixed_s == pytest.approx(0.2)
    assert fitted.per_token_s == pytest.approx(0.001)
    assert fitted.row_padding
    with pytest.raises(ValueError, match="at least one"):
        c.padded_area([])
