"""A fresh user's review of the viewer, past issue 15, in a real browser: tick labels of a narrow
zoom that all read the same, the x axis a grouped chart really uses, rows logged at one wall time,
scatter points on the axis lines, and a page that says nothing when its server stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cli.test_runs_cli_readers import write_run
from tests.ui.test_browser import CHROMIUM, drag_zoom, expect, line_chart, open_viewer, select_runs, serve, switch
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)

RUN = {"status": "completed", "started_at": "2026-11-30T10:00:00Z"}
T0 = datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp()  # started_at as the rows' "time" (epoch seconds)


def plot(page: Page, *names: str) -> None:
    select_runs(page, *names)
    page.get_by_test_id("selection-plot").click()


def y_ticks(chart: Locator) -> list[str]:
    """The y tick labels of a line chart as drawn (``data-y-ticks``), once it has drawn some."""
    plot_el = chart.locator(".plot")
    expect(plot_el).to_have_attribute("data-y-ticks", re.compile(r"\S"))
    return (plot_el.get_attribute("data-y-ticks") or "").split(" ")


def test_a_narrow_zoom_labels_every_y_tick_differently(browser: Browser, tmp_path: Path) -> None:
    # The review's run: val/auc = 1 - 1/(s + 2) over 30,000 steps, zoomed to steps ~10,600-11,600,
    # labelled all five y ticks 0.9999.
    root = tmp_path / "traceml" / "runs"
    rows = [{"step": s, "val/auc": 1 - 1 / (s + 2)} for s in range(30_000)]
    write_run(root, "auc", {"name": "auc", **RUN}, rows=rows)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        plot(page, "auc")
        chart = line_chart(page, "val/auc")
        expect(chart.locator("canvas")).to_be_visible()
        drag_zoom(page, chart, 10_600 / 29_999, 11_600 / 29_999)
        chart = line_chart(page, "val/auc")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "zoom-full")
        labels = y_ticks(chart)
        assert len(labels) >= 3, labels
        assert len(set(labels)) == len(labels), labels  # not five 0.9999
        values = [float(t) for t in labels]
        assert values == sorted(values)
        assert all(0.99990 <= x <= 0.99992 for x in values), labels  # the zoomed values, readable
        s.assert_clean()


def test_a_grouped_chart_shows_step_on_its_x_select_and_gives_the_users_choice_back(
    browser: Browser, tmp_path: Path,
) -> None:
    root = tmp_path / "traceml" / "runs"
    for i, dataset in enumerate(["cifar", "cifar", "mnist"]):
        write_run(root, f"r{i}", {"name": f"r{i}", **RUN}, params=f"data:\n  dataset: {dataset}\n",
                  rows=[{"step": s, "time": T0 + 10.0 * s, "loss": float(i + s)} for s in range(20)])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        plot(page, "r0", "r1", "r2")
        x_sel = page.get_by_test_id("x-axis")
        x_sel.select_option("time")
        expect(line_chart(page, "loss").locator(".plot")).to_have_attribute("data-x-label", re.compile("^time since"))
        page.get_by_test_id("nav-runs").click()
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        expect(page.get_by_test_id("group-header").first).to_be_visible()
        page.get_by_test_id("nav-charts").click()
        switch(page, "plot-groups").click()
        expect(page.get_by_test_id("plot-groups")).to_be_checked()
        # Drawn by step: the select says so (not "relative wall time"), and cannot be changed.
        expect(x_sel).to_be_disabled()
        expect(x_sel).to_have_value("step")
        expect(x_sel.locator("option:checked")).to_have_text("step")
        expect(x_sel).to_have_attribute("title", "Group means are taken step by step")
        # Groups off: the wall-time axis chosen before comes back.
        switch(page, "plot-groups").click()
        expect(x_sel).to_be_enabled()
        expect(x_sel).to_have_value("time")
        expect(line_chart(page, "loss").locator(".plot")).to_have_attribute("data-x-label", re.compile("^time since"))
        s.assert_clean()


def test_rows_logged_at_one_wall_time_are_all_drawn_on_the_time_axis(browser: Browser, tmp_path: Path) -> None:
    # 50 rows in one millisecond (loss 0..49), then one more a second later: on wall time the
    # chart drew one point at loss 49, its y axis around 49 only.
    root = tmp_path / "traceml" / "runs"
    rows = [{"step": s, "time": T0 + 5.0, "loss": float(s)} for s in range(50)]
    rows.append({"step": 50, "time": T0 + 6.0, "loss": 25.0})
    write_run(root, "burst", {"name": "burst", **RUN}, rows=rows)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        plot(page, "burst")
        page.get_by_test_id("x-axis").select_option("time")
        chart = line_chart(page, "loss")
        expect(chart.locator(".plot")).to_have_attribute("data-x-label", re.compile("^time since"))
        plot_el = chart.locator(".plot")
        expect(plot_el).to_have_attribute("data-x-label", "time since start (s)")
        x_ticks = [float(t) for t in (plot_el.get_attribute("data-x-ticks") or "").split()]
        assert x_ticks and 4.5 <= min(x_ticks) and max(x_ticks) <= 6.5, x_ticks  # 5 s, then 6 s
        values = [float(t) for t in y_ticks(chart)]
        assert min(values) <= 5 and max(values) >= 45, values  # the axis covers loss 0 … 49
        # Hovering the burst's time gives one of its rows (every one is a point of the line).
        box = chart.locator(".u-over").bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + 3, box["y"] + box["height"] / 2)
        tip = chart.locator(".plot-tip")
        expect(tip).to_be_visible()
        shown = float(tip.locator(".plot-tip-v").first.inner_text())
        assert 0 <= shown <= 49
        s.assert_clean()


def test_scatter_points_at_the_lowest_and_highest_values_sit_inside_the_axes(browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    for i, (lr, auc) in enumerate([(0.0, 0.0), (0.5, 0.5), (1.0, 1.0)]):
        write_run(root, f"r{i}", {"name": f"r{i}", **RUN}, params=f"lr: {lr}\n",
                  rows=[{"step": 0, "val/auc": auc}])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-scatter").click()
        page.get_by_test_id("scatter-x").select_option("config.lr")
        page.get_by_test_id("scatter-y").select_option("run.last.val/auc")
        points = page.get_by_test_id("scatter-point")
        expect(points).to_have_count(3)
        svg = page.get_by_test_id("chart-scatter")
        x_line = svg.locator("g.axis-x line.axis-line")
        y_line = svg.locator("g.axis-y line.axis-line")
        axis_y = float(x_line.get_attribute("y1") or "nan")  # the x axis line's height
        axis_x = float(y_line.get_attribute("x1") or "nan")  # the y axis line's left
        right = float(x_line.get_attribute("x2") or "nan")
        top = float(y_line.get_attribute("y1") or "nan")
        xs = [float(c.get_attribute("cx") or "nan") for c in points.all()]
        ys = [float(c.get_attribute("cy") or "nan") for c in points.all()]
        # The point at (0, 0) is off both axis lines, the one at (1, 1) inside the plot's far edges:
        # a few per cent of the plot in, not on the line.
        assert min(xs) - axis_x >= 0.02 * (right - axis_x), (xs, axis_x)
        assert axis_y - max(ys) >= 0.02 * (axis_y - top), (ys, axis_y)
        assert right - max(xs) >= 0.02 * (right - axis_x) and min(ys) - top >= 0.02 * (axis_y - top)
        # No nonsensical ticks: nothing below zero for these non-negative values.
        ticks = [float(t) for t in svg.locator("g.axis text.tick").all_text_contents()]
        assert ticks and min(ticks) == 0
        s.assert_clean()


def test_the_page_says_it_is_disconnected_when_the_server_stops_and_recovers_when_it_answers(
    browser: Browser, tmp_path: Path,
) -> None:
    root = tmp_path / "traceml" / "runs"
    write_run(root, "r0", {"name": "r0", **RUN}, rows=[{"step": 0, "loss": 1.0}])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        status = page.get_by_test_id("last-refreshed")
        expect(status).to_have_attribute("data-state", "live")
        expect(status).to_have_text(re.compile(r"^Refreshed "))
        # Ctrl+C of traceml ui: the page says it lost the server instead of counting on.
        v.proc.send_signal(signal.SIGINT)
        v.proc.wait(timeout=60)
        expect(status).to_have_attribute("data-state", "disconnected", timeout=30_000)
        expect(status).to_have_text(re.compile(r"^Disconnected from the viewer server — retrying"))
        expect(page.locator(".live-dot.is-disconnected")).to_be_visible()
        # The server comes back on the same port, with a new token: the page says that retrying
        # cannot help; given the new token (as opening the printed URL would) it reconnects by
        # itself and counts from its polls again.
        port = v.base.rsplit(":", 1)[1]
        env = {k: val for k, val in os.environ.items() if not k.startswith("TRACEML_")}
        again = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", port, "--no-browser"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, "COLUMNS": "200"},
        )
        try:
            assert again.stdout is not None
            line = again.stdout.readline()
            match = re.search(r"\?token=([\w-]+)", line)
            assert match, line
            expect(status).to_have_attribute("data-state", "token-refused", timeout=45_000)
            expect(status).to_have_text(re.compile(r"^The viewer server restarted: open the URL traceml ui printed"))
            page.context.add_cookies([{"name": f"traceml_token_{port}", "value": match.group(1),
                                       "url": v.base, "httpOnly": True, "sameSite": "Strict"}])
            expect(status).to_have_attribute("data-state", "live", timeout=45_000)
            expect(status).to_have_text(re.compile(r"^Refreshed "))
            expect(page.locator(".live-dot.is-live")).to_be_visible()
        finally:
            again.send_signal(signal.SIGINT)
            try:
                again.wait(timeout=60)
            except subprocess.TimeoutExpired:
                again.kill()
                again.wait()
        assert s.page_errors == []  # (the refused connections are console errors of the browser's own)
