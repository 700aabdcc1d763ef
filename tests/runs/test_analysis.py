"""Chart data for bar, scatter, box and line charts (docs/viewer-api.md "POST /api/chart"; 003 seed,
"Exporting chart data")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from traceml_ai.runs.analysis import (
    ALL_RUNS_LABEL,
    BarSpec,
    BoxSpec,
    ChartSpecError,
    LineSpec,
    ScatterSpec,
    bar_csv_rows,
    bar_data,
    box_data,
    box_stats,
    chart_data,
    group_mean_by_step,
    line_csv_rows,
    line_group_csv_rows,
    line_points,
    parse_chart_spec,
    scatter_data,
    table_csv,
)
from traceml_ai.runs.fake import generate
from traceml_ai.runs.metrics_tail import MetricsTail, Series
from traceml_ai.runs.model import BestValue, RunSummary
from traceml_ai.runs.store import RunStore


def run(i: int, *, params: dict[str, Any] | None = None, auc: float | None = None, tags: list[str] | None = None,
        summary: dict[str, Any] | None = None) -> RunSummary:
    return RunSummary(
        key=f"/w/runs/r{i:03d}", id=f"r{i:03d}", root="/w/runs", name=f"run{i}", tags=tags or [],
        params=params or {},
        best={"val/auc": BestValue(auc, i, i, "max")} if auc is not None else {},
        summary=summary or {},
    )


@pytest.fixture(scope="module")
def fake_store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    root = tmp_path_factory.mktemp("fake") / "runs"
    generate(root, runs=24, seed=0)
    store = RunStore([root])
    store.poll()
    return store


# -- box -------------------------------------------------------------------------------------------


def test_box_quartiles_whiskers_and_outliers_of_a_known_set() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 30]
    stats = box_stats(values)
    assert (stats.q1, stats.median, stats.q3) == (3.25, 5.5, 7.75)
    assert [stats.q1, stats.median, stats.q3] == list(np.quantile(values, [0.25, 0.5, 0.75]))
    # IQR 4.5: fences at -3.5 and 14.5; the whiskers end at the last values inside them.
    assert (stats.low, stats.high) == (1, 9)
    runs = [run(i, params={"x": v}) for i, v in enumerate(values)]
    data = box_data(runs, "config.x")
    (group,) = data["groups"]
    assert group["label"] == ALL_RUNS_LABEL and group["n"] == 10
    assert (group["q1"], group["median"], group["q3"], group["low"], group["high"]) == (3.25, 5.5, 7.75, 1, 9)
    assert [p["value"] for p in group["points"] if p["outlier"]] == [30]
    assert data["dropped"] == 0


def test_box_whiskers_stop_at_data_values_inside_the_fences() -> None:
    stats = box_stats([-50.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 40.0])
    assert stats.low == 10.0 and stats.high == 15.0
    assert stats.is_outlier(-50.0) and stats.is_outlier(40.0) and not stats.is_outlier(12.0)


def test_box_groups_in_table_order_with_none_last_and_non_numbers_left_out() -> None:
    runs = [
        run(0, params={"ds": "cifar100", "v": 0.5}),
        run(1, params={"ds": "cifar10", "v": 0.7}),
        run(2, params={"v": 0.1}),  # no dataset: the (none) group
        run(3, params={"ds": "cifar10", "v": "n/a"}),  # text: left out
        run(4, params={"ds": "cifar10", "v": True}),  # a bool is not a number
        run(5, params={"ds": "cifar10", "v": math.nan}),
        run(6, params={"ds": "cifar10", "v": 0.9}),
        run(7, params={"ds": "tiny", "v": None}),  # a group with no values gets no box
    ]
    data = box_data(runs, "config.v", "config.ds")
    assert [g["label"] for g in data["groups"]] == ["cifar10", "cifar100", "(none)"]
    assert [p["label"] for p in data["groups"][0]["points"]] == ["run1", "run6"]
    assert data["dropped"] == 4


def test_group_label_of_tags_is_the_tags_joined() -> None:
    runs = [run(0, tags=["cv", "sweep"], params={"v": 1}), run(1, tags=[], params={"v": 2})]
    assert [g["label"] for g in box_data(runs, "config.v", "tags")["groups"]] == ["cv, sweep", "(none)"]


# -- bar -------------------------------------------------------------------------------------------


def test_bar_draws_sixty_and_counts_all() -> None:
    runs = [run(i, auc=i / 100) for i in range(70)] + [run(70)]
    data = bar_data(runs, "run.best.val/auc")
    assert len(data["bars"]) == 60 and data["total"] == 70 and data["limit"] == 60 and data["dropped"] == 1
    first = data["bars"][0]
    assert first == {"key": "/w/runs/r000", "label": "run0", "value": 0.0, "min": None, "max": None, "n": 1,
                     "group": None}
    # The CSV export holds every bar, also those beyond the 60 drawn.
    header, rows = bar_csv_rows(runs, "run.best.val/auc")
    assert header == ["run", "path", "run.best.val/auc"] and len(rows) == 70


def test_bar_group_mean_with_min_and_max() -> None:
    runs = [run(0, params={"g": "a"}, auc=0.5), run(1, params={"g": "a"}, auc=0.7), run(2, params={"g": "b"}, auc=0.9),
            run(3, params={"g": "b"})]
    data = bar_data(runs, "run.best.val/auc", "config.g")
    assert [(b["label"], b["n"], b["min"], b["max"], b["key"]) for b in data["bars"]] == [
        ("a", 2, 0.5, 0.7, None), ("b", 1, 0.9, 0.9, None)]
    assert data["bars"][0]["value"] == pytest.approx(0.6)
    header, rows = bar_csv_rows(runs, "run.best.val/auc", "config.g")
    assert header == ["group:config.g", "n", "mean run.best.val/auc", "min run.best.val/auc", "max run.best.val/auc"]
    assert table_csv((header, rows)).splitlines()[2] == "b,1,0.9,0.9,0.9"


# -- scatter ---------------------------------------------------------------------------------------


def test_scatter_drops_runs_without_x_or_y_and_keeps_missing_size() -> None:
    runs = [
        run(0, params={"lr": 0.1, "h": 64, "ds": "c10"}, auc=0.8),
        run(1, params={"lr": 0.01, "ds": "c100"}, auc=0.9),  # no size: default size
        run(2, params={"h": 32}, auc=0.7),  # no x
        run(3, params={"lr": 0.2}),  # no y
        run(4, params={"lr": "fast"}, auc=0.6),  # x is text
    ]
    data = scatter_data(runs, "config.lr", "run.best.val/auc", "config.h", "config.ds")
    assert data["dropped"] == 3
    assert [(p["label"], p["x"], p["y"], p["size"], p["group"]) for p in data["points"]] == [
        ("run0", 0.1, 0.8, 64, "c10"), ("run1", 0.01, 0.9, None, "c100")]


def test_chart_data_follows_the_spec() -> None:
    runs = [run(i, params={"g": "a" if i % 2 else "b", "v": i}) for i in range(6)]
    body = {"chart": "box", "keys": [r.key for r in runs], "field": "config.v", "group_by": "config.g"}
    spec = parse_chart_spec(body)
    assert spec == BoxSpec(tuple(r.key for r in runs), "config.v", "config.g")
    data = chart_data(spec, runs)
    assert [g["label"] for g in data["groups"]] == ["a", "b"]  # type: ignore[typeddict-item]


# -- specs -----------------------------------------------------------------------------------------


def test_parse_chart_spec_accepts_each_kind() -> None:
    assert parse_chart_spec({"chart": "line", "keys": ["k"], "metrics": ["val/auc"], "x": "epoch", "ema": 0.6,
                             "log_y": True, "group_by": None, "format": "png"}) == LineSpec(
        ("k",), ("val/auc",), "epoch", 0.6, True, None)
    bar = parse_chart_spec({"chart": "bar", "keys": [], "field": "run.best.val/auc"})
    assert bar == BarSpec((), "run.best.val/auc")
    assert parse_chart_spec({"chart": "scatter", "keys": ["k"], "x_field": "config.lr", "y_field": "summary.x",
                             "size_field": None, "color_field": "group", "log_x": True, "log_y": False}) == ScatterSpec(
        ("k",), "config.lr", "summary.x", None, "group", True, False)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"chart": "pie", "keys": []}, "chart must be one of"),
        ({"chart": "bar", "keys": [], "field": "run.best.val/auc", "colour": 1}, "unknown field"),
        ({"chart": "bar", "keys": [], "field": "best.val/auc"}, "unknown column"),
        ({"chart": "bar", "keys": []}, "field is required"),
        ({"chart": "bar", "keys": "k", "field": "name"}, "keys must be a list"),
        ({"chart": "line", "keys": ["k"], "metrics": ["m"], "ema": 1.0}, "ema must be"),
        ({"chart": "line", "keys": ["k"], "metrics": []}, "at least one metric"),
        ({"chart": "line", "keys": [f"k{i}" for i in range(31)], "metrics": ["m"]}, "at most 30"),
        ({"chart": "scatter", "keys": [], "x_field": "name", "y_field": "name", "log_x": "yes"}, "log_x must be"),
    ],
)
def test_parse_chart_spec_rejects_bad_requests_in_one_line(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ChartSpecError, match=fragment) as info:
        parse_chart_spec(body)
    assert "\n" not in str(info.value)


# -- lines -----------------------------------------------------------------------------------------


def _series(steps: list[int], values: list[float]) -> Series:
    n = len(steps)
    return Series("m", np.asarray(steps, dtype=np.int64), np.full(n, np.nan), np.full(n, np.nan),
                  np.asarray(values, dtype=np.float64))


def test_group_mean_by_step_counts_runs_with_a_value() -> None:
    a = _series([0, 1, 2], [1.0, 2.0, math.nan])
    b = _series([0, 1, 1, 2], [3.0, 0.0, 4.0, 6.0])  # step 1 logged twice: the last value counts
    mean = group_mean_by_step("g", [a, b])
    assert mean.step.tolist() == [0, 1, 2]
    assert mean.mean.tolist() == [2.0, 3.0, 6.0]
    assert mean.n_runs.tolist() == [2, 2, 1]
    # The band the page draws: min–max over the runs, or mean ± the population std.
    assert mean.min.tolist() == [1.0, 2.0, 6.0] and mean.max.tolist() == [3.0, 4.0, 6.0]
    assert mean.std.tolist() == [1.0, 1.0, 0.0]
    assert [v.tolist() for v in mean.band("std")] == [[1.0, 2.0, 6.0], [3.0, 4.0, 6.0]]
    assert [v.tolist() for v in mean.band("minmax")] == [[1.0, 2.0, 6.0], [3.0, 4.0, 6.0]]


def test_group_mean_by_step_takes_each_steps_last_row_and_any_step_numbers() -> None:
    # A step whose last row is NaN has no value from that run (an earlier finite one does not count).
    a = _series([0, 5, 5, 9], [1.0, 2.0, math.nan, 4.0])
    b = _series([9, 0, 5], [6.0, 3.0, 8.0])  # out of order
    mean = group_mean_by_step("g", [a, b])
    assert mean.step.tolist() == [0, 5, 9] and mean.n_runs.tolist() == [2, 1, 2]
    assert mean.mean.tolist() == [2.0, 8.0, 5.0] and mean.max.tolist() == [3.0, 8.0, 6.0]
    # Steps far apart (counted by sorting, not by a table of every step between them).
    far = group_mean_by_step("g", [_series([0, 10**15], [1.0, 2.0]), _series([10**15], [4.0])])
    assert far.step.tolist() == [0, 10**15] and far.mean.tolist() == [1.0, 3.0] and far.std.tolist() == [0.0, 1.0]
    assert group_mean_by_step("g", [_series([], [])]).step.size == 0


def test_line_points_downsample_and_smooth_the_full_history() -> None:
    steps = list(range(10_000))
    values = [math.sin(i / 100) for i in steps]
    values[5000] = 9.0  # a spike survives downsampling
    pts = line_points(_series(steps, values), "step", ema_weight=0.9, max_points=500)
    assert pts.downsampled and len(pts.x) <= 500 and pts.raw_points == 10_000
    assert 9.0 in pts.y.tolist()
    assert pts.smoothed is not None and len(pts.smoothed) == len(pts.y)
    assert pts.smoothed.max() < 9.0  # the EMA flattens the spike


def test_line_csv_holds_every_logged_value(fake_store: RunStore) -> None:
    baseline = fake_store.find("baseline")
    tail = fake_store.history(baseline.key)
    header, rows = line_csv_rows([(baseline, tail)], ["val/auc"])
    assert header == ["run", "path", "step", "epoch", "time_s", "val/auc"]
    logged = [r for r in tail.rows if "val/auc" in r]
    assert len(rows) == len(logged) and rows[0][:2] == ["baseline", baseline.path]
    assert [r[5] for r in rows] == [r["val/auc"] for r in logged]
    assert rows[0][4] is not None and rows[0][4] >= 0  # seconds since the run's first logged time


def test_line_group_csv_has_one_row_per_group_and_step(fake_store: RunStore) -> None:
    runs = fake_store.runs()[:6]
    histories = [(r, fake_store.history(r.key)) for r in runs]
    header, rows = line_group_csv_rows(histories, ["val/auc"], "config.data.dataset")
    assert header == ["group", "step", "mean val/auc", "min val/auc", "max val/auc", "std val/auc", "n_runs"]
    keys = [(row[0], row[1]) for row in rows]
    assert len(keys) == len(set(keys)) and rows
    assert all(isinstance(row[6], int) and 1 <= row[6] <= 6 for row in rows)
    # Each row carries the band around its mean: min ≤ mean ≤ max, std 0 for a single run.
    assert all(row[3] <= row[2] <= row[4] and row[5] >= 0 for row in rows)
    assert all(row[5] == 0.0 and row[3] == row[4] for row in rows if row[6] == 1)
    two = line_group_csv_rows(histories, ["val/auc", "val/loss"], "config.data.dataset")[0]
    assert two[2:] == ["mean val/auc", "min val/auc", "max val/auc", "std val/auc", "n_runs val/auc",
                       "mean val/loss", "min val/loss", "max val/loss", "std val/loss", "n_runs val/loss"]


def test_line_csv_is_not_downsampled_for_a_long_history(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {i}, "epoch": {i}, "time": {1000 + i}, "loss": {i * 0.5}}}\n'
                            for i in range(12_000)))
    tail = MetricsTail(path)
    tail.advance()
    _, rows = line_csv_rows([(run(0), tail)], ["loss"])
    assert len(rows) == 12_000 and rows[-1][2:] == [11_999, 11_999, 11_999.0, 5999.5]


def test_a_line_spec_takes_the_band_shown_and_refuses_another() -> None:
    base = {"chart": "line", "keys": ["a"], "metrics": ["m"], "group_by": "config.g"}
    plain, std = parse_chart_spec(base), parse_chart_spec({**base, "band": "std"})
    assert isinstance(plain, LineSpec) and plain.band == "minmax"  # the page's default band
    assert isinstance(std, LineSpec) and std.band == "std"
    with pytest.raises(ChartSpecError, match="band must be one of minmax, std"):
        parse_chart_spec({**base, "band": "iqr"})
