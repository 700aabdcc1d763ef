"""Plot by groups in a real browser, past the review of issue 15: the group means cover every
selected run (not the first 30 a chart draws as lines), a zoom fetches the band again for the
zoomed steps, and the tooltip gives every group's (and, without groups, every run's) nearest
point, with a group's full run count."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cli.test_runs_cli_readers import write_run
from tests.ui.test_browser import CHROMIUM, drag_zoom, expect, line_chart, open_viewer, select_runs, serve, switch
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from tests.ui.test_series_groups import SPIKE_STEP, write_spike_runs

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)

GROUP = "config.data.dataset"
CIFAR_RUNS = 40
MNIST_RUNS = 5
STEPS = 50


def write_two_groups(root: Path) -> None:
    """40 cifar runs logging at even steps (run i: loss = i at every step) and 5 mnist runs at odd
    steps (run j: loss = 100 + j): 45 runs, and no step that both groups log."""
    run = {"status": "completed", "started_at": "2026-11-30T10:00:00Z"}
    for i in range(CIFAR_RUNS):
        write_run(root, f"c{i:02d}", {"name": f"c{i:02d}", **run}, params="data:\n  dataset: cifar\n",
                  rows=[{"step": 2 * s, "loss": float(i)} for s in range(STEPS)])
    for j in range(MNIST_RUNS):
        write_run(root, f"m{j}", {"name": f"m{j}", **run}, params="data:\n  dataset: mnist\n",
                  rows=[{"step": 2 * s + 1, "loss": 100.0 + j} for s in range(STEPS)])


def plot_groups(page: Page, labels: list[str] | None, n_runs: int) -> None:
    """Group the table by dataset, tick the groups ``labels`` (None: every run shown), plot them
    by groups."""
    page.get_by_test_id("group-by").select_option(GROUP)
    expect(page.get_by_test_id("group-header").first).to_be_visible()
    if labels is None:
        page.get_by_test_id("select-all").check()
    for label in labels or []:
        page.locator(f"[data-testid=group-header][data-group='{label}'] [data-testid=group-select]").check()
    expect(page.get_by_test_id("selection-count")).to_have_text(str(n_runs))
    page.get_by_test_id("selection-plot").click()
    switch(page, "plot-groups").click()
    expect(page.get_by_test_id("plot-groups")).to_be_checked()


def hover(page: Page, chart: Locator, fraction: float) -> Locator:
    """Move over ``chart`` at ``fraction`` of its width; its tooltip."""
    box = chart.locator(".u-over").bounding_box()
    assert box is not None
    page.mouse.move(0, 0)
    page.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2)
    tip = chart.locator(".plot-tip")
    expect(tip).to_be_visible()
    return tip


def test_the_group_means_of_45_selected_runs_cover_all_45_and_the_tooltip_shows_each_group(
    browser: Browser, tmp_path: Path,
) -> None:
    root = tmp_path / "traceml" / "runs"
    write_two_groups(root)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        bodies: list[dict[str, object]] = []
        page.on("request", lambda r: bodies.append(json.loads(r.post_data or "{}")) if "/api/series" in r.url else None)
        plot_groups(page, None, CIFAR_RUNS + MNIST_RUNS)
        legend = page.get_by_test_id("legend-group")
        expect(legend).to_have_count(2)
        assert legend.all_inner_texts() == [f"cifar ({CIFAR_RUNS} runs)", f"mnist ({MNIST_RUNS} runs)"]
        expect(page.get_by_test_id("group-legend-title")).to_have_text(
            f"mean of {CIFAR_RUNS + MNIST_RUNS} runs by {GROUP} · band: min–max")
        expect(page.get_by_test_id("series-cap")).to_have_count(0)  # nothing is left out
        grouped = [b for b in bodies if b.get("group_by") == GROUP]
        assert grouped and len(grouped[-1]["keys"]) == CIFAR_RUNS + MNIST_RUNS  # type: ignore[arg-type]
        chart = line_chart(page, "loss")
        expect(chart.locator(".plot")).to_have_attribute("data-groups", "2")
        # No step is logged by both groups: the tooltip still gives each group's nearest point,
        # with the full number of runs averaged there (40 and 5, not a truncated count).
        tip = hover(page, chart, 0.5)
        rows = tip.get_by_test_id("group-tip-row")
        expect(rows).to_have_count(2)
        cifar, mnist = rows.nth(0), rows.nth(1)
        expect(cifar.locator(".plot-tip-name")).to_have_text("cifar")
        expect(cifar.locator(".plot-tip-n")).to_have_text(f"n={CIFAR_RUNS}")
        expect(cifar.locator(".plot-tip-v")).to_have_text("19.5")  # the mean of 0..39, not of 0..29
        expect(cifar.locator(".plot-tip-sub")).to_have_text(re.compile(r"^min–max 0 – 39 · step \d*[02468]$"))
        expect(mnist.locator(".plot-tip-n")).to_have_text(f"n={MNIST_RUNS}")
        expect(mnist.locator(".plot-tip-v")).to_have_text("102")
        expect(mnist.locator(".plot-tip-sub")).to_have_text(re.compile(r"^min–max 100 – 104 · step \d*[13579]$"))
        assert cifar.locator(".plot-tip-n").evaluate("(e) => e.scrollWidth <= e.clientWidth + 1")
        steps = [int(r.get_attribute("data-step") or "-1") for r in (cifar, mnist)]
        assert abs(steps[0] - steps[1]) == 1  # both nearest to the hovered step
        # The chart CSV (the export button) averages the same 45 runs.
        page.get_by_test_id("export-chart-csv").click()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Line chart CSV saved:")
        lines = Path(page.get_by_test_id("export-path").inner_text()).read_text(encoding="utf-8").splitlines()
        table = list(csv.reader(lines))
        cifar_rows = [r for r in table[1:] if r[0] == "cifar"]
        assert len(cifar_rows) == STEPS and {r[-1] for r in cifar_rows} == {str(CIFAR_RUNS)}
        assert {float(r[2]) for r in cifar_rows} == {19.5}
        # The ± std band is the population std, said in the legend and the tooltip.
        page.get_by_test_id("band").select_option("std")
        expect(page.get_by_test_id("group-legend-title")).to_contain_text("band: ± population std")
        tip = hover(page, line_chart(page, "loss"), 0.5)
        sub = tip.get_by_test_id("group-tip-row").nth(1).locator(".plot-tip-sub")
        expect(sub).to_have_text(re.compile(r"^± 1\.4142 \(population std\) · step \d+$"))  # std of 100..104
        s.assert_clean()


def test_zooming_a_grouped_chart_fetches_the_band_again_for_the_zoomed_steps(browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    write_spike_runs(root)  # cifar: 2,000 steps of a (one spike) and b; drawn with 200 points at most
    with serve(root, TRACEML_MAX_POINTS_PER_SERIES="200") as v, open_viewer(browser, v) as s:
        page = s.page
        plot_groups(page, ["cifar"], 2)
        chart = line_chart(page, "loss")
        expect(chart.locator(".plot")).to_have_attribute("data-groups", "1")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "downsampled")
        bodies: list[dict[str, object]] = []
        page.on("request", lambda r: bodies.append(json.loads(r.post_data or "{}")) if "/api/series" in r.url else None)
        start = SPIKE_STEP / 2000 - 0.03
        drag_zoom(page, chart, start, start + 0.06)  # ~120 steps around the spike: every one drawn
        chart = line_chart(page, "loss")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "zoom-full")
        asked = [b for b in bodies if "x_range" in b]
        assert asked and asked[-1]["group_by"] == GROUP, bodies
        lo, hi = asked[-1]["x_range"]  # type: ignore[misc]
        assert lo < SPIKE_STEP < hi and hi - lo < 200
        # Every step of the zoom is drawn now: hovering walks the steps one by one.
        tip = hover(page, chart, 0.5)
        expect(tip.locator(".plot-tip-n")).to_have_text("n=2")
        # Double-click: the whole, downsampled band again.
        chart.locator(".u-over").dblclick()
        chart = line_chart(page, "loss")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "downsampled")
        s.assert_clean()


def test_the_tooltip_of_runs_logged_at_other_steps_gives_each_runs_nearest_point(
    browser: Browser, tmp_path: Path,
) -> None:
    # Without groups too: "even" logs at even steps, "odd" at odd ones, "short" stops at step 10.
    root = tmp_path / "traceml" / "runs"
    run = {"status": "completed", "started_at": "2026-11-30T10:00:00Z"}
    write_run(root, "even", {"name": "even", **run}, rows=[{"step": 2 * s, "loss": 1.0} for s in range(STEPS)])
    write_run(root, "odd", {"name": "odd", **run}, rows=[{"step": 2 * s + 1, "loss": 2.0} for s in range(STEPS)])
    write_run(root, "short", {"name": "short", **run}, rows=[{"step": s, "loss": 3.0} for s in range(11)])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        select_runs(page, "even", "odd", "short")
        page.get_by_test_id("selection-plot").click()
        chart = line_chart(page, "loss")
        expect(chart.locator("canvas")).to_be_visible()
        tip = hover(page, chart, 0.5)
        # Both long runs, at their own nearest step; "short" ended long before: left out.
        expect(tip.locator(".plot-tip-row")).to_have_count(2)
        assert tip.locator(".plot-tip-name").all_inner_texts() == ["odd", "even"]  # by value, highest first
        assert tip.locator(".plot-tip-v").all_inner_texts() == ["2", "1"]
        tip = hover(page, chart, 0.05)  # step ~5: all three
        expect(tip.locator(".plot-tip-row")).to_have_count(3)
        s.assert_clean()
