"""Robust statistics: the trend test, the creep test, and the bootstrap interval."""

from __future__ import annotations

import numpy as np
import pytest

from traceml_ai.diagnose.stats import creep_test, kendall_tau, median, median_ratio_ci, percentile, slope_per_unit

MIB = 1024**2


def test_not_measured_values_are_ignored_not_zero() -> None:
    assert median([1.0, float("nan"), 3.0]) == 2.0
    assert median([float("nan")]) is None
    assert percentile([], 90) is None


def test_kendall_tau_sees_trend_not_noise() -> None:
    assert kendall_tau(range(50)) == pytest.approx(1.0)
    assert kendall_tau(range(50, 0, -1)) == pytest.approx(-1.0)
    assert kendall_tau([5.0] * 20) == 0.0
    noise = np.random.default_rng(1).normal(0, 1, 300)
    assert abs(kendall_tau(noise) or 0.0) < 0.15
    assert kendall_tau([1.0, 2.0]) is None


def test_creep_test_linear_growth_flat_noise_and_a_single_jump() -> None:
    t = np.arange(60, dtype=float)
    growing = creep_test(500 * MIB + t * 4 * MIB)
    assert growing is not None and growing.creeping
    assert growing.relative == pytest.approx(160 / 540, rel=0.05)
    flat = creep_test(500 * MIB + np.random.default_rng(2).normal(0, 20 * MIB, 60))
    assert flat is not None and not flat.creeping
    jump = creep_test(np.where(t < 25, 500 * MIB, 800 * MIB) + np.random.default_rng(3).normal(0, MIB, 60))
    assert jump is not None and jump.growth > 200 * MIB and not jump.continued and not jump.creeping
    small = creep_test(500 * MIB + t * 0.1 * MIB)  # 6 MiB over the run: below the absolute floor
    assert small is not None and not small.creeping
    assert creep_test([1.0] * 5) is None


def test_theil_sen_slope_ignores_outliers() -> None:
    x = np.arange(100, dtype=float)
    y = 3.0 * x + 7
    y[::10] += 1000  # spikes
    assert slope_per_unit(x, y) == pytest.approx(3.0)


def test_median_ratio_interval_covers_the_true_ratio() -> None:
    rng = np.random.default_rng(4)
    a = rng.lognormal(np.log(10), 0.1, 300)
    b = rng.lognormal(np.log(12), 0.1, 300)
    result = median_ratio_ci(a, b, confidence=0.95, resamples=1000, seed=1)
    assert result is not None
    ratio, low, high = result
    assert low < 1.2 < high and low < ratio < high
    assert high - low < 0.1
    assert median_ratio_ci([0.0] * 20, b, confidence=0.95, resamples=100, seed=1) is None
