"""Issue 15, the last findings of a fresh-user review, in a real browser (Debian's chromium via
Playwright, a real ``traceml ui``): Compare marks only differences a reader can see, the default
columns hold the swept ``optim.lr``, the table says how many runs are hidden, an empty table is
not exported over ``latest.csv``, and a chart's step ticks are whole steps that do not overlap.

Driven as ``tests/ui/test_browser.py`` drives the viewer; skipped without ``/usr/bin/chromium``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cli.test_runs_cli_readers import write_run
from tests.ui.test_browser import (
    CHROMIUM,
    expect,
    line_chart,
    open_viewer,
    row,
    select_runs,
    serve_fake_runs,
    shot,
)
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator

    from tests.ui.test_browser import Viewer

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)


def add_near_twins(root: Path) -> None:
    """Two runs that differ only below what the page shows in their start (same minute) and
    duration (the same rounded second), and in an lr the short number format rounds alike; and
    visibly in width."""
    pair = (("near-a", "05", 1800.2, 1e-4, 64), ("near-b", "40", 1800.4, 1.00001e-4, 128))
    for name, start, duration, lr, width in pair:
        write_run(root, f"20261130-100000_{name}_cccc", {
            "id": f"20261130-100000_{name}_cccc", "name": name, "status": "completed",
            "started_at": f"2026-11-30T10:00:{start}Z", "ended_at": "2026-11-30T10:30:00Z", "duration_s": duration,
        }, params=f"optim:\n  lr: {lr!r}\nmodel:\n  width: {width}\n", rows=[{"step": 0, "loss": 1.0}])


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """The 24 fake runs (seed 0) and the two near twins, served for the whole module."""
    with serve_fake_runs(tmp_path_factory.mktemp("fresh15") / "traceml" / "runs", add_near_twins) as v:
        yield v


def compare_row(table: Locator, label: str) -> Locator:
    return table.get_by_test_id("compare-row").filter(
        has=table.page.locator("td.compare-key", has_text=re.compile(f"^{re.escape(label)}$")))


def test_compare_marks_a_row_differing_only_when_its_shown_values_differ(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        select_runs(page, "near-a", "near-b")
        page.get_by_test_id("selection-compare").click()
        table = page.get_by_test_id("compare-table")
        # Started the same minute and 30m 00s both: they read alike, so they are not "differs".
        for label, text in (("started", None), ("duration", "30m 00s")):
            r = compare_row(table, label)
            expect(r).to_have_attribute("data-diff", "0")
            expect(r.locator(".diff-mark")).to_have_count(0)
            if text:
                assert r.locator("td").all_inner_texts()[1:] == [text, text]
        # An lr that the 4-digit format shows alike (1e-4) is shown in full, so the mark has a reason.
        lr = compare_row(table, "optim.lr")
        expect(lr).to_have_attribute("data-diff", "1")
        assert lr.locator("td").all_inner_texts()[1:] == ["0.0001", "0.000100001"]
        expect(compare_row(table, "model.width")).to_have_attribute("data-diff", "1")
        assert compare_row(table, "model.width").locator("td").all_inner_texts()[1:] == ["64", "128"]
        n = table.locator("[data-testid=compare-row][data-diff='1']").count()
        expect(page.get_by_test_id("compare-diff-count")).to_have_text(f"{n} differing rows")
        s.assert_clean()


def test_the_default_columns_hold_the_swept_lr_among_the_params_that_vary(browser: Browser, viewer: Viewer) -> None:
    # The fake sweep lists six data/model keys of two to five values before optim.lr (a value
    # per run): the six that vary most are shown, lr among them.
    with open_viewer(browser, viewer) as s:
        page = s.page
        fields = page.locator(".tabulator-headers .tabulator-col").evaluate_all(
            "(cols) => cols.map((c) => c.getAttribute('tabulator-field')).filter((f) => f && f.startsWith('config.'))")
        assert "config.optim.lr" in fields and len(fields) == 6, fields
        assert fields == [c for c in viewer.table()["columns"]["default"] if c.startswith("config.")]
        s.assert_clean()


def test_the_table_says_how_many_runs_are_hidden(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        info = page.get_by_test_id("table-info")
        expect(info).to_have_text("26 runs")
        select_runs(page, "near-a", "near-b")
        page.get_by_test_id("hide-selected").click()
        try:
            expect(info).to_have_text("24 runs · 2 hidden")
            assert "Show hidden runs" in (info.get_attribute("title") or "")
            expect(page.get_by_test_id("hidden-count")).to_have_text(" (2)")
            page.get_by_test_id("show-hidden").locator("xpath=..").click()
            expect(info).to_have_text("26 runs")  # shown again: nothing is left out
            expect(row(page, "near-a")).to_contain_text("hidden")
            shot(page, "table-hidden-count")
        finally:
            viewer.api("/api/hide", {"keys": [r["key"] for r in viewer.api("/api/runs")["runs"]
                                              if r["name"] in ("near-a", "near-b")], "hidden": False})
        s.assert_clean()


def test_an_empty_table_is_not_exported_and_latest_csv_stays(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("export-table").click()
        expect(page.get_by_test_id("export-bar")).to_be_visible()
        latest = Path(page.get_by_test_id("export-path").inner_text()).with_name("latest.csv")
        kept = latest.read_bytes()
        assert len(kept.splitlines()) == 27  # the header and 26 runs
        page.get_by_test_id("search").fill("no run is named like this")
        expect(page.get_by_test_id("table-info")).to_have_text("0 of 26 runs")
        page.get_by_test_id("export-table").click()
        expect(page.get_by_test_id("toast").last).to_have_text(
            "Nothing to export: the table shows no runs (latest.csv is left as it was).")
        assert latest.read_bytes() == kept
        # The server refuses it too (an agent's own call).
        with pytest.raises(Exception, match="400"):
            viewer.api("/api/export/table", {"keys": [], "columns": ["name"]})
        assert latest.read_bytes() == kept
        s.assert_clean()


def test_the_tick_labels_of_a_line_chart_are_whole_steps_and_do_not_overlap(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        select_runs(page, "baseline", "high-lr")
        page.get_by_test_id("selection-plot").click()
        chart = line_chart(page, "val/loss")
        expect(chart.locator("canvas")).to_be_visible()
        ticks = chart.locator(".plot").get_attribute("data-x-ticks") or ""
        labels = ticks.split(" ")
        assert len(labels) >= 3, ticks
        # 20 steps: whole-number ticks (0 5 10 15), not 2.5 and 7.5 between them.
        assert all(re.fullmatch(r"\d+", t) for t in labels), ticks
        # At 11 px a digit is at most ~7 px wide: the labels fit the space uPlot leaves per tick.
        width = chart.locator(".u-over").bounding_box()["width"]  # type: ignore[index]
        assert max(len(t) for t in labels) * 7 < width / len(labels), (ticks, width)
        shot(page, "chart-ticks")
        s.assert_clean()
