"""The Performance view of a captured run whose telemetry database was damaged afterwards, in
Debian's chromium: one warning, every panel says the database is damaged (not "no GPU on this host"
or "not traced with trace_step"), the run's telemetry fact says partial. Screenshot:
``test-artifacts/screens/perf-view-damaged.png``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import run_traceml
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from tests.ui.test_browser import expect, open_viewer, row, serve, shot
from tests.ui.test_damaged_telemetry import DAMAGED, captured, damaged_copy

if TYPE_CHECKING:
    from playwright.sync_api import Browser

__all__ = ["captured"]  # the module fixture: one run captured by traceml run


@pytest.mark.timeout(600)  # the module fixture runs a real training first
def test_the_performance_view_of_a_damaged_database_says_so_in_every_panel(browser: Browser, captured: Path,
                                                                           tmp_path: Path) -> None:
    run_dir = damaged_copy(captured, tmp_path, "truncated")
    with serve(run_dir.parent) as v, open_viewer(browser, v) as s:
        page = s.page
        row(page, "digits").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        run = page.get_by_test_id("perf-run")
        expect(run).to_have_count(1)
        expect(run.get_by_test_id("telemetry-status")).to_contain_text(DAMAGED)
        expect(run.get_by_test_id("telemetry-status")).to_have_count(1)
        expect(run.get_by_test_id("telemetry-warnings")).to_have_count(0)  # said once, above
        expect(run.get_by_test_id("perf-breakdown")).to_contain_text(DAMAGED)
        expect(run.get_by_test_id("perf-heatmap")).to_contain_text(DAMAGED)
        missing = run.get_by_test_id("perf-missing")
        expect(missing).to_contain_text(f"GPU, device memory, process memory and host: {DAMAGED}")
        expect(missing).not_to_contain_text("no GPU on this host")
        expect(run).not_to_contain_text("not traced with trace_step")
        expect(run.get_by_test_id("perf-fact-telemetry")).to_have_text("partial")
        for panel in ("step", "ranks", "memory", "gpu"):  # nothing to draw: no file to save (review 13f)
            expect(run.get_by_test_id(f"perf-export-csv-{panel}")).to_have_count(0)
            expect(run.get_by_test_id(f"perf-export-png-{panel}")).to_have_count(0)
        shot(page, "perf-view-damaged")


@pytest.mark.timeout(600)
def test_a_truncated_final_summary_is_named_as_the_reason_there_is_no_verdict(browser: Browser, captured: Path,
                                                                              tmp_path: Path) -> None:
    """Issue 13 review: a damaged final_summary.json read as "the run ended without a final summary"."""
    run_dir = tmp_path / "traceml" / "runs" / captured.name
    shutil.copytree(captured, run_dir)
    final = run_dir / "aggregator" / "final_summary.json"
    final.write_bytes(final.read_bytes()[:200])
    with serve(run_dir.parent) as v, open_viewer(browser, v) as s:
        page = s.page
        problem = row(page, "digits").get_by_test_id("file-problem")
        expect(problem).to_have_attribute("title", re.compile(r"final_summary\.json cannot be read \(damaged\)"))
        row(page, "digits").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        run = page.get_by_test_id("perf-run")
        verdict = run.get_by_test_id("perf-fact-verdict")
        expect(verdict).to_have_text("none: final_summary.json cannot be read (damaged)")
        # The median and p95 of the rows written, as `traceml summary --json` computes them from the
        # database (review 13f: the p95 read "–" beside a computed median).
        cli = json.loads(run_traceml("summary", str(run_dir), "--json").stdout)["step_time"]
        facts = (("perf-fact-median-step", "iteration_median_ms"), ("perf-fact-p95-step", "iteration_p95_ms"))
        for fact, field in facts:
            shown = run.get_by_test_id(fact)
            expect(shown).not_to_have_text("–")
            value = float(re.sub(r"[^0-9.]", "", shown.inner_text()))
            assert value == pytest.approx(cli[field], rel=0.01), (fact, value, cli[field])
        why = run.get_by_test_id("diagnoses-no-verdict")
        expect(why).to_contain_text("aggregator/final_summary.json cannot be read (damaged): not valid JSON")
        expect(why).not_to_contain_text("stopped before writing it")
        expect(run.get_by_test_id("telemetry-warnings")).to_contain_text("final_summary.json cannot be read (damaged)")
        shot(page, "perf-view-damaged-summary")
        s.assert_clean()


@pytest.mark.timeout(600)
def test_units_read_as_written_and_an_empty_h2d_cell_says_why(browser: Browser, captured: Path,
                                                               tmp_path: Path) -> None:
    """Issue 13 review: the breakdown's unit toggle read "Ms", and h2d showed "–" with no reason on a
    CPU run."""
    root = tmp_path / "traceml" / "runs"
    shutil.copytree(captured, root / captured.name)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        page.goto(f"{v.url}#v=runs&c=name&c=perf.share.h2d&c=perf.peak_mem.gpu&c=perf.share.forward")
        h2d = row(page, "digits").locator(".tabulator-cell[tabulator-field='perf.share.h2d']")
        expect(h2d).to_have_text("–")
        expect(h2d).to_have_attribute("title", "not measured: no CUDA device (h2d is the time of host-to-GPU copies)")
        gpu = row(page, "digits").locator(".tabulator-cell[tabulator-field='perf.peak_mem.gpu']")
        expect(gpu).to_have_attribute("title", re.compile("^not measured: no CUDA device"))
        forward = row(page, "digits").locator(".tabulator-cell[tabulator-field='perf.share.forward']")
        expect(forward).not_to_have_text("–")
        row(page, "digits").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        toggle = page.get_by_test_id("perf-mode-ms")
        expect(toggle).to_have_text("ms", use_inner_text=True)  # as drawn, CSS included
        expect(page.get_by_test_id("perf-mode-share")).to_have_text("Share", use_inner_text=True)
        # Upper-cased labels carry no unit to mangle ("STEPS / S").
        expect(page.get_by_test_id("perf-fact-steps-per-second")).not_to_have_text("–")
        labels = page.locator(".perf-facts dt, .telem-stat-k").all_inner_texts()
        assert "STEPS PER SECOND" in labels and not any(" / S" in t or " MS" in t for t in labels), labels
        s.assert_clean()
