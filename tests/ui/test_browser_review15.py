"""Issue 15, what a fresh-user review of the finished viewer still found, in a real browser (Debian's
chromium via Playwright, a real ``traceml ui``): Back after a sort or a filter, each column once in
the dropdowns, the bar chart's and line chart's counts, logs opening at their end, no ``null`` or
``None`` for a field run.json leaves empty, and zooming into a range that is still downsampled.

Driven as ``tests/ui/test_browser.py`` drives the viewer; skipped without ``/usr/bin/chromium``.
Screenshots land in ``test-artifacts/screens/``.
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
    big_run_plotted,
    drag_zoom,
    expect,
    line_chart,
    open_viewer,
    row,
    scrolled_to_end,
    serve,
    serve_fake_runs,
    shot,
    shown_keys_are,
    x_range,
)
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from traceml_ai.runs.fake import generate

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

    from tests.ui.test_browser import Viewer

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)

LOG_LINES = 400


def add_odd_runs(root: Path) -> None:
    """A run whose run.json has no status, one that failed with an exit code and a null signal, and
    a long ``logs/run.log`` on the first."""
    start = "2026-11-30T10:00:00Z"
    odd = write_run(root, "20261130-100000_no-status_aaaa",
                    {"id": "20261130-100000_no-status_aaaa", "name": "no-status", "started_at": start})
    (odd / "logs").mkdir()
    (odd / "logs" / "run.log").write_text("".join(f"log line {i:04d}\n" for i in range(LOG_LINES)), encoding="utf-8")
    write_run(root, "20261130-100000_coded_bbbb", {
        "id": "20261130-100000_coded_bbbb", "name": "coded", "started_at": start, "status": "failed",
        "ended_at": "2026-11-30T10:05:00Z",
        "exit": {"code": 1, "signal": None, "error_type": "ValueError", "error_message": "bad batch"},
    })


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """24 fake runs (seed 0) and the two odd runs, served for the whole module."""
    with serve_fake_runs(tmp_path_factory.mktemp("review15") / "traceml" / "runs", add_odd_runs) as v:
        yield v


def sort_mark(page: Page, column: str) -> str:
    return page.locator(f".col-title[data-column='{column}'] .col-sort").inner_text()


# -- Back restores the table as it was (sort, filter, search) -------------------------------------------


def test_back_after_a_sort_or_a_filter_shows_the_table_before_it_and_stays_in_the_app(
    browser: Browser, viewer: Viewer,
) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        app = page.url.split("#")[0]
        unsorted = viewer.table()["keys"]
        by_group = viewer.table(sort="group")["keys"]
        assert by_group != unsorted
        page.locator(".col-title[data-column=group] .col-name").click()
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("↑")
        shown_keys_are(page, by_group)
        page.wait_for_function("() => location.hash.includes('o=group')")
        page.get_by_test_id("search").fill("resnet")
        expect(page.get_by_test_id("table-info")).to_have_text(re.compile(r"^(?!26 )\d+ of 26 runs$"))
        page.wait_for_function("() => location.hash.includes('q=resnet')")

        page.go_back()  # the search goes; the sort stays
        expect(page.get_by_test_id("search")).to_have_value("")
        expect(page.get_by_test_id("table-info")).to_have_text("26 runs")
        shown_keys_are(page, by_group)
        assert page.url.startswith(app)
        page.go_back()  # the sort goes: the table as the page opened
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("")
        shown_keys_are(page, unsorted)
        assert page.url.startswith(app)
        expect(page.get_by_test_id("view-runs")).to_be_visible()
        page.go_forward()
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("↑")
        shown_keys_are(page, by_group)

        # A column filter is an entry too, and Back takes its chip away.
        page.locator("[data-testid=column-filter][data-column='run.best.val/auc']").click()
        page.get_by_test_id("filter-popover").get_by_test_id("filter-input").fill(">=0.9")
        page.get_by_test_id("filter-popover").get_by_test_id("filter-apply").click()
        expect(page.get_by_test_id("filter-chip")).to_have_count(1)
        page.wait_for_function("() => location.hash.includes('f=')")
        page.go_back()
        expect(page.get_by_test_id("filter-chip")).to_have_count(0)
        expect(page.get_by_test_id("table-info")).to_have_text("26 runs")
        assert page.url.startswith(app)
        shot(page, "back-after-filter")
        s.assert_clean()


# -- each column once in the dropdowns, told apart by kind ---------------------------------------------


def test_every_column_dropdown_lists_each_column_once_with_its_kind_where_names_repeat(
    browser: Browser, viewer: Viewer,
) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        read = "(sel) => [...sel.options].map((o) => [o.value, o.textContent])"
        pickers = [page.get_by_test_id("group-by")]
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-scatter").click()
        pickers += [page.get_by_test_id(t) for t in ("scatter-x", "scatter-y", "scatter-color")]
        checked = 0
        for picker in pickers:
            options = picker.evaluate(read)
            values = [v for v, _ in options]
            labels = [t for _, t in options]
            assert len(values) == len(set(values)), picker
            assert len(labels) == len(set(labels)), [t for t in labels if labels.count(t) > 1]
            by_value = dict(options)
            # val/auc has a best and a last value (and a start one): each says which it is.
            if "run.best.val/auc" in by_value and "run.last.val/auc" in by_value:
                assert by_value["run.best.val/auc"] == "val/auc (best)"
                assert by_value["run.last.val/auc"] == "val/auc (last)"
                checked += 1
            # A name used once keeps its plain label.
            if "config.optim.lr" in by_value:
                assert by_value["config.optim.lr"] == "optim.lr"
        assert checked >= 3
        # The closed dropdown names the kind of what it holds.
        page.get_by_test_id("scatter-y").select_option("run.best.val/auc")
        expect(page.get_by_test_id("scatter-y").locator("option:checked")).to_have_text("val/auc (best)")
        # A filter chip names its column the same way.
        page.get_by_test_id("nav-runs").click()
        page.locator("[data-testid=column-filter][data-column='run.best.val/auc']").click()
        page.get_by_test_id("filter-popover").get_by_test_id("filter-input").fill(">=0.9")
        page.get_by_test_id("filter-popover").get_by_test_id("filter-apply").click()
        expect(page.get_by_test_id("filter-chip").locator(".chip-col")).to_have_text("val/auc (best)")
        s.assert_clean()


# -- counts that read sensibly ------------------------------------------------------------------------------


def test_the_bar_and_line_charts_count_runs_without_saying_n_of_n(browser: Browser, viewer: Viewer) -> None:
    runs = viewer.api("/api/runs")["runs"]
    with_value = sum(1 for r in runs if (r["best"].get("val/auc") or {}).get("value") is not None)
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-bar").click()
        page.get_by_test_id("bar-field").select_option("run.best.val/auc")
        expect(page.get_by_test_id("bar").first).to_be_visible()
        expect(page.get_by_test_id("bar-count")).to_have_text(f"{with_value} runs")
        page.get_by_test_id("chart-kind-line").click()
        for name in ("baseline", "high-lr"):
            page.get_by_test_id("nav-runs").click()
            row(page, name).get_by_test_id("row-check").check()
        page.get_by_test_id("nav-charts").click()
        expect(page.get_by_test_id("chart-scope")).to_have_text("2 selected runs")
        text = page.locator(".view-charts, [data-testid=view-charts]").first.inner_text()
        assert not re.search(r"\b(\d+) of \1\b", text), text
        s.assert_clean()


# -- a log opens at its end ----------------------------------------------------------------------------------


def test_the_run_log_opens_scrolled_to_its_newest_lines(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "no-status").locator(".cell-name").click()
        page.locator("[data-testid=file-button][data-file='logs/run.log']").click()
        content = page.get_by_test_id("file-content")
        expect(content).to_contain_text(f"log line {LOG_LINES - 1:04d}")
        body = page.get_by_test_id("file-viewer").locator(".modal-body")
        scrolled_to_end(page, body)
        # The last line is on screen, the first is not.
        last = content.bounding_box()
        frame = body.bounding_box()
        assert last is not None and frame is not None
        assert last["y"] + last["height"] <= frame["y"] + frame["height"] + 2  # the end is in view
        assert last["y"] < frame["y"]  # the start is scrolled away
        shot(page, "run-log-tail")
        # Other files still open at their top.
        page.get_by_test_id("modal-close").click()
        page.locator("[data-testid=file-button][data-file='run.json']").click()
        expect(page.get_by_test_id("file-content")).to_contain_text('"name"')
        assert page.get_by_test_id("file-viewer").locator(".modal-body").evaluate("(el) => el.scrollTop") == 0
        s.assert_clean()


# -- no "null" / "None" for a field run.json leaves empty -------------------------------------------------------


def test_a_missing_status_or_signal_reads_as_a_dash_or_is_left_out(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "no-status").locator(".cell-name").click()
        info = page.get_by_test_id("inspector-info")
        status = info.locator("tr").filter(has=page.locator("td.kv-key", has_text=re.compile(r"^status$")))
        expect(status.locator("td").nth(1)).to_have_text(re.compile(r"^– \(shown as \w+\)$"))
        expect(page.locator(".insp-body")).not_to_contain_text("null")
        expect(page.locator(".insp-body")).not_to_contain_text("None")

        row(page, "coded").locator(".cell-name").click()
        expect(page.get_by_test_id("inspector-name")).to_have_text("coded")
        expect(page.get_by_test_id("error-exit")).to_have_text("exit code 1")
        for word in ("signal", "null", "None", "undefined"):
            expect(page.get_by_test_id("error-callout")).not_to_contain_text(word)
        shot(page, "inspector-no-null")
        s.assert_clean()


# -- issue 15 item 12: a zoom still holding more points than the chart draws -----------------------------------


def test_a_wide_zoom_into_a_downsampled_series_gets_finer_min_max_buckets_of_that_range(
    browser: Browser, tmp_path: Path,
) -> None:
    """Item 12's other half: a zoomed range with more raw points than the chart draws is bucketed
    again over that range alone (finer than the whole history's buckets), not drawn from the
    whole history's points and not every raw point."""
    with big_run_plotted(browser, tmp_path / "traceml" / "runs") as (v, s):
        page = s.page

        def chart() -> Locator:
            return line_chart(page, "val/loss")

        card = chart()
        answers: list[dict[str, object]] = []
        page.on("response", lambda r: answers.append(r.json()) if "/api/series" in r.url and r.ok else None)
        lo, hi = x_range(page, card)
        drag_zoom(page, card, 0.10, 0.60)  # half the steps: ~1,000 raw points
        card = chart()
        expect(card.get_by_test_id("series-detail")).to_have_attribute("data-detail", "zoom-downsampled")
        zoomed = [a for a in answers if a.get("series")]
        assert zoomed
        series = zoomed[-1]["series"][0]  # type: ignore[index]
        assert series["downsampled"] and 200 < series["raw_points"]
        zlo, zhi = x_range(page, card)
        assert lo < zlo < zhi < hi
        # Finer than before: the zoom's points inside the range outnumber the whole view's there.
        whole = v.api("/api/series", {"keys": [v.key_of("big-run")], "metrics": ["val/loss"], "x": "step"})
        before = [x for x in whole["series"][0]["x"] if zlo <= x <= zhi]
        inside = [x for x in series["x"] if zlo <= x <= zhi]
        assert len(inside) > 1.5 * len(before)
        expect(card.get_by_test_id("series-detail")).to_have_text("zoom: downsampled")
        shot(page, "chart-zoom-downsampled")
        s.assert_clean()


def test_the_captured_output_of_a_rank_opens_at_its_end_and_again_on_another_stream(
    browser: Browser, tmp_path: Path,
) -> None:
    """The Performance view's "Captured output" panel (the inspector links to it): the newest lines
    in view when it opens (like a terminal), and again after picking another stream."""
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=2, seed=0)
    agg = next(root.glob("*_baseline_*")) / "aggregator"
    agg.mkdir()
    (agg / "telemetry.sqlite").write_bytes(b"not a database\n" * 100)  # logs are read without it
    (agg / "rank_0.log").write_text("".join(
        f"{'stderr' if i % 10 == 9 else 'stdout'} | output line {i:04d}\n" for i in range(LOG_LINES)))
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        row(page, "baseline").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        run = page.locator("[data-testid=perf-run][data-name=baseline]")
        log = run.get_by_test_id("telemetry-log")
        expect(log).to_contain_text(f"output line {LOG_LINES - 1:04d}")
        log.scroll_into_view_if_needed()
        scrolled_to_end(page, log)
        expect(log.get_by_test_id("log-line").last).to_be_in_viewport()
        log.evaluate("(el) => { el.scrollTop = 0; }")  # the user reads older lines...
        run.get_by_test_id("telemetry-log-stderr").click()
        expect(log.locator("[data-testid=log-line][data-stream=stdout]")).to_have_count(0)
        scrolled_to_end(page, log)  # ...another stream opens at its end
        shot(page, "perf-captured-output-tail")
        s.assert_clean()
