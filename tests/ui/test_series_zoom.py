"""Zoomed series (issue 15 item 12): ``POST /api/series`` with ``x_range`` buckets only the visible
range, so a zoom into a downsampled history gets every point there (real run files, real store)."""

from __future__ import annotations

import pytest

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.service import RequestError, Viewer


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Viewer:
    root = tmp_path_factory.mktemp("zoom") / "traceml" / "runs"
    generate(root, runs=1, seed=0, big_run_lines=4000)
    v = Viewer(RunStore([root]), None, max_points_per_series=200)
    v.poll()
    return v


def _big(viewer: Viewer) -> str:
    return next(r.key for r in viewer.store.runs() if r.name == "big-run")


def test_a_zoomed_range_gets_every_point_inside_it_and_one_beyond_each_edge(viewer: Viewer) -> None:
    key = _big(viewer)
    whole = viewer.series_payload([key], ["val/loss"], "step", 0.0)["series"][0]
    assert whole["downsampled"] and len(whole["x"]) <= 200 < whole["raw_points"]
    lo, hi = 800.0, 900.0
    zoomed = viewer.series_payload([key], ["val/loss"], "step", 0.0, (lo, hi))["series"][0]
    inside = [x for x in zoomed["x"] if lo <= x <= hi]
    assert not zoomed["downsampled"]
    assert len(inside) == sum(1 for x in range(int(lo), int(hi) + 1))  # every step in the range (one row per step)
    assert zoomed["x"][0] < lo and zoomed["x"][-1] > hi  # the lines reach the chart's edges
    assert zoomed["raw_points"] == len(zoomed["x"])


@pytest.mark.parametrize("bad", [(5.0, 1.0), (1.0, 1.0), (float("nan"), 2.0), (0.0, float("inf"))])
def test_a_bad_x_range_is_refused(viewer: Viewer, bad: tuple[float, float]) -> None:
    with pytest.raises(RequestError, match="x_range"):
        viewer.series_payload([_big(viewer)], ["val/loss"], "step", 0.0, bad)


def test_no_range_is_the_whole_history_as_before(viewer: Viewer) -> None:
    key = _big(viewer)
    a = viewer.series_payload([key], ["val/loss"], "step", 0.0)["series"][0]
    b = viewer.series_payload([key], ["val/loss"], "step", 0.0, None)["series"][0]
    assert a == b


def test_a_wide_zoom_is_bucketed_again_over_its_range_keeping_each_buckets_min_and_max(viewer: Viewer) -> None:
    """A zoom still holding more points than a chart draws: the same min/max buckets, now over the
    visible range only. Finer than the whole history's points there, and the lowest and highest
    values of the range are among them (a spike is not averaged away)."""
    key = _big(viewer)
    whole = viewer.series_payload([key], ["val/loss"], "step", 0.0)["series"][0]
    lo, hi = 500.0, 1100.0  # 600 of the 2,000 rows: more than a chart draws, a third of the history
    zoomed = viewer.series_payload([key], ["val/loss"], "step", 0.0, (lo, hi))["series"][0]
    assert zoomed["downsampled"] and len(zoomed["x"]) <= 200 < zoomed["raw_points"]
    inside = [x for x in zoomed["x"] if lo <= x <= hi]
    before = [x for x in whole["x"] if lo <= x <= hi]
    assert len(inside) > 1.5 * len(before)
    raw = viewer.store.history(key).series("val/loss")
    in_range = [float(v) for s, v in zip(raw.step.tolist(), raw.value.tolist(), strict=True) if lo <= s <= hi]
    drawn = [y for x, y in zip(zoomed["x"], zoomed["y"], strict=True) if lo <= x <= hi and y is not None]
    assert min(drawn) == min(in_range) and max(drawn) == max(in_range)
