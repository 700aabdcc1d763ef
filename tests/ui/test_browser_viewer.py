"""Issue 15, the page half, in a real browser (Debian's chromium via Playwright, a real ``traceml ui``):
wall-time ticks, "Refreshed … ago", chart export busy state and refusals, same-name runs, "–" in the
inspector, the bar chart's left-out count, axis padding, "Differing params only" in view, keyboard
navigation of the table.

Driven as ``tests/ui/test_browser.py`` drives the viewer (its server, page and screenshot helpers);
skipped without playwright or ``/usr/bin/chromium``. Screenshots land in ``test-artifacts/screens/``.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.ui.test_browser import (
    CHROMIUM,
    big_run_plotted,
    drag_zoom,
    expect,
    line_chart,
    open_viewer,
    plot,
    row,
    select_runs,
    serve,
    serve_fake_runs,
    shot,
    switch,
    x_range,
)
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from tests.ui.test_series_groups import SPIKE_STEP, STEPS, write_spike_runs
from traceml_ai.runs.fake import generate

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.ui.test_browser import Viewer

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)

TWIN_ID = "20261201-090000_baseline_beef"


def add_twin(root: Path) -> None:
    """A second run named ``baseline`` (another id), with a params value that is null."""
    original = next(root.glob("*_baseline_*"))
    twin = root / TWIN_ID
    shutil.copytree(original, twin)
    run = json.loads((twin / "run.json").read_text(encoding="utf-8"))
    run["id"] = TWIN_ID
    (twin / "run.json").write_text(json.dumps(run, indent=2), encoding="utf-8")
    with (twin / "params.yaml").open("a", encoding="utf-8") as f:
        f.write("optim.warmup: null\n")


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """24 fake runs (seed 0) and a second ``baseline``, served for the whole module."""
    with serve_fake_runs(tmp_path_factory.mktemp("browser15") / "traceml" / "runs", add_twin) as v:
        yield v


def keys_named(viewer: Viewer, name: str) -> list[str]:
    return sorted(str(r["key"]) for r in viewer.api("/api/runs")["runs"] if r["name"] == name)


def only_baseline(page: Page, viewer: Viewer) -> str:
    """Tick the original ``baseline`` (not the twin); returns its key."""
    key = next(k for k in keys_named(viewer, "baseline") if TWIN_ID not in k)
    page.locator(f"[data-testid=run-row][data-key='{key}'] [data-testid=row-check]").check()
    return key


# -- 4. wall-time axis -----------------------------------------------------------------------------


def test_the_wall_time_axis_reads_clean_ticks_in_one_unit_named_in_its_label(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        select_runs(page, "high-lr", "small-model")
        page.get_by_test_id("selection-plot").click()
        expect(page.get_by_test_id("chart-line").first.locator("canvas")).to_be_visible()
        page.get_by_test_id("x-axis").select_option("time")
        plot_el = page.get_by_test_id("chart-line").first.locator(".plot")
        # What the time counts from (item 18: these runs have started_at) and the unit, said once.
        expect(plot_el).to_have_attribute("data-x-label", re.compile(r"^time since start \((s|min|h)\)$"))
        label = plot_el.get_attribute("data-x-label") or ""
        ticks = (plot_el.get_attribute("data-x-ticks") or "").split()
        # The fake runs last about an hour: minutes, in whole clean steps, the unit only in the label.
        assert label == "time since start (min)"
        assert len(ticks) >= 3
        values = [float(t) for t in ticks]  # plain numbers: no "m"/"h" suffix on a tick
        steps = {round(b - a, 6) for a, b in itertools.pairwise(values)}
        assert len(steps) == 1 and steps.pop() in {1, 2, 5, 10, 15, 20, 30, 50, 60}
        assert all(v == int(v) for v in values)
        # The tooltip says the unit too.
        box = page.get_by_test_id("chart-line").first.locator(".u-over").bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
        expect(page.get_by_test_id("chart-line").first.locator(".plot-tip-x")).to_have_text(
            re.compile(r"^time [\d.]+ min$"))
        shot(page, "chart-line-wall-time")
        page.get_by_test_id("x-axis").select_option("step")
        expect(page.get_by_test_id("chart-line").first.locator(".plot")).to_have_attribute("data-x-label", "step")
        s.assert_clean()


# -- 6. refreshed N s ago ----------------------------------------------------------------------------


def test_refreshed_counts_from_the_last_poll_even_when_nothing_changed(browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=3, seed=0)
    with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v, open_viewer(browser, v) as s:
        page = s.page
        refreshed = page.get_by_test_id("last-refreshed")
        expect(refreshed).to_have_text("Refreshed just now")
        first = refreshed.get_attribute("title")
        # Nothing changes on disk; polls go on every second, and the time they ran moves with them.
        page.wait_for_function(
            "(t) => document.querySelector('[data-testid=last-refreshed]').title !== t", arg=first, timeout=30_000)
        page.wait_for_timeout(6500)  # longer than "just now" lasts (5 s) after the page's first answer
        expect(refreshed).to_have_text("Refreshed just now")
        assert (refreshed.get_attribute("title") or "") > (first or "")
        s.assert_clean()


# -- 7. chart export: refusals, busy state, errors ---------------------------------------------------


def test_chart_export_says_why_nothing_is_exported_shows_progress_and_errors(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("nav-charts").click()
        status = page.get_by_test_id("export-status")
        for which in ("png", "csv"):
            page.get_by_test_id(f"export-chart-{which}").click()
            expect(status).to_have_text(re.compile(r"^Nothing to export: select runs to plot first"))
            expect(status).to_have_class(re.compile(r"\bis-error\b"))
        expect(page.get_by_test_id("export-bar")).to_be_hidden()

        page.get_by_test_id("nav-runs").click()
        plot(page, "high-lr", "small-model")
        expect(status).to_have_text("")  # a new selection clears the refusal
        # The server answers slowly (held back 1.5 s on the way): the page shows it is working.
        page.route("**/api/export/chart", lambda route: (page.wait_for_timeout(1500), route.continue_()))
        png = page.get_by_test_id("export-chart-png")
        png.click()
        expect(status).to_have_text("Rendering PNG…")
        expect(png).to_be_disabled()
        expect(page.get_by_test_id("export-chart-csv")).to_be_disabled()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Line chart PNG saved:")
        expect(status).to_have_text("")
        expect(png).to_be_enabled()
        page.unroute("**/api/export/chart")
        saved = Path(page.get_by_test_id("export-path").inner_text())
        assert saved.is_file() and saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # The plots folder is replaced by a file: the server refuses, and the page says why.
        plots = viewer.cache / "plots"
        shutil.rmtree(plots)
        plots.write_text("not a folder", encoding="utf-8")
        try:
            page.get_by_test_id("export-close").click()
            png.click()
            expect(status).to_have_text(re.compile(r"^PNG export failed: .*plots.* is not a folder"))
            expect(png).to_be_enabled()
            expect(page.get_by_test_id("export-bar")).to_be_hidden()
            shot(page, "chart-export-error")
        finally:
            plots.unlink()
        assert s.page_errors == [] and s.csp_violations() == [] and s.dialogs == []


# -- 8. runs with the same name ------------------------------------------------------------------------


def test_runs_with_the_same_name_get_a_short_id_in_legend_and_compare(browser: Browser, viewer: Viewer) -> None:
    twins = keys_named(viewer, "baseline")
    assert len(twins) == 2
    with open_viewer(browser, viewer) as s:
        page = s.page
        for key in twins:
            page.locator(f"[data-testid=run-row][data-key='{key}'] [data-testid=row-check]").check()
        select_runs_more = row(page, "high-lr").get_by_test_id("row-check")
        select_runs_more.check()
        expect(page.get_by_test_id("selection-count")).to_have_text("3")
        page.get_by_test_id("selection-plot").click()
        legend = page.get_by_test_id("legend-item")
        expect(legend).to_have_count(3)
        texts = legend.all_inner_texts()
        twin_labels = sorted(t for t in texts if t.startswith("baseline"))
        short = twins[0].rsplit("_", 1)[-1] if TWIN_ID not in twins[0] else twins[1].rsplit("_", 1)[-1]
        assert twin_labels == sorted([f"baseline · {short}", "baseline · beef"])
        assert "high-lr" in texts  # a unique name stays as it is
        page.get_by_test_id("nav-compare").click()
        names = page.get_by_test_id("compare-run-name").all_inner_texts()
        assert sorted(n for n in names if n.startswith("baseline")) == twin_labels
        shot(page, "compare-same-name")
        s.assert_clean()


# -- 9. the inspector's missing values, the bar chart's left-out runs, axis padding --------------------


def test_the_inspector_shows_a_dash_for_a_null_value(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.locator(f"[data-testid=run-row][data-key$='{TWIN_ID}'] .cell-name").click()
        params = page.get_by_test_id("inspector-params")
        warmup = params.locator("tr").filter(has_text="optim.warmup")
        expect(warmup.locator("td").nth(1)).to_have_text("–")
        expect(params).not_to_contain_text("null")
        s.assert_clean()


def test_the_bar_chart_says_how_many_runs_had_no_value_and_axes_are_not_padded_oddly(
    browser: Browser, viewer: Viewer,
) -> None:
    runs = viewer.api("/api/runs")["runs"]
    without = sum(1 for r in runs if r["summary"].get("test/auc") is None)
    assert 0 < without < len(runs)
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-bar").click()
        page.get_by_test_id("bar-field").select_option("summary.test/auc")
        expect(page.get_by_test_id("bar-dropped")).to_have_text(f"{without} runs without a value left out")
        expect(page.get_by_test_id("bar-count")).to_have_text(f"{len(runs) - without} runs")  # not "n of n"
        # AUC bars: the axis ends at the data (≤ 1.0), not at a far tick like 1.2.
        page.get_by_test_id("bar-field").select_option("run.best.val/auc")
        expect(page.get_by_test_id("bar").first).to_be_visible()
        ticks = [float(t) for t in page.get_by_test_id("chart-bar").locator("g.axis-x text.tick").all_text_contents()]
        assert ticks and max(ticks) <= 1.0
        shot(page, "chart-bar-dropped")

        # Scatter of non-negative values: the axes do not start below zero.
        page.get_by_test_id("chart-kind-scatter").click()
        page.get_by_test_id("scatter-x").select_option("config.optim.lr")
        page.get_by_test_id("scatter-y").select_option("run.best.val/auc")
        expect(page.get_by_test_id("scatter-point").first).to_be_visible()
        texts = page.get_by_test_id("chart-scatter").locator("g.axis text.tick").all_text_contents()
        numbers = [float(t) for t in texts]
        assert numbers and min(numbers) >= 0
        shot(page, "chart-scatter-padding")
        s.assert_clean()


# -- 5. differing params in view ---------------------------------------------------------------------------


def test_differing_params_only_brings_the_differing_columns_into_view(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        holder = page.locator(".tabulator-tableholder")
        holder.evaluate("(el) => { el.scrollLeft = el.scrollWidth; }")
        switch(page, "differing-toggle").click()
        expect(page.get_by_test_id("differing-toggle")).to_be_checked()
        differing = viewer.table(differing="1")["differing"]
        assert differing
        first = page.locator(f".tabulator-col[tabulator-field='{differing[0]}']")
        expect(first).to_be_visible()
        page.wait_for_function("() => document.querySelector('.tabulator-tableholder').scrollLeft === 0")
        box, table_box = first.bounding_box(), page.get_by_test_id("runs-table").bounding_box()
        assert box is not None and table_box is not None
        assert box["x"] + box["width"] <= table_box["x"] + table_box["width"]  # on screen, not off to the right
        name_box = page.locator(".tabulator-col[tabulator-field='name']").bounding_box()
        assert name_box is not None and name_box["x"] < box["x"]  # right after the name
        shot(page, "table-differing")
        s.assert_clean()


# -- 11. keyboard ---------------------------------------------------------------------------------------------


def test_arrow_keys_move_enter_inspects_and_space_ticks(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        rows = page.get_by_test_id("run-row")
        expect(rows.nth(2)).to_be_visible()
        keys = [rows.nth(i).get_attribute("data-key") for i in range(3)]
        rows.nth(0).locator(".cell-name").click()
        table = page.get_by_test_id("runs-table")
        expect(table).to_be_focused()
        expect(table).to_have_attribute("data-cursor", keys[0] or "")
        page.keyboard.press("Escape")  # closes the inspector; the table keeps the focus
        expect(page.get_by_test_id("inspector")).to_be_hidden()
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
        expect(table).to_have_attribute("data-cursor", keys[2] or "")
        expect(rows.nth(2)).to_have_class(re.compile(r"\bis-cursor\b"))
        page.keyboard.press("ArrowUp")
        expect(table).to_have_attribute("data-cursor", keys[1] or "")
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("inspector")).to_be_visible()
        name = viewer.api("/api/runs")["runs"]
        expected = next(r["name"] for r in name if r["key"] == keys[1])
        expect(page.get_by_test_id("inspector-name")).to_have_text(expected)
        page.keyboard.press("Space")
        expect(page.get_by_test_id("selection-count")).to_have_text("1")
        expect(rows.nth(1).get_by_test_id("row-check")).to_be_checked()
        # With the inspector open, the cursor takes it along.
        page.keyboard.press("ArrowDown")
        expected = next(r["name"] for r in name if r["key"] == keys[2])
        expect(page.get_by_test_id("inspector-name")).to_have_text(expected)
        page.keyboard.press("Space")
        expect(page.get_by_test_id("selection-count")).to_have_text("2")
        page.keyboard.press("Space")
        expect(page.get_by_test_id("selection-count")).to_have_text("1")
        # End goes to the last row, scrolled into view.
        page.keyboard.press("End")
        expect(page.locator("[data-testid=run-row].is-cursor")).to_be_in_viewport()
        shot(page, "table-keyboard")
        s.assert_clean()


# -- 10. the view in the URL --------------------------------------------------------------------------------


def test_the_view_lives_in_the_url_back_and_forward_work_and_a_bookmark_restores_it(
    browser: Browser, viewer: Viewer,
) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        assert "token" not in page.url
        page.get_by_test_id("search").fill("resnet")
        expect(page.get_by_test_id("table-info")).to_have_text(re.compile(r"^(?!25 )\d+ of 25 runs$"))
        shown = page.get_by_test_id("table-info").inner_text()
        select_runs(page, "resnet50-c10-22", "resnet18-c10-20")
        page.get_by_test_id("selection-plot").click()
        expect(page.get_by_test_id("view-charts")).to_be_visible()
        page.get_by_test_id("x-axis").select_option("epoch")
        page.get_by_test_id("nav-compare").click()
        expect(page.get_by_test_id("compare-table")).to_be_visible()
        page.wait_for_function("() => location.hash.includes('x=epoch') && location.hash.includes('v=compare')")
        bookmark = page.url
        assert "token" not in bookmark and "#" in bookmark

        page.go_back()
        expect(page.get_by_test_id("view-charts")).to_be_visible()
        expect(page.get_by_test_id("x-axis")).to_have_value("epoch")
        page.go_back()
        expect(page.get_by_test_id("view-runs")).to_be_visible()
        expect(page.get_by_test_id("search")).to_have_value("resnet")
        page.go_forward()
        expect(page.get_by_test_id("view-charts")).to_be_visible()
        expect(page.get_by_test_id("legend-item")).to_have_count(2)
        s.assert_clean()

        # The bookmark, opened in a new tab after the remembered view was reset, shows the same view.
        viewer.forget_view()
        other = page.context.new_page()
        other.goto(bookmark)
        expect(other.get_by_test_id("view-compare")).to_be_visible()
        expect(other.get_by_test_id("compare-run-name")).to_have_count(2)
        expect(other.get_by_test_id("selection-count")).to_have_text("2")
        other.get_by_test_id("nav-runs").click()
        expect(other.get_by_test_id("search")).to_have_value("resnet")
        expect(other.get_by_test_id("table-info")).to_have_text(shown)
        other.get_by_test_id("nav-charts").click()
        expect(other.get_by_test_id("x-axis")).to_have_value("epoch")
        shot(other, "bookmark-restored")
        other.close()


# -- 2. max rows, Open (read-only), column order by dragging --------------------------------------------------


def read_csv(path: Path) -> list[list[str]]:
    import csv

    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_max_rows_limits_the_table_and_its_csv_and_the_export_opens_read_only(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("max-rows").fill("5")
        page.get_by_test_id("max-rows").press("Enter")
        expect(page.get_by_test_id("table-info")).to_have_text("25 runs · first 5 shown")
        expect(page.get_by_test_id("run-row")).to_have_count(5)
        page.get_by_test_id("export-table").click()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Table CSV (5 runs) saved:")
        path = Path(page.get_by_test_id("export-path").inner_text())
        rows = read_csv(path)
        assert len(rows) == 1 + 5
        drawn = [page.get_by_test_id("run-row").nth(i).locator(".cell-name").inner_text() for i in range(5)]
        assert [r[rows[0].index("name")] for r in rows[1:]] == drawn  # the same rows, in table order

        # Open (read-only): the file as written, in a new tab, as text.
        with page.expect_popup() as popup:
            page.get_by_test_id("open-export").click()
        tab = popup.value
        tab.wait_for_load_state()
        assert tab.locator("body").inner_text().splitlines()[0] == ",".join(rows[0])
        tab.close()

        # Emptied, the table shows every run again.
        page.get_by_test_id("max-rows").fill("")
        page.get_by_test_id("max-rows").press("Enter")
        expect(page.get_by_test_id("table-info")).to_have_text("25 runs")

        # A chart PNG opens as an image.
        plot(page, "high-lr", "small-model")
        page.get_by_test_id("export-chart-png").click()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Line chart PNG saved:")
        with page.expect_popup() as popup:
            page.get_by_test_id("open-export").click()
        tab = popup.value
        tab.wait_for_load_state()
        assert tab.evaluate("document.contentType") == "image/png"
        tab.close()
        s.assert_clean()

    # Only the cache folder's own exports are served.
    for bad in ("exports/../ui-state.json", "ui-state.json", "exports/notes.txt", "plots/plot-x.svg"):
        try:
            viewer.api("/api/export/file?name=" + bad.replace("/", "%2F"))
        except Exception as err:  # urllib raises on the 400
            assert "400" in str(err) or "not an export" in str(err)
        else:
            raise AssertionError(f"{bad} was served")


def test_dragging_a_header_reorders_the_columns_and_the_csv_export_follows(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        header = page.locator(".tabulator-col[tabulator-field='started']")
        fields = page.locator(".tabulator-headers .tabulator-col").evaluate_all(
            "(cols) => cols.map((c) => c.getAttribute('tabulator-field')).filter((f) => f && !f.startsWith('_'))")
        target_field = fields[fields.index("started") + 2]  # (id, name, status, … lead any CSV export)
        target = page.locator(f".tabulator-col[tabulator-field='{target_field}']")
        src, dst = header.bounding_box(), target.bounding_box()
        assert src is not None and dst is not None
        page.mouse.move(src["x"] + src["width"] / 2, src["y"] + src["height"] / 2)
        page.mouse.down()
        page.wait_for_timeout(300)  # Tabulator starts a column move after a short hold
        page.mouse.move(dst["x"] + dst["width"] * 0.8, dst["y"] + dst["height"] / 2, steps=15)
        page.mouse.up()
        page.wait_for_function(
            "(t) => { const f = [...document.querySelectorAll('.tabulator-headers .tabulator-col')]"
            ".map((c) => c.getAttribute('tabulator-field')); return f.indexOf('started') > f.indexOf(t); }",
            arg=target_field)
        page.wait_for_function(
            "(t) => location.hash.includes('c=') && location.hash.indexOf('c=started') > location.hash.indexOf("
            "'c=' + encodeURIComponent(t))", arg=target_field)
        page.get_by_test_id("export-table").click()
        expect(page.get_by_test_id("export-bar")).to_be_visible()
        head = read_csv(Path(page.get_by_test_id("export-path").inner_text()))[0]
        assert head.index("started") > head.index(target_field)
        shot(page, "table-column-moved")
        # The order is in the remembered view (saved 0.6 s after the change; a reload keeps it).
        for _ in range(100):
            columns = viewer.api("/api/ui-state").get("columns") or []
            if "started" in columns and columns.index("started") > columns.index(target_field):
                break
            page.wait_for_timeout(100)
        else:
            raise AssertionError(f"the remembered view has columns {columns}")
        s.assert_clean()


# -- 12. zooming a downsampled series ----------------------------------------------------------------------------


def test_zooming_a_downsampled_series_fetches_finer_points_for_the_visible_range(
    browser: Browser, tmp_path: Path,
) -> None:
    # ~2,000 val/loss points, drawn with 200 at most
    with big_run_plotted(browser, tmp_path / "traceml" / "runs") as (v, s):
        page = s.page
        chart = line_chart(page, "val/loss")
        bodies: list[dict[str, object]] = []
        page.on("request", lambda r: bodies.append(json.loads(r.post_data or "{}")) if "/api/series" in r.url else None)
        lo, hi = x_range(page, chart)
        drag_zoom(page, chart, 0.40, 0.45)  # about 5 % of the steps: ~100 raw points, all of them drawn
        chart = line_chart(page, "val/loss")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "zoom-full")
        asked = [b for b in bodies if "x_range" in b]
        assert asked, bodies
        zlo, zhi = asked[-1]["x_range"]  # type: ignore[misc]
        assert lo < zlo < zhi < hi
        # The zoom stays where it was, now drawn from every point in it.
        shown_lo, shown_hi = x_range(page, chart)
        assert lo < shown_lo < shown_hi < hi and shown_hi - shown_lo < 0.2 * (hi - lo)
        shot(page, "chart-zoom-finer")
        # Reset: the whole, downsampled series again.
        page.get_by_test_id("reset-zoom").click()
        chart = line_chart(page, "val/loss")
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "downsampled")
        assert x_range(page, chart) == (lo, hi)
        s.assert_clean()
        key = v.key_of("big-run")
        for bad in ([5, 1], [1], ["a", "b"], "0..9"):
            try:
                v.api("/api/series", {"keys": [key], "metrics": ["val/loss"], "x": "step", "x_range": bad})
            except Exception as err:
                assert "400" in str(err)
            else:
                raise AssertionError(f"x_range {bad!r} was accepted")


# -- 1. plot by groups ----------------------------------------------------------------------------------------------


def test_a_grouped_table_plots_one_mean_line_per_group_with_a_band_and_n(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        expect(page.get_by_test_id("group-header").first).to_be_visible()
        groups = viewer.table(group="config.data.dataset")["groups"]
        # Tick two whole groups (their header checkboxes).
        labels = [g["label"] for g in groups[:2]]
        for label in labels:
            page.locator(f"[data-testid=group-header][data-group='{label}'] [data-testid=group-select]").check()
        n_runs = sum(len(g["keys"]) for g in groups[:2])
        expect(page.get_by_test_id("selection-count")).to_have_text(str(n_runs))
        page.get_by_test_id("selection-plot").click()
        # The groups' means and bands come from the server, over the full histories (group_by).
        with page.expect_response(lambda r: "/api/series" in r.url
                                  and (r.request.post_data_json or {}).get("group_by") == "config.data.dataset") as got:
            switch(page, "plot-groups").click()
        expect(page.get_by_test_id("plot-groups")).to_be_checked()
        answer = got.value.json()
        legend = page.get_by_test_id("legend-group")
        expect(legend).to_have_count(2)
        assert legend.all_inner_texts() == [f"{g['label']} ({len(g['keys'])} runs)" for g in groups[:2]]
        chart = page.get_by_test_id("chart-line").first
        expect(chart.locator(".plot")).to_have_attribute("data-groups", "2")
        metric = chart.get_attribute("data-metric")
        drawn = [g for g in answer["groups"] if g["metric"] == metric]
        assert [g["label"] for g in drawn] == labels and all(min(g["n_runs"]) >= 1 for g in drawn)
        expect(page.get_by_test_id("x-axis")).to_be_disabled()  # means are taken step by step
        # The tooltip gives each group's mean, its band and how many runs had a value at that step.
        box = chart.locator(".u-over").bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] / 2)
        tip = chart.locator(".plot-tip")
        expect(tip).to_be_visible()
        expect(tip.get_by_test_id("group-tip-row")).to_have_count(2)  # each group's nearest point
        expect(tip.locator(".plot-tip-n").first).to_have_text(re.compile(r"^n=\d+$"))
        expect(tip.locator(".plot-tip-v").first).to_have_text(re.compile(r"^[\d.]+$"))
        expect(tip.locator(".plot-tip-sub").first).to_have_text(re.compile(r"^min–max [\d.]+ – [\d.]+ · step \d+$"))
        page.get_by_test_id("band").select_option("std")
        shot(page, "chart-line-groups")
        # The chart CSV carries the groups and the band: group, step, mean, min, max, std, n_runs.
        page.get_by_test_id("export-chart-csv").click()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Line chart CSV saved:")
        table = read_csv(Path(page.get_by_test_id("export-path").inner_text()))
        metric = table[0][2].removeprefix("mean ")
        assert table[0][:2] == ["group", "step"]
        assert table[0][2:7] == [f"mean {metric}", f"min {metric}", f"max {metric}", f"std {metric}",
                                 "n_runs" if len(table[0]) == 7 else f"n_runs {metric}"]
        assert {r[0] for r in table[1:]} == set(labels)
        assert all(float(r[3]) <= float(r[2]) <= float(r[4]) for r in table[1:] if r[2])
        # The PNG is asked for with the band shown (± std here), which it then draws.
        with page.expect_request(lambda r: "/api/export/chart" in r.url) as asked:
            page.get_by_test_id("export-chart-png").click()
        body = json.loads(asked.value.post_data or "{}")
        assert body["format"] == "png" and body["group_by"] == "config.data.dataset" and body["band"] == "std"
        expect(page.get_by_test_id("export-bar")).to_contain_text("Line chart PNG saved:")
        s.assert_clean()


def test_a_spike_of_one_run_shows_in_its_groups_band_on_the_page(browser: Browser, tmp_path: Path) -> None:
    """The band is the server's, over the full histories: at the spike's step the tooltip gives both
    runs (n=2) and the spike as the band's top, though b's drawn series has no point there."""
    root = tmp_path / "traceml" / "runs"
    write_spike_runs(root)
    with serve(root, TRACEML_MAX_POINTS_PER_SERIES="200") as v, open_viewer(browser, v) as s:
        page = s.page
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        page.locator("[data-testid=group-header][data-group='cifar'] [data-testid=group-select]").check()
        expect(page.get_by_test_id("selection-count")).to_have_text("2")
        page.get_by_test_id("selection-plot").click()
        switch(page, "plot-groups").click()
        chart = line_chart(page, "loss")
        expect(chart.locator(".plot")).to_have_attribute("data-groups", "1")
        box = chart.locator(".u-over").bounding_box()
        assert box is not None
        tip = chart.locator(".plot-tip")
        at = box["x"] + box["width"] * SPIKE_STEP / (STEPS - 1)
        for dx in sorted(range(-8, 9), key=abs):  # the cursor snaps to the nearest drawn step
            page.mouse.move(at + dx, box["y"] + box["height"] / 2)
            if tip.is_visible() and re.sub(r"\D", "", tip.locator(".plot-tip-x").inner_text()) == str(SPIKE_STEP):
                break
        else:
            raise AssertionError(f"no tooltip at step {SPIKE_STEP}")
        expect(tip.locator(".plot-tip-name")).to_have_text("cifar")
        expect(tip.locator(".plot-tip-n")).to_have_text("n=2")
        expect(tip.locator(".plot-tip-sub")).to_have_text(re.compile(rf"^min–max 0\.6\d* – 50 · step {SPIKE_STEP}$"))
        shot(page, "chart-group-band-spike")
        s.assert_clean()


def test_the_scatter_of_a_grouped_table_marks_each_groups_mean_and_std(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        expect(page.get_by_test_id("group-header").first).to_be_visible()
        groups = viewer.table(group="config.data.dataset")["groups"]
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-scatter").click()
        page.get_by_test_id("scatter-x").select_option("config.optim.lr")
        page.get_by_test_id("scatter-y").select_option("run.best.val/auc")
        expect(page.get_by_test_id("scatter-point").first).to_be_visible()
        expect(page.get_by_test_id("scatter-group-mean")).to_have_count(0)
        switch(page, "scatter-group-means").click()
        marks = page.get_by_test_id("scatter-group-mean")
        expect(marks).to_have_count(len(groups))
        assert [marks.nth(i).get_attribute("data-group") for i in range(len(groups))] == [g["label"] for g in groups]
        # Each mark sits at its group's mean of the plotted values.
        runs = {r["key"]: r for r in viewer.api("/api/runs")["runs"]}
        first = groups[0]
        vals = [runs[k]["best"].get("val/auc", {}).get("value") for k in first["keys"]]
        lrs = [runs[k]["params"].get("optim.lr") for k in first["keys"]]
        pairs = [(x, y) for x, y in zip(lrs, vals, strict=True)
                 if isinstance(x, (int, float)) and isinstance(y, (int, float))]
        tip = marks.first.locator("title").text_content() or ""
        mean_y = sum(y for _, y in pairs) / len(pairs)
        assert f"(n={len(pairs)})" in tip and "mean run.best.val/auc = " in tip
        shown = float(tip.split("mean run.best.val/auc = ")[1].split(" ")[0])
        assert abs(shown - mean_y) <= 5e-4 * max(1.0, abs(mean_y))
        shot(page, "chart-scatter-group-means")
        # The chart CSV then holds the groups' means and standard deviations.
        page.get_by_test_id("export-chart-csv").click()
        expect(page.get_by_test_id("export-bar")).to_contain_text("Scatter CSV saved:")
        table = read_csv(Path(page.get_by_test_id("export-path").inner_text()))
        assert table[0] == ["group", "n", "mean config.optim.lr", "std config.optim.lr", "mean run.best.val/auc",
                            "std run.best.val/auc"]
        assert [r[0] for r in table[1:]] == [g["label"] for g in groups]
        assert table[1][1] == str(len(pairs)) and abs(float(table[1][4]) - mean_y) < 1e-9
        s.assert_clean()
