"""Issue 13 review of the Performance side, seen in a real browser (Debian's chromium via Playwright, a
real ``traceml ui``) on synthetic captured runs (telemetry databases written as the aggregator writes
them, final summaries by the real diagnosis): one definition of the slowest rank across the table,
the per-rank panels and the phase breakdown; a run that ended without a final summary; a finding
that cannot be read; the GPU columns of a CPU-only workspace; round y ticks on a full-width area;
1024-based byte units; the nav's accessible names.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.diagnose.telemetry_db import HEALTHY_CPU, RunSpec, write_run
from tests.ui.test_browser import CHROMIUM, Viewer, expect, open_viewer, perf_view, row, serve, shot
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from traceml_ai.diagnose.summary import write_final_summary
from traceml_ai.telemetry import schema

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="the browser tests need /usr/bin/chromium")


def _ddp(rank: int, step: int) -> dict[str, float]:
    # rank 0 works 10 ms more before backward; rank 1 waits for it inside backward (a little longer):
    # rank 1 has the longer iteration, rank 0 is the straggler.
    if rank == 0:
        return {**HEALTHY_CPU, schema.FORWARD: 14.0}
    return {**HEALTHY_CPU, schema.BACKWARD: 17.5}


def _run(root: Path, i: int, name: str, status: str, spec: RunSpec, *, summary: bool) -> Path:
    folder = root / f"2026113{i}-100000_{name}_cd1{i}"
    write_run(folder, spec)
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "id": folder.name, "name": name, "status": status,
        "started_at": f"2026-11-2{i}T10:00:00Z", "ended_at": f"2026-11-2{i}T10:30:00Z", "duration_s": 1800.0}))
    if summary:
        write_final_summary(folder)
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Viewer, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("perfdefs") / "traceml" / "runs"
    ddp = _run(root, 0, "ddp", "completed", RunSpec(ranks=2, steps=80, phases=_ddp), summary=True)
    _run(root, 1, "ended", "failed", RunSpec(steps=40), summary=False)
    odd = _run(root, 2, "oddsev", "completed", RunSpec(steps=40), summary=True)
    doc = json.loads((odd / "aggregator" / "final_summary.json").read_text())
    doc["findings"] = [{"kind": "straggler", "severity": "catastrophic", "summary": "from a newer TraceML"}]
    (odd / "aggregator" / "final_summary.json").write_text(json.dumps(doc))
    with serve(root) as v:
        yield v, json.loads((ddp / "aggregator" / "final_summary.json").read_text())


def cell(page: Page, name: str, column: str) -> Any:
    return row(page, name).locator(f".tabulator-cell[tabulator-field='{column}']")


def test_one_slowest_rank_in_the_table_the_rank_panels_and_the_phase_breakdown(
        browser: Browser, workspace: tuple[Viewer, dict[str, Any]]) -> None:
    viewer, final = workspace
    st, first = final["step_time"], final["findings"][0]
    per_rank = {r["rank"]: r["median_ms"] for r in st["per_rank"]}
    assert per_rank[1] > per_rank[0] and first["kind"] == "straggler" and first["evidence"]["ranks"] == [0]
    assert st["worst_rank"] == 0 and st["skew_measure"] == "outside_backward"
    with open_viewer(browser, viewer) as s:
        page = s.page
        # The nav's accessible names are the labels, not "Performance2".
        expect(page.get_by_role("button", name="Performance", exact=True)).to_have_count(1)
        # The column chooser lists the skew columns, and the GPU ones on this CPU-only workspace.
        page.get_by_test_id("column-chooser").click()
        chooser = page.get_by_test_id("column-popover")
        for column in ("perf.worst_rank", "perf.skew_pct", "perf.straggler", "perf.peak_mem.gpu",
                       "perf.gpu_util_pct"):
            chooser.locator(f"[data-testid=column-option][data-column='{column}']").check()
        page.keyboard.press("Escape")
        expect(cell(page, "ddp", "perf.worst_rank")).to_have_text("0")
        expect(cell(page, "ddp", "perf.straggler")).to_have_text("0")
        skew = float(cell(page, "ddp", "perf.skew_pct").get_attribute("title") or "nan")
        assert skew == pytest.approx(first["evidence"]["value"] * 100, rel=1e-4)
        expect(cell(page, "ddp", "perf.peak_mem.gpu")).to_have_text("–")
        expect(cell(page, "ddp", "perf.gpu_util_pct")).to_have_text("–")

        run = perf_view(page, "ddp")
        # the per-rank view (the heatmap with each rank's median): rank 0 alone is marked, as the
        # straggler; no rank is called "slowest" beside it
        heat = run.get_by_test_id("perf-heatmap")
        expect(heat.locator("[data-testid=heat-row][data-straggler='1']")).to_have_count(1)
        expect(heat.locator("[data-testid=heat-row][data-rank='0']")).to_have_attribute("data-straggler", "1")
        expect(heat.locator("[data-testid=heat-row][data-rank='0']")).to_contain_text("straggler")
        expect(heat.get_by_test_id("heat-svg")).not_to_contain_text("slowest")
        # the medians are the summary's (outside backward: the straggler measure, shown first)
        expect(heat.get_by_test_id("heat-svg")).to_have_attribute("data-mode", "local")
        for r in st["per_rank"]:
            median = heat.locator(f"[data-testid=heat-row][data-rank='{r['rank']}'] [data-testid=heat-median]")
            shown = float(median.get_attribute("data-value") or "nan")
            assert shown == pytest.approx(r["outside_backward_median_ms"], rel=1e-3)
        # the phase breakdown shows that rank at every step, and says so
        breakdown = run.get_by_test_id("perf-breakdown")
        area = breakdown.get_by_test_id("perf-area")
        expect(area).to_have_attribute("data-rank", "0")
        expect(area).to_have_attribute("data-rank-basis", "straggler measure")
        expect(breakdown).to_contain_text("The phases of rank 0, the slowest rank by the straggler measure")
        # round y ticks (0 and steps of 1, 2 or 5 × 10^k ms), the top one at or above the tallest step
        ticks = [t.removesuffix(" ms") for t in breakdown.get_by_test_id("perf-area-ytick").all_text_contents()]
        values = [float(t) for t in ticks]
        assert values[0] == 0 and len(values) >= 3, ticks
        step = values[1] - values[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 5), ticks
        assert all(v == pytest.approx(i * step) for i, v in enumerate(values)), ticks
        assert float(area.get_attribute("data-top") or "nan") == pytest.approx(values[-1])
        # the stacked area fills its block
        box, block = area.bounding_box(), breakdown.bounding_box()
        assert box is not None and block is not None and box["width"] >= 0.9 * block["width"]
        breakdown.scroll_into_view_if_needed()
        shot(page, "perfdefs-one-slowest-rank")
        s.assert_clean()


def test_a_run_that_ended_without_a_final_summary_says_so_instead_of_pending(
        browser: Browser, workspace: tuple[Viewer, dict[str, Any]]) -> None:
    viewer, _ = workspace
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("column-chooser").click()
        page.get_by_test_id("column-popover").locator(
            "[data-testid=column-option][data-column='perf.telemetry']").check()
        page.keyboard.press("Escape")
        expect(cell(page, "ended", "perf.telemetry")).to_have_text("no_summary")
        run = perf_view(page, "ended")
        note = run.get_by_test_id("diagnoses-no-verdict")
        expect(note).to_contain_text("The run ended without a final verdict")
        expect(note).to_contain_text("traceml summary 20261131-100000_ended_cd11")
        expect(run.get_by_test_id("diagnoses-provisional")).to_have_count(0)
        expect(run.get_by_test_id("perf-fact-verdict")).to_have_text("none: the run ended without a final summary")
        expect(run).not_to_contain_text("provisional")
        shot(page, "perfdefs-ended-without-summary")
        s.assert_clean()


def test_an_unreadable_finding_is_not_no_problem_and_sizes_are_in_kib(
        browser: Browser, workspace: tuple[Viewer, dict[str, Any]]) -> None:
    viewer, _ = workspace
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "oddsev").locator(".cell-name").click()
        files = page.get_by_test_id("inspector-files")
        expect(files).to_contain_text(re.compile(r"\d KiB"))
        expect(files).not_to_contain_text(re.compile(r"\d (KB|MB)\b"))
        section = page.get_by_test_id("telemetry-diagnoses")
        expect(section.get_by_test_id("finding-unread")).to_contain_text("1 finding of the summary could not be read")
        expect(section.get_by_test_id("finding-none")).to_have_count(0)
        s.assert_clean()


def test_the_performance_view_scrolls_with_the_wheel_and_its_address_keeps_its_run(
        browser: Browser, workspace: tuple[Viewer, dict[str, Any]]) -> None:
    """Issue 13 review: the full page was taller than the window and could not be scrolled (the
    panels below the first screen were out of reach), and the inspector's Performance button left the
    run out of the address, so a reload or a shared link showed "Select captured runs…"."""
    viewer, _ = workspace
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.set_viewport_size({"width": 1280, "height": 720})
        run = perf_view(page, "ddp")
        view = page.get_by_test_id("view-performance")
        heat = run.get_by_test_id("perf-heatmap")
        expect(heat).to_be_visible()
        expect(heat).not_to_be_in_viewport()  # below the first screen at this size
        view.hover()

        def heat_on_screen() -> bool:
            box = heat.bounding_box()
            return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 720

        seen = False
        for _ in range(40):  # as a user scrolls: the wheel over the page, no script
            page.mouse.wheel(0, 120)
            page.wait_for_timeout(50)
            if heat_on_screen():
                seen = True
                break
        assert seen, "the per-rank heatmap never came on screen by scrolling"
        assert view.evaluate("(el) => el.scrollTop") > 0
        assert "pr=" in page.url  # the run is in the address
        key = run.get_attribute("data-key")
        base = viewer.url.split("/?")[0]
        # A reload of this tab opens the remembered view (the page writes it 0.6 s after a change):
        # it holds the run.
        page.wait_for_function(
            "async ([base, key]) => (await (await fetch(base + '/api/ui-state')).json()).perfRun === key",
            arg=[base, key], polling=200, timeout=10_000)
        # The address opened in another tab (a bookmark, a shared link) shows the same run.
        other = page.context.new_page()
        other.goto(page.url)
        shared = other.get_by_test_id("perf-run")
        expect(shared).to_have_count(1)
        expect(shared).to_have_attribute("data-name", "ddp")
        expect(other.get_by_test_id("performance-empty")).to_have_count(0)
        other.close()
        s.assert_clean()
