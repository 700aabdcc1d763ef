"""Run-level chart data: bar, scatter and box plots, and the data behind line charts (003 seed,
"Exporting chart data" and "Decisions made where the spec was ambiguous"; ``docs/viewer-api.md``,
"POST /api/chart"; DESIGN §4).

Pure functions over ``list[RunSummary]`` and already-read ``metrics.jsonl`` histories. The web API,
the PNG/CSV exports of the viewer and ``traceml plot`` all call these, so a chart, its PNG and its
CSV always show the same numbers.

- A value is charted when :func:`~traceml_ai.runs.table.cell` gives a finite number for it (an int or
  a float, not a bool). Text, booleans, null, NaN and ±inf are left out. Log axes are the page's (or
  the PNG renderer's) business: values are never transformed here.
- Group labels are those of :func:`~traceml_ai.runs.table.group_runs`: tags joined with ``", "``, the
  ``(none)`` group last.
- Quartiles use linear interpolation between the closest ranks (numpy's default ``linear`` method);
  whiskers end at the most extreme values within 1.5×IQR of the quartiles, values beyond are outliers.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

import numpy as np
from numpy.typing import NDArray

from traceml_ai.runs.metrics_tail import MetricsTail, Series
from traceml_ai.runs.model import RunSummary, Scalar
from traceml_ai.runs.series import DEFAULT_MAX_POINTS, downsample_indices, ema
from traceml_ai.runs.table import ColumnError, cell, format_cell, group_runs, is_number, validate_column

FloatArray = NDArray[np.float64]

ChartKind = Literal["line", "bar", "scatter", "box"]
XAxis = Literal["step", "epoch", "time"]
Band = Literal["minmax", "std"]
"""The band around a group's mean line (Plot by groups): its min–max range or mean ± std."""
BANDS: Final[tuple[Band, ...]] = ("minmax", "std")

CHART_KINDS: Final = ("line", "bar", "scatter", "box")
X_AXES: Final = ("step", "epoch", "time")
BAR_LIMIT: Final = 60
"""Bars drawn at most (003 seed); the CSV export holds all of them."""
MAX_LINE_RUNS: Final = 30
"""Runs whose series one line chart may show (003 seed, "Limitations")."""
MAX_GROUP_LINE_RUNS: Final = 2000
"""Runs a line chart by groups (``group_by``) may average: its means and bands cover all of them."""
MAX_LINE_METRICS: Final = 16
MAX_CHART_RUNS: Final = 100_000
ALL_RUNS_LABEL: Final = "all runs"
"""Label of the single group of a box plot without ``group_by``."""
WHISKER_IQR: Final = 1.5


class ChartSpecError(ValueError):
    """A chart request that cannot be drawn; the message is one line naming the field and the fix."""


# -- specs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineSpec:
    """A line chart: the history of ``metrics`` for the runs ``keys``.

    Attributes:
        x: ``step``, ``epoch`` or ``time`` (seconds since the run's first logged time).
        ema: debiased EMA weight in [0, 1); 0 draws no smoothed line.
        log_y: logarithmic y axis (PNG only; the data are not transformed).
        group_by: draw one mean line per group of this column instead of one line per run.
        band: with ``group_by``, the band drawn around each mean (``minmax`` or ``std``, as the
            page's band setting); the chart CSV holds both.
    """

    keys: tuple[str, ...]
    metrics: tuple[str, ...]
    x: XAxis = "step"
    ema: float = 0.0
    log_y: bool = False
    group_by: str | None = None
    band: Band = "minmax"
    kind: Literal["line"] = "line"


@dataclass(frozen=True)
class BarSpec:
    """A bar chart of column ``field``: one bar per run, or with ``group_by`` one bar per group
    (the mean, with the group's min and max)."""

    keys: tuple[str, ...]
    field: str
    group_by: str | None = None
    kind: Literal["bar"] = "bar"


@dataclass(frozen=True)
class ScatterSpec:
    """A scatter plot of ``y_field`` against ``x_field``; optional point size and colour columns;
    ``group_by`` (Plot by groups): the chart CSV holds each group's mean ± std instead of the points."""

    keys: tuple[str, ...]
    x_field: str
    y_field: str
    size_field: str | None = None
    color_field: str | None = None
    log_x: bool = False
    log_y: bool = False
    group_by: str | None = None
    kind: Literal["scatter"] = "scatter"


@dataclass(frozen=True)
class BoxSpec:
    """A box plot of ``field``, one box per group of ``group_by`` (one box of all runs without)."""

    keys: tuple[str, ...]
    field: str
    group_by: str | None = None
    kind: Literal["box"] = "box"


ChartSpec = LineSpec | BarSpec | ScatterSpec | BoxSpec

_SPEC_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "line": ("keys", "metrics", "x", "ema", "log_y", "group_by", "band"),
    "bar": ("keys", "field", "group_by"),
    "scatter": ("keys", "x_field", "y_field", "size_field", "color_field", "log_x", "log_y", "group_by"),
    "box": ("keys", "field", "group_by"),
}


def parse_chart_spec(obj: Mapping[str, Any]) -> ChartSpec:
    """Validate a chart request body (``docs/viewer-api.md``, "Actions" and "POST /api/chart").

    ``obj["chart"]`` names the kind; the other fields are those of :class:`LineSpec`,
    :class:`BarSpec`, :class:`ScatterSpec` or :class:`BoxSpec`. ``format`` (export only) is ignored
    here; any other unknown field is an error. Column names are checked with
    :func:`~traceml_ai.runs.table.validate_column`; whether runs have them is not.

    Raises:
        ChartSpecError: a missing, unknown or mistyped field (one line naming it).
    """
    if not isinstance(obj, Mapping):
        raise ChartSpecError("a chart spec must be a JSON object")
    kind = obj.get("chart")
    if kind not in CHART_KINDS:
        raise ChartSpecError(f"chart must be one of {', '.join(CHART_KINDS)}, got {kind!r}")
    allowed = {"chart", "format", *_SPEC_FIELDS[kind]}
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise ChartSpecError(
            f"unknown field(s) for a {kind} chart: {', '.join(unknown)}; known: {', '.join(_SPEC_FIELDS[kind])}"
        )
    if kind == "line":
        limit = MAX_GROUP_LINE_RUNS if obj.get("group_by") is not None else MAX_LINE_RUNS
    else:
        limit = MAX_CHART_RUNS
    keys = _str_list(obj, "keys", limit=limit)
    if kind == "line":
        metrics = _str_list(obj, "metrics", limit=MAX_LINE_METRICS)
        if not metrics:
            raise ChartSpecError("a line chart needs at least one metric in 'metrics'")
        x = obj.get("x", "step")
        if x not in X_AXES:
            raise ChartSpecError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
        weight = obj.get("ema", 0.0)
        if weight is None:
            weight = 0.0
        if not is_number(weight) or not 0.0 <= float(weight) < 1.0:
            raise ChartSpecError(f"ema must be a number in [0, 1), got {weight!r}")
        band = obj.get("band") or "minmax"
        if band not in BANDS:
            raise ChartSpecError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
        return LineSpec(
            keys=keys,
            metrics=metrics,
            x=x,
            ema=float(weight),
            log_y=_bool(obj, "log_y"),
            group_by=_column(obj, "group_by", required=False),
            band=band,
        )
    if kind == "bar":
        return BarSpec(keys, _req_column(obj, "field"), _column(obj, "group_by", required=False))
    if kind == "scatter":
        return ScatterSpec(
            keys,
            _req_column(obj, "x_field"),
            _req_column(obj, "y_field"),
            _column(obj, "size_field", required=False),
            _column(obj, "color_field", required=False),
            _bool(obj, "log_x"),
            _bool(obj, "log_y"),
            _column(obj, "group_by", required=False),
        )
    return BoxSpec(keys, _req_column(obj, "field"), _column(obj, "group_by", required=False))


def _str_list(obj: Mapping[str, Any], name: str, *, limit: int) -> tuple[str, ...]:
    value = obj.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ChartSpecError(f"{name} must be a list of non-empty strings")
    if len(value) > limit:
        raise ChartSpecError(f"{name} holds {len(value)} entries; at most {limit} are allowed")
    return tuple(dict.fromkeys(value))


def _bool(obj: Mapping[str, Any], name: str) -> bool:
    value = obj.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ChartSpecError(f"{name} must be true or false, got {value!r}")
    return value


def _column(obj: Mapping[str, Any], name: str, *, required: bool) -> str | None:
    value = obj.get(name)
    if value is None or value == "":
        if required:
            raise ChartSpecError(f"{name} is required (a column such as run.best.val/auc)")
        return None
    if not isinstance(value, str):
        raise ChartSpecError(f"{name} must be a column name, got {value!r}")
    try:
        return validate_column(value)
    except ColumnError as err:
        raise ChartSpecError(f"{name}: {err}") from None


def _req_column(obj: Mapping[str, Any], name: str) -> str:
    column = _column(obj, name, required=True)
    assert column is not None
    return column


# -- values and statistics -------------------------------------------------------------------------


def numeric(value: Any) -> float | None:
    """``value`` when it is a finite int or float (not a bool; an int stays an int, so CSV cells
    read as written), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ascending ``sorted_values`` by linear interpolation between the
    closest ranks, like ``numpy.quantile(..., method="linear")``.

    Raises:
        ValueError: ``sorted_values`` is empty or ``q`` is outside [0, 1].
    """
    if not sorted_values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    return a + (h - lo) * (b - a)


@dataclass(frozen=True)
class BoxStats:
    """Five numbers of a box plot and the outlier fences.

    ``low``/``high`` are the whisker ends: the smallest and largest values within
    ``[q1 - 1.5·IQR, q3 + 1.5·IQR]``; values outside the fences are outliers.
    """

    n: int
    q1: float
    median: float
    q3: float
    low: float
    high: float
    fence_low: float
    fence_high: float

    def is_outlier(self, value: float) -> bool:
        """True when ``value`` lies beyond a fence."""
        return value < self.fence_low or value > self.fence_high


def box_stats(values: Iterable[float]) -> BoxStats:
    """Quartiles, whiskers and fences of finite ``values``.

    Raises:
        ValueError: no values.
    """
    ordered = sorted(values)
    q1, median, q3 = quantile(ordered, 0.25), quantile(ordered, 0.5), quantile(ordered, 0.75)
    iqr = q3 - q1
    fence_low, fence_high = q1 - WHISKER_IQR * iqr, q3 + WHISKER_IQR * iqr
    inside = [v for v in ordered if fence_low <= v <= fence_high]
    # The quartiles lie between data values, so at least one value is inside the fences.
    return BoxStats(len(ordered), q1, median, q3, inside[0], inside[-1], fence_low, fence_high)


def group_labels(runs: Iterable[RunSummary], column: str) -> tuple[list[str], dict[str, str]]:
    """``(labels in group order, run key → label)`` for grouping by ``column`` (as the table groups).

    Raises:
        ColumnError: invalid column.
    """
    groups = group_runs(runs, column)
    return [g.label for g in groups], {r.key: g.label for g in groups for r in g.runs}


# -- chart data (the shapes of docs/viewer-api.md, "POST /api/chart") -------------------------------


class Bar(TypedDict):
    key: str | None
    label: str
    value: float
    min: float | None
    max: float | None
    n: int
    group: str | None


class BarData(TypedDict):
    bars: list[Bar]
    total: int
    limit: int
    dropped: int


class ScatterPoint(TypedDict):
    key: str
    label: str
    x: float
    y: float
    size: float | None
    group: str | None


class ScatterData(TypedDict):
    points: list[ScatterPoint]
    dropped: int


class BoxPoint(TypedDict):
    key: str
    label: str
    value: float
    outlier: bool


class BoxGroup(TypedDict):
    label: str
    n: int
    q1: float
    median: float
    q3: float
    low: float
    high: float
    points: list[BoxPoint]


class BoxData(TypedDict):
    groups: list[BoxGroup]
    dropped: int


def bar_data(
    runs: Sequence[RunSummary],
    field: str,
    group_by: str | None = None,
    limit: int = BAR_LIMIT,
    *,
    group_mean: bool = True,
) -> BarData:
    """Bars of column ``field``.

    Without ``group_by``: one bar per run with a value, in the order given (``key`` and ``label`` =
    the run's key and name, ``n`` 1, ``min``/``max``/``group`` None). With ``group_by`` (and
    ``group_mean``): one bar per group in group order, ``key`` None, ``label`` = ``group`` = the
    group label, ``value`` the mean, ``min``/``max`` over the group, ``n`` its runs with a value; a
    group without values gets no bar. With ``group_by`` and ``group_mean=False``: one bar per run,
    ``group`` set (for colour).

    Returns:
        ``{"bars": the first limit bars, "total": all bars, "limit": limit, "dropped": runs without a
        numeric value}``.

    Raises:
        ColumnError: invalid column name.
    """
    validate_column(field)
    values = {r.key: numeric(cell(r, field)) for r in runs}
    dropped = sum(v is None for v in values.values())
    bars: list[Bar] = []
    if group_by is not None and group_mean:
        for group in group_runs(runs, group_by):
            vals = [v for r in group.runs if (v := values[r.key]) is not None]
            if vals:
                bars.append(
                    Bar(key=None, label=group.label, value=math.fsum(vals) / len(vals), min=min(vals),
                        max=max(vals), n=len(vals), group=group.label)
                )
    else:
        labels = group_labels(runs, group_by)[1] if group_by is not None else {}
        for r in runs:
            v = values[r.key]
            if v is not None:
                bars.append(Bar(key=r.key, label=r.name, value=v, min=None, max=None, n=1, group=labels.get(r.key)))
    return BarData(bars=bars[: max(0, limit)], total=len(bars), limit=limit, dropped=dropped)


def scatter_data(
    runs: Sequence[RunSummary],
    x_field: str,
    y_field: str,
    size_field: str | None = None,
    color_field: str | None = None,
) -> ScatterData:
    """One point per run with numeric X and Y (003 seed: a missing size draws at the default size,
    only a missing X or Y excludes a run).

    Returns:
        ``{"points": [{"key", "label" (run name), "x", "y", "size" (None when missing), "group"
        (the colour group's label, None without color_field)}], "dropped": runs without X or Y}``.

    Raises:
        ColumnError: invalid column name.
    """
    for column in (x_field, y_field, size_field, color_field):
        if column is not None:
            validate_column(column)
    labels = group_labels(runs, color_field)[1] if color_field is not None else {}
    points: list[ScatterPoint] = []
    dropped = 0
    for r in runs:
        x, y = numeric(cell(r, x_field)), numeric(cell(r, y_field))
        if x is None or y is None:
            dropped += 1
            continue
        size = numeric(cell(r, size_field)) if size_field is not None else None
        points.append(ScatterPoint(key=r.key, label=r.name, x=x, y=y, size=size, group=labels.get(r.key)))
    return ScatterData(points=points, dropped=dropped)


def box_data(runs: Sequence[RunSummary], field: str, group_by: str | None = None) -> BoxData:
    """One box per group of ``group_by`` (group order, ``(none)`` last), or one box labelled
    :data:`ALL_RUNS_LABEL` without it. Groups without numeric values get no box.

    Returns:
        ``{"groups": [{"label", "n", "q1", "median", "q3", "low", "high", "points": [{"key", "label"
        (run name), "value", "outlier"}]}], "dropped": runs without a numeric value}``; points in the
        order given.

    Raises:
        ColumnError: invalid column name.
    """
    validate_column(field)
    if group_by is not None:
        sections = [(g.label, g.runs) for g in group_runs(runs, group_by)]
    else:
        sections = [(ALL_RUNS_LABEL, list(runs))]
    groups: list[BoxGroup] = []
    dropped = 0
    for label, members in sections:
        pairs = [(r, numeric(cell(r, field))) for r in members]
        valued = [(r, v) for r, v in pairs if v is not None]
        dropped += len(pairs) - len(valued)
        if not valued:
            continue
        stats = box_stats(v for _, v in valued)
        groups.append(
            BoxGroup(
                label=label, n=stats.n, q1=stats.q1, median=stats.median, q3=stats.q3, low=stats.low,
                high=stats.high,
                points=[BoxPoint(key=r.key, label=r.name, value=v, outlier=stats.is_outlier(v)) for r, v in valued],
            )
        )
    return BoxData(groups=groups, dropped=dropped)


def chart_data(spec: BarSpec | ScatterSpec | BoxSpec, runs: Sequence[RunSummary]) -> BarData | ScatterData | BoxData:
    """The run-level data of a bar, scatter or box chart over ``runs`` (the runs of ``spec.keys``,
    in chart order; resolving keys is the caller's job). Line charts need histories: see
    :func:`line_points`."""
    if isinstance(spec, BarSpec):
        return bar_data(runs, spec.field, spec.group_by)
    if isinstance(spec, ScatterSpec):
        return scatter_data(runs, spec.x_field, spec.y_field, spec.size_field, spec.color_field)
    return box_data(runs, spec.field, spec.group_by)


# -- line charts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinePoints:
    """What a line chart draws for one run and metric.

    Attributes:
        x: the x values (steps, epochs, or seconds since the run's first logged time).
        y: the values, NaN for a gap.
        smoothed: the debiased EMA of the full history at the same points, or None without EMA.
        raw_points: length of the full history (with ``x_range``: of the points in and next to it).
        downsampled: True when points were dropped (min/max buckets, DESIGN §4).
    """

    x: FloatArray
    y: FloatArray
    smoothed: FloatArray | None
    raw_points: int
    downsampled: bool


def first_time(tail: MetricsTail) -> float | None:
    """The run's first logged ``time`` (Unix seconds) in metrics.jsonl, or None."""
    for row in tail.rows:
        t = numeric(row.get("time"))
        if t is not None:
            return t
    return None


TimeOrigin = Literal["started_at", "first_row"]


def time_origin(run: RunSummary | None, tail: MetricsTail) -> tuple[float | None, TimeOrigin]:
    """Where the wall-time axis of a run starts (Unix seconds) and what that is (003 seed: the
    time axis is relative to the run's start): run.json's ``started_at`` when the run has one,
    else the first logged ``time`` in metrics.jsonl (``(None, "first_row")`` without either)."""
    if run is not None and run.started_at is not None and not run.legacy:
        from traceml_ai.runs.readers import parse_iso

        started = parse_iso(run.started_at)
        if started is not None:
            return started, "started_at"
    return first_time(tail), "first_row"


def time_axis_label(origins: Iterable[TimeOrigin]) -> str:
    """The wall-time axis label for runs whose origins are ``origins``: "time since start (s)"
    when every run has a ``started_at``, "time since first logged row (s)" when none has, and
    "time since start or first logged row (s)" for a mix."""
    kinds = set(origins)
    if kinds == {"started_at"}:
        return "time since start (s)"
    if kinds == {"first_row"}:
        return "time since first logged row (s)"
    return "time since start or first logged row (s)" if kinds else "time (s)"


def x_values(series: Series, x: XAxis, t0: float | None = None) -> FloatArray:
    """The x values of ``series``: steps, epochs (NaN where a row had none) or seconds since ``t0``
    (default: the series' own first time)."""
    if x == "step":
        return series.step.astype(np.float64)
    if x == "epoch":
        return np.asarray(series.epoch, dtype=np.float64)
    t = np.asarray(series.time, dtype=np.float64)
    if t0 is None:
        finite = t[np.isfinite(t)]
        t0 = float(finite[0]) if finite.size else 0.0
    return t - t0


def line_points(
    series: Series,
    x: XAxis = "step",
    ema_weight: float = 0.0,
    max_points: int = DEFAULT_MAX_POINTS,
    t0: float | None = None,
    x_range: tuple[float, float] | None = None,
) -> LinePoints:
    """The points a line chart draws: the EMA over the full history, then min/max downsampling to
    ``max_points`` (:func:`~traceml_ai.runs.series.downsample_indices`), the smoothed line taken at
    the same points. With ``x_range`` (a zoomed chart: lo, hi in x units) only the points inside it,
    and one on each side so the lines reach the edges, are bucketed: finer points for the zoom.

    Raises:
        ValueError: ``ema_weight`` outside [0, 1) or ``max_points`` below 5.
    """
    y = np.asarray(series.value, dtype=np.float64)
    xs = x_values(series, x, t0)
    smoothed = ema(y, ema_weight) if ema_weight > 0 else None
    first, last = 0, len(y)
    if x_range is None:
        idx = downsample_indices(y, max_points)
    else:
        inside = np.flatnonzero((xs >= x_range[0]) & (xs <= x_range[1]))
        first = max(0, int(inside[0]) - 1) if inside.size else 0
        last = min(len(y), int(inside[-1]) + 2) if inside.size else 0
        idx = first + downsample_indices(y[first:last], max_points)
    return LinePoints(
        x=xs[idx],
        y=y[idx],
        smoothed=smoothed[idx] if smoothed is not None else None,
        raw_points=last - first,  # with x_range: the points in it
        downsampled=len(idx) < last - first,
    )


@dataclass(frozen=True)
class GroupMean:
    """The mean line of a group: at each step, the mean over the runs with a finite value there
    (a run that logged a step twice counts with its last value), with the band the page draws
    around it: the min and max over those runs and their population standard deviation (the
    page's ``± std`` band is ``mean ± std``)."""

    label: str
    step: NDArray[np.int64]
    mean: FloatArray
    n_runs: NDArray[np.int64]
    min: FloatArray
    max: FloatArray
    std: FloatArray
    keys: tuple[str, ...] = ()
    """The runs of the group (set by :func:`line_groups`)."""

    def band(self, kind: Band) -> tuple[FloatArray, FloatArray]:
        """The low and high edges of the band ``kind`` (``minmax`` or ``std``) at each step."""
        if kind == "std":
            return self.mean - self.std, self.mean + self.std
        return self.min, self.max

    def take(self, idx: NDArray[np.intp]) -> GroupMean:
        """The same group at the steps ``idx`` (indices into :attr:`step`) only."""
        return GroupMean(self.label, self.step[idx], self.mean[idx], self.n_runs[idx], self.min[idx],
                         self.max[idx], self.std[idx], self.keys)


@dataclass(frozen=True)
class GroupPoints:
    """The steps of a :class:`GroupMean` a chart draws (:func:`group_points`)."""

    group: GroupMean
    raw_points: int
    """The group's steps before downsampling (with an x range: the steps in it)."""
    downsampled: bool


def group_points(
    mean: GroupMean, max_points: int = DEFAULT_MAX_POINTS, x_range: tuple[float, float] | None = None
) -> GroupPoints:
    """The steps of a group's mean and band that a line chart draws: the band is computed over the
    runs' full histories first (:func:`group_mean_by_step`), then downsampled here, so a spike of one
    run that a per-run downsampling would drop still shows in the band's max.

    Past ``max_points`` steps the kept steps are the union of min/max buckets
    (:func:`~traceml_ai.runs.series.downsample_indices`) over the mean and the four band edges
    (min, max, mean ± std), a fifth of the budget each: the extremes of either band kind survive.
    With ``x_range`` (a zoomed chart, in steps) only the steps inside it and one on each side are
    bucketed, as :func:`line_points` does.

    Raises:
        ValueError: ``max_points`` below 5.
    """
    if max_points < 5:
        raise ValueError("max_points must be at least 5")
    steps = mean.step.astype(np.float64)
    first, last = 0, len(steps)
    if x_range is not None:
        inside = np.flatnonzero((steps >= x_range[0]) & (steps <= x_range[1]))
        first = max(0, int(inside[0]) - 1) if inside.size else 0
        last = min(len(steps), int(inside[-1]) + 2) if inside.size else 0
    n = last - first
    if n <= max_points:
        idx = np.arange(first, last, dtype=np.intp)
    else:
        budget = max(5, max_points // 5)
        part = slice(first, last)
        edges = (mean.mean[part], mean.min[part], mean.max[part],
                 mean.mean[part] - mean.std[part], mean.mean[part] + mean.std[part])
        idx = first + np.unique(np.concatenate([downsample_indices(e, budget) for e in edges]))
    return GroupPoints(mean.take(idx), raw_points=n, downsampled=len(idx) < n)


def _step_index(steps: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """The distinct ``steps`` in order and each one's index among them (``np.unique`` with
    ``return_inverse``), by counting when the steps span a range not much wider than their number
    (the usual case, several times faster than sorting them), by sorting otherwise."""
    if not steps.size:
        return steps, np.zeros(0, dtype=np.intp)
    low = int(steps.min())
    span = int(steps.max()) - low + 1
    if span > 4 * steps.size + 1024:
        distinct, inverse = np.unique(steps, return_inverse=True)
        return distinct, inverse.astype(np.intp)
    offset = (steps - low).astype(np.intp)
    present = np.flatnonzero(np.bincount(offset, minlength=span))
    position = np.zeros(span, dtype=np.intp)
    position[present] = np.arange(len(present), dtype=np.intp)
    return (present + low).astype(np.int64), position[offset]


def group_mean_by_step(label: str, series: Iterable[Series]) -> GroupMean:
    """Average several runs' histories of one metric step by step, with the min, max and population
    standard deviation over the runs at each step. A run that logged a step more than once counts
    with its last row there (none when that row's value is not finite). Steps where no run has a
    finite value are left out. Columnar (numpy): 10 runs of 200,000 steps in 0.1–0.3 s on the
    2-core test machine (about 1 s as a Python loop), as the page asks for it on each chart."""
    steps_of: list[NDArray[np.int64]] = []
    values_of: list[FloatArray] = []
    for s in series:
        step = np.asarray(s.step, dtype=np.int64)
        if not step.size:
            continue
        value = np.asarray(s.value, dtype=np.float64)
        if step.size == 1 or bool((step[1:] > step[:-1]).all()):  # the usual history: each step once, in order
            uniq, last = step, value
        else:
            uniq, first_reversed = np.unique(step[::-1], return_index=True)
            last = value[len(step) - 1 - first_reversed]  # each step's last row
        keep = np.isfinite(last)
        steps_of.append(uniq[keep])
        values_of.append(last[keep])
    all_steps = np.concatenate(steps_of) if steps_of else np.zeros(0, dtype=np.int64)
    values = np.concatenate(values_of) if values_of else np.zeros(0, dtype=np.float64)
    steps, inverse = _step_index(all_steps)
    n = np.bincount(inverse, minlength=len(steps))
    means = np.bincount(inverse, weights=values, minlength=len(steps)) / np.maximum(n, 1)
    deviation = values - means[inverse]
    stds = np.sqrt(np.bincount(inverse, weights=deviation * deviation, minlength=len(steps)) / np.maximum(n, 1))
    lows = np.full(len(steps), np.inf)
    highs = np.full(len(steps), -np.inf)
    np.minimum.at(lows, inverse, values)
    np.maximum.at(highs, inverse, values)
    return GroupMean(label, steps.astype(np.int64), means.astype(np.float64), n.astype(np.int64),
                     lows.astype(np.float64), highs.astype(np.float64), stds.astype(np.float64))


def line_groups(
    histories: Sequence[tuple[RunSummary, MetricsTail]], metric: str, group_by: str
) -> list[GroupMean]:
    """One :class:`GroupMean` of ``metric`` per group of ``group_by`` (group order), skipping groups
    without values.

    Raises:
        ColumnError: invalid column.
    """
    tails = {run.key: tail for run, tail in histories}
    out = []
    for group in group_runs([run for run, _ in histories], group_by):
        mean = group_mean_by_step(group.label, (tails[r.key].series(metric) for r in group.runs))
        if mean.step.size:
            out.append(dataclasses.replace(mean, keys=tuple(r.key for r in group.runs)))
    return out


# -- chart CSV (003 seed, "Exporting chart data") ---------------------------------------------------

Table = tuple[list[str], list[list[Scalar]]]
"""A CSV table: the header and the rows."""


def line_csv_rows(histories: Sequence[tuple[RunSummary, MetricsTail]], metrics: Sequence[str]) -> Table:
    """The full history (not downsampled) of ``metrics`` for each run: header
    ``run,path,step,epoch,time_s,<metric>...``, one row per metrics.jsonl row that logged one of the
    metrics, in file order, runs in the order given.

    ``run`` is the run name, ``path`` the run folder, ``time_s`` seconds since the run's
    ``started_at``, or its first logged time without one (the chart's time axis,
    :func:`time_origin`); a null, NaN or missing value is None (an empty cell).
    """
    header = ["run", "path", "step", "epoch", "time_s", *metrics]
    rows: list[list[Scalar]] = []
    for run, tail in histories:
        t0 = time_origin(run, tail)[0]
        for step, row in zip(tail.steps, tail.rows, strict=True):
            values: list[Scalar] = []
            found = False
            for metric in metrics:
                v = row.get(metric, _ABSENT)
                if v is None or type(v) in (int, float):
                    found = True
                    values.append(None if v is None else numeric(v))
                else:
                    values.append(None)
            if not found:
                continue
            epoch = row.get("epoch")
            t = numeric(row.get("time"))
            rows.append([
                run.name,
                run.path,
                step,
                epoch if numeric(epoch) is not None else None,
                round(t - t0, 6) if t is not None and t0 is not None else None,  # no float noise
                *values,
            ])
    return header, rows


_ABSENT: Final = object()


_GROUP_CSV_STATS: Final = ("mean", "min", "max", "std")


def line_group_csv_rows(
    histories: Sequence[tuple[RunSummary, MetricsTail]], metrics: Sequence[str], group_by: str
) -> Table:
    """Group means by step with the band the page draws around them: header
    ``group,step,mean <metric>,min <metric>,max <metric>,std <metric>,n_runs`` (with several metrics
    each gets its five columns, ``n_runs <metric>`` last); one row per group and step where a metric
    has a value. ``std`` is the population standard deviation over the runs at that step (the
    ``± std`` band is mean ± std; the ``min–max`` band is min to max).

    Raises:
        ColumnError: invalid column.
    """
    single = len(metrics) == 1
    width = len(_GROUP_CSV_STATS) + 1
    header = ["group", "step"]
    for metric in metrics:
        header += [*(f"{stat} {metric}" for stat in _GROUP_CSV_STATS), "n_runs" if single else f"n_runs {metric}"]
    labels, _ = group_labels([run for run, _ in histories], group_by)
    table: dict[tuple[str, int], list[Scalar]] = {}
    for m_index, metric in enumerate(metrics):
        for g in line_groups(histories, metric, group_by):
            columns = zip(g.step.tolist(), g.mean.tolist(), g.min.tolist(), g.max.tolist(), g.std.tolist(),
                          g.n_runs.tolist(), strict=True)
            for step, *cells in columns:
                row = table.setdefault((g.label, step), [None] * (width * len(metrics)))
                row[width * m_index:width * (m_index + 1)] = cells
    order = {label: i for i, label in enumerate(labels)}
    ordered = sorted(table.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    rows: list[list[Scalar]] = [[label, step, *vals] for (label, step), vals in ordered]
    return header, rows


def bar_csv_rows(
    runs: Sequence[RunSummary], field: str, group_by: str | None = None, *, group_mean: bool = True
) -> Table:
    """Every bar (also those beyond the 60 drawn). One per run: ``run,path,[group:<group_by>],<field>``;
    group means: ``group:<group_by>,n,mean <field>,min <field>,max <field>``."""
    data = bar_data(runs, field, group_by, limit=MAX_CHART_RUNS, group_mean=group_mean)
    if group_by is not None and group_mean:
        header = [f"group:{group_by}", "n", f"mean {field}", f"min {field}", f"max {field}"]
        return header, [[b["label"], b["n"], b["value"], b["min"], b["max"]] for b in data["bars"]]
    paths = {r.key: r.path for r in runs}
    header = ["run", "path", *([f"group:{group_by}"] if group_by else []), field]
    return header, [
        [b["label"], paths[b["key"] or ""], *([b["group"]] if group_by else []), b["value"]] for b in data["bars"]
    ]


def scatter_csv_rows(
    runs: Sequence[RunSummary],
    x_field: str,
    y_field: str,
    size_field: str | None = None,
    color_field: str | None = None,
) -> Table:
    """The plotted points: ``run,path,<x>,<y>,[<size>],[group:<color_field>]``."""
    data = scatter_data(runs, x_field, y_field, size_field, color_field)
    paths = {r.key: r.path for r in runs}
    header = ["run", "path", x_field, y_field]
    if size_field:
        header.append(size_field)
    if color_field:
        header.append(f"group:{color_field}")
    rows: list[list[Scalar]] = []
    for p in data["points"]:
        row: list[Scalar] = [p["label"], paths[p["key"]], p["x"], p["y"]]
        if size_field:
            row.append(p["size"])
        if color_field:
            row.append(p["group"])
        rows.append(row)
    return header, rows


def box_csv_rows(runs: Sequence[RunSummary], field: str, group_by: str | None = None) -> Table:
    """One row per run with a value: ``group:<group_by>,run,path,<field>`` (``group`` without
    ``group_by``); the quartiles follow from the values."""
    data = box_data(runs, field, group_by)
    paths = {r.key: r.path for r in runs}
    header = [f"group:{group_by}" if group_by else "group", "run", "path", field]
    return header, [[g["label"], p["label"], paths[p["key"]], p["value"]] for g in data["groups"] for p in g["points"]]


class ScatterGroup(TypedDict):
    label: str
    n: int
    mean_x: float
    std_x: float
    mean_y: float
    std_y: float


def scatter_groups(runs: Sequence[RunSummary], x_field: str, y_field: str, group_by: str) -> list[ScatterGroup]:
    """Plot by groups in a scatter: each group of ``group_by`` (group order) over its runs with both
    values, as its mean and population standard deviation in x and y (0 for one run), as the page
    draws it; groups without such a run are left out.

    Raises:
        ColumnError: invalid column name.
    """
    data = scatter_data(runs, x_field, y_field)
    points = {p["key"]: p for p in data["points"]}
    out: list[ScatterGroup] = []
    for group in group_runs(runs, group_by):
        mine = [points[r.key] for r in group.runs if r.key in points]
        if not mine:
            continue
        xs = np.array([p["x"] for p in mine], dtype=np.float64)
        ys = np.array([p["y"] for p in mine], dtype=np.float64)
        out.append(ScatterGroup(label=group.label, n=len(mine), mean_x=float(xs.mean()), std_x=float(xs.std()),
                                mean_y=float(ys.mean()), std_y=float(ys.std())))
    return out


def scatter_group_csv_rows(runs: Sequence[RunSummary], x_field: str, y_field: str, group_by: str) -> Table:
    """The CSV of :func:`scatter_groups`: ``group,n,mean <x>,std <x>,mean <y>,std <y>``."""
    rows: list[list[Scalar]] = [
        [g["label"], g["n"], g["mean_x"], g["std_x"], g["mean_y"], g["std_y"]]
        for g in scatter_groups(runs, x_field, y_field, group_by)
    ]
    return ["group", "n", f"mean {x_field}", f"std {x_field}", f"mean {y_field}", f"std {y_field}"], rows


def chart_csv_rows(
    spec: ChartSpec, runs: Sequence[RunSummary], histories: Sequence[tuple[RunSummary, MetricsTail]] = ()
) -> Table:
    """The CSV table of any chart (003 seed, "Exporting chart data"). ``histories`` (run, its
    metrics.jsonl reader) are needed for line charts only."""
    if isinstance(spec, LineSpec):
        if spec.group_by is not None:
            return line_group_csv_rows(histories, spec.metrics, spec.group_by)
        return line_csv_rows(histories, spec.metrics)
    if isinstance(spec, BarSpec):
        return bar_csv_rows(runs, spec.field, spec.group_by)
    if isinstance(spec, ScatterSpec):
        if spec.group_by is not None:
            return scatter_group_csv_rows(runs, spec.x_field, spec.y_field, spec.group_by)
        return scatter_csv_rows(runs, spec.x_field, spec.y_field, spec.size_field, spec.color_field)
    return box_csv_rows(runs, spec.field, spec.group_by)


def table_csv(table: Table) -> str:
    """A :data:`Table` as CSV text: RFC 4180 quoting, cells as the table export writes them
    (:func:`~traceml_ai.runs.table.format_cell`: floats with ``repr``, None empty)."""
    header, rows = table
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for row in rows:
        writer.writerow([format_cell(v) for v in row])
    return buffer.getvalue()


def chart_slug_source(spec: ChartSpec) -> str:
    """The words a chart's file name is made of (``plot-<slug>-…``): the metrics of a line chart
    (``val/auc``), ``bar best val/auc`` (the ``run.`` prefix dropped), ``scatter X vs Y``,
    ``box FIELD by GROUP``. Make it safe with a slug function before using it in a file name."""

    def short(column: str) -> str:
        return column[4:] if column.startswith("run.") else column

    if isinstance(spec, LineSpec):
        return " ".join(spec.metrics) + (f" by {short(spec.group_by)}" if spec.group_by else "")
    if isinstance(spec, BarSpec):
        return f"bar {short(spec.field)}" + (f" by {short(spec.group_by)}" if spec.group_by else "")
    if isinstance(spec, ScatterSpec):
        return f"scatter {short(spec.x_field)} vs {short(spec.y_field)}"
    return f"box {short(spec.field)}" + (f" by {short(spec.group_by)}" if spec.group_by else "")


__all__ = [
    "ALL_RUNS_LABEL",
    "BANDS",
    "BAR_LIMIT",
    "Band",
    "Bar",
    "BarData",
    "BarSpec",
    "BoxData",
    "BoxGroup",
    "BoxPoint",
    "BoxSpec",
    "BoxStats",
    "ChartSpec",
    "ChartSpecError",
    "GroupMean",
    "LinePoints",
    "LineSpec",
    "ScatterData",
    "ScatterGroup",
    "ScatterPoint",
    "ScatterSpec",
    "Table",
    "bar_csv_rows",
    "bar_data",
    "box_csv_rows",
    "box_data",
    "box_stats",
    "chart_csv_rows",
    "chart_data",
    "chart_slug_source",
    "first_time",
    "group_labels",
    "group_mean_by_step",
    "line_csv_rows",
    "line_group_csv_rows",
    "line_groups",
    "line_points",
    "numeric",
    "quantile",
    "scatter_csv_rows",
    "scatter_data",
    "scatter_group_csv_rows",
    "scatter_groups",
    "table_csv",
    "time_axis_label",
    "time_origin",
    "x_values",
]
