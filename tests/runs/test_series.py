"""Downsampling, EMA and relative time (003 seed, architecture decisions)."""

from __future__ import annotations

import numpy as np
import pytest

from traceml_ai.runs.series import bucket_width, downsample_indices, ema


def test_short_series_is_kept_whole() -> None:
    y = np.array([1.0, 2.0, np.nan, 4.0])
    assert downsample_indices(y, 10).tolist() == [0, 1, 2, 3]


def test_downsampling_keeps_budget_extremes_ends_and_gaps() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=100_000)
    y[12_345] = 50.0  # a spike
    y[77_777] = -50.0  # a dip
    y[40_000:40_010] = np.nan  # a gap
    idx = downsample_indices(y, 2000)
    assert len(idx) <= 2000
    assert idx[0] == 0 and idx[-1] == len(y) - 1
    assert 12_345 in idx and 77_777 in idx
    assert np.isnan(y[idx]).any(), "the gap must survive"
    assert np.all(np.diff(idx) > 0)


def test_downsampling_is_not_every_nth_point() -> None:
    y = np.zeros(10_000)
    y[5001] = 1.0
    assert 5001 in downsample_indices(y, 100)


def test_extremes_are_stable_as_the_run_grows() -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(size=21_000)
    width = bucket_width(20_000, 1000)
    assert width == bucket_width(21_000, 1000)  # a power of two: changes only when the run doubles
    before = set(downsample_indices(y[:20_000], 1000).tolist())
    after = set(downsample_indices(y, 1000).tolist())
    full = (20_000 // width) * width
    # Every full bucket of the shorter series picks the same points after the run grew.
    assert {i for i in before if 0 < i < full} <= after


def test_downsampling_is_deterministic() -> None:
    y = np.random.default_rng(2).normal(size=50_000)
    assert downsample_indices(y, 500).tolist() == downsample_indices(y.copy(), 500).tolist()


def test_ema_is_debiased_and_keeps_gaps() -> None:
    y = np.array([1.0, 1.0, np.nan, 1.0])
    out = ema(y, 0.9)
    assert out[0] == pytest.approx(1.0)  # debiased: not 0.1
    assert np.isnan(out[2]) and out[3] == pytest.approx(1.0)
    assert ema(y, 0.0).tolist()[:2] == [1.0, 1.0]
    with pytest.raises(ValueError):
        ema(y, 1.0)


def test_ema_smooths_a_step() -> None:
    y = np.array([0.0] * 5 + [10.0] * 5)
    out = ema(y, 0.5)
    assert out[4] == pytest.approx(0.0) and 0 < out[5] < 10 and out[9] > out[5]
