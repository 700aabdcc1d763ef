"""Series math for plots (003 seed, "Architecture decisions": min/max-preserving downsampling;
DESIGN §4): min/max downsampling and the debiased EMA. Pure numpy functions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads on the first series, not with every importer of DEFAULT_MAX_POINTS
    import numpy as np
    from numpy.typing import NDArray

    FloatArray = NDArray[np.float64]

DEFAULT_MAX_POINTS = 5000


def bucket_width(n: int, max_points: int) -> int:
    """The bucket width (a power of two) used for ``n`` points and a budget of ``max_points``.

    A power of two only changes when the series doubles, and buckets start at index 0, so the
    points chosen for the full buckets of a growing run stay the same between updates.
    """
    buckets = max(1, (max_points - 2) // 3)
    width = 1
    while math.ceil(n / width) > buckets:
        width *= 2
    return width


def downsample_indices(y: FloatArray, max_points: int = DEFAULT_MAX_POINTS) -> NDArray[np.intp]:
    """Indices of the points to keep so that ``len(result) <= max_points``.

    Min/max buckets (003 seed): each bucket keeps its smallest and largest value and, when it holds a
    gap (NaN), its first gap, so gaps survive; the first and last points are always kept; never
    every Nth point. Deterministic: the same input gives the same indices.

    Args:
        y: values, NaN for a gap (shape ``(n,)``).
        max_points: the budget, at least 5.

    Raises:
        ValueError: ``max_points`` below 5.
    """
    import numpy as np

    if max_points < 5:
        raise ValueError("max_points must be at least 5")
    n = int(y.shape[0])
    if n <= max_points:
        return np.arange(n, dtype=np.intp)
    width = bucket_width(n, max_points)
    full = (n // width) * width
    nan = np.isnan(y)
    low = np.where(nan, np.inf, y)
    high = np.where(nan, -np.inf, y)
    parts: list[NDArray[np.intp]] = [np.array([0, n - 1], dtype=np.intp)]
    if full:
        starts = np.arange(0, full, width, dtype=np.intp)
        parts.append(starts + low[:full].reshape(-1, width).argmin(axis=1))
        parts.append(starts + high[:full].reshape(-1, width).argmax(axis=1))
        gaps = nan[:full].reshape(-1, width)
        has_gap = gaps.any(axis=1)
        parts.append((starts + gaps.argmax(axis=1))[has_gap])
    if full < n:  # the last, partial bucket
        tail = slice(full, n)
        parts.append(np.array([full + int(low[tail].argmin()), full + int(high[tail].argmax())], dtype=np.intp))
        if nan[tail].any():
            parts.append(np.array([full + int(nan[tail].argmax())], dtype=np.intp))
    return np.unique(np.concatenate(parts))


def ema(y: FloatArray, weight: float) -> FloatArray:
    """Debiased exponential moving average (TensorBoard's smoothing), gaps kept as gaps.

    ``s_t = w·s_{t-1} + (1-w)·y_t`` over the finite values, divided by ``1 - w^k`` (k = finite values
    so far) so the start is not pulled towards 0. NaN inputs give NaN outputs and do not move the
    average. ``weight`` 0 returns a copy of ``y``.

    Raises:
        ValueError: ``weight`` outside [0, 1).
    """
    import numpy as np

    if not 0.0 <= weight < 1.0:
        raise ValueError(f"EMA weight must be in [0, 1), got {weight}")
    values = np.asarray(y, dtype=np.float64)
    if weight == 0.0:
        return np.array(values, dtype=np.float64, copy=True)
    out: list[float] = []
    acc = 0.0
    debias = 1.0  # weight ** (finite values so far)
    nan = math.nan
    for v in values.tolist():  # a plain-float loop: numpy item access would be slower
        if v - v == 0.0:  # finite
            acc = acc * weight + (1.0 - weight) * v
            debias *= weight
            out.append(acc / (1.0 - debias))
        else:
            out.append(nan)
    return np.array(out, dtype=np.float64)
