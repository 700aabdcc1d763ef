"""Small, robust statistics the rules and the comparison share (pure functions over numpy arrays).

NaN marks "not measured" inside these arrays; every function ignores NaN rather than treating it
as 0. Nothing here reads files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from traceml_ai.diagnose import thresholds as th

FloatArray = npt.NDArray[np.float64]

_TAU_MAX_POINTS = 400
"""Kendall's tau is O(n²); longer series are thinned evenly to this many points first."""

_BOOTSTRAP_MAX_POINTS = 2000
"""A series is thinned evenly to this many points before resampling, to bound memory and time; a
few thousand points already pin a median down far tighter than the equivalence margin."""

_BOOTSTRAP_CHUNK = 250


def finite(values: npt.ArrayLike) -> FloatArray:
    """``values`` as float64 with NaN/inf (not measured) dropped."""
    arr: FloatArray = np.asarray(values, dtype=np.float64).ravel()
    kept: FloatArray = arr[np.isfinite(arr)]
    return kept


def median(values: npt.ArrayLike) -> float | None:
    """Median of the measured values, None when there are none."""
    arr = finite(values)
    return float(np.median(arr)) if arr.size else None


def percentile(values: npt.ArrayLike, q: float) -> float | None:
    """``q``-th percentile (0..100, linear interpolation) of the measured values, None when none."""
    arr = finite(values)
    return float(np.percentile(arr, q)) if arr.size else None


def thin(values: FloatArray, max_points: int) -> FloatArray:
    """At most ``max_points`` evenly spaced elements of ``values``, in order."""
    if values.size <= max_points:
        return values
    idx = np.linspace(0, values.size - 1, max_points).round().astype(np.int64)
    kept: FloatArray = values[idx]
    return kept


def kendall_tau(series: npt.ArrayLike) -> float | None:
    """Kendall's tau-a between position and value of an ordered series (NaN dropped).

    +1: every later point is higher; 0: no trend (or all equal, ties count as neither);
    -1: every later point is lower. None for fewer than 3 points.
    """
    y = thin(finite(series), _TAU_MAX_POINTS)
    n = y.size
    if n < 3:
        return None
    diff = np.sign(y[None, :] - y[:, None])  # [i, j] = sign(y_j - y_i)
    upper = np.triu(diff, k=1)
    return float(upper.sum() / (n * (n - 1) / 2))


@dataclass(frozen=True)
class CreepTest:
    """The memory-creep test of one series (docs/diagnoses.md, "memory creep").

    ``early``/``middle``/``late`` are the medians of the three equal windows (bytes), ``growth`` late
    minus early (bytes), ``relative`` growth over early, ``tau`` Kendall's tau of the series,
    ``continued`` whether both halves of the growth carry at least
    :data:`~traceml_ai.diagnose.thresholds.CREEP_MIN_CONTINUATION` of it, ``creeping`` the verdict.
    """

    points: int
    early: float
    middle: float
    late: float
    growth: float
    relative: float
    tau: float
    continued: bool
    creeping: bool


def creep_test(series: npt.ArrayLike) -> CreepTest | None:
    """Does an ordered series of memory sizes (bytes) grow steadily? None when it has under
    :data:`~traceml_ai.diagnose.thresholds.MIN_CREEP_SAMPLES` measured points.

    Creeping means all of: the late window's median exceeds the early window's by at least
    ``CREEP_MIN_GROWTH`` (relative) and ``CREEP_MIN_BYTES`` (absolute); Kendall's tau is at least
    ``CREEP_MIN_TAU``; and the growth continues through the middle window (not a one-time jump).
    """
    y = finite(series)
    n = y.size
    if n < th.MIN_CREEP_SAMPLES:
        return None
    third = n // 3
    early = float(np.median(y[:third]))
    middle = float(np.median(y[third : n - third]))
    late = float(np.median(y[n - third :]))
    growth = late - early
    relative = growth / early if early > 0 else (math.inf if growth > 0 else 0.0)
    tau = kendall_tau(y) or 0.0
    continued = growth > 0 and min(middle - early, late - middle) >= th.CREEP_MIN_CONTINUATION * growth
    creeping = (
        relative >= th.CREEP_MIN_GROWTH
        and growth >= th.CREEP_MIN_BYTES
        and tau >= th.CREEP_MIN_TAU
        and continued
    )
    return CreepTest(n, early, middle, late, growth, relative, tau, continued, creeping)


def slope_per_unit(x: npt.ArrayLike, y: npt.ArrayLike) -> float | None:
    """Theil–Sen slope of y over x (median of pairwise slopes), robust to outliers; None if undefined."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    if xa.size > _TAU_MAX_POINTS:
        idx = np.linspace(0, xa.size - 1, _TAU_MAX_POINTS).round().astype(np.int64)
        xa, ya = xa[idx], ya[idx]
    if xa.size < 2:
        return None
    dx = xa[None, :] - xa[:, None]
    dy = ya[None, :] - ya[:, None]
    mask = np.triu(np.ones_like(dx, dtype=bool), k=1) & (dx != 0)
    if not mask.any():
        return None
    return float(np.median(dy[mask] / dx[mask]))


def _block_length(n: int) -> int:
    # n^(1/3) is the usual order of the block length for the median of a weakly dependent series
    # (step times and memory are autocorrelated, so plain i.i.d. resampling would be too confident).
    length: float = float(n) ** (1.0 / 3.0)
    return max(1, round(length))


def _block_bootstrap_medians(values: FloatArray, resamples: int, rng: np.random.Generator) -> FloatArray:
    """Medians of ``resamples`` circular block-bootstrap resamples of an ordered series."""
    y = thin(values, _BOOTSTRAP_MAX_POINTS)
    n = y.size
    length = _block_length(n)
    blocks = math.ceil(n / length)
    offsets = np.arange(length)
    out = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, _BOOTSTRAP_CHUNK):
        count = min(_BOOTSTRAP_CHUNK, resamples - start)
        starts = rng.integers(0, n, size=(count, blocks))
        idx = ((starts[:, :, None] + offsets) % n).reshape(count, blocks * length)[:, :n]
        out[start : start + count] = np.median(y[idx], axis=1)
    return out


def median_ratio_ci(
    a: npt.ArrayLike, b: npt.ArrayLike, *, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float] | None:
    """Ratio of medians ``median(b) / median(a)`` with its bootstrap confidence interval.

    Each run's ordered samples are resampled by circular block bootstrap (blocks of ~n^(1/3)
    consecutive samples keep the autocorrelation of a training run), the two are resampled
    independently, and the interval is the percentile interval of the resampled ratios.
    Returns ``(ratio, low, high)``, or None when either run has no measured value or
    ``median(a)`` is 0 (no ratio exists).
    """
    xa, xb = finite(a), finite(b)
    if not xa.size or not xb.size:
        return None
    ma, mb = float(np.median(xa)), float(np.median(xb))
    if ma <= 0:
        return None
    rng = np.random.default_rng(seed)
    meds_a = _block_bootstrap_medians(xa, resamples, rng)
    meds_b = _block_bootstrap_medians(xb, resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = meds_b / meds_a
    ratios = np.where(meds_a > 0, ratios, np.inf)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return mb / ma, float(low), float(high)
