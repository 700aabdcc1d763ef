"""The Performance view of a captured run whose telemetry database was damaged afterwards, in
Debian's chromium: one warning, every panel says the database is damaged (not "no GPU on this host"
or "not traced with trace_step"), the run's telemetry fact says partial. Screenshot:
``test-artifacts/screens/perf-view-damaged.png``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

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
        shot(page, "perf-view-damaged")
