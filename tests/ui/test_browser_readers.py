"""Issue 15 reader items seen in a real browser (Debian's chromium via Playwright, a real
``traceml ui``): the run's log in the inspector, tail first; a traceback written as a list of lines;
a derived duration marked as such; text sorted naturally in the table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.cli.test_runs_cli_readers import write_run
from tests.ui.test_browser import CHROMIUM, Viewer, expect, open_viewer, row, serve
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from traceml_ai.ui.service import MAX_FILE_BYTES

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="the browser tests need /usr/bin/chromium")

TRACEBACK = ["Traceback (most recent call last):\n", '  File "train.py", line 12, in <module>\n',
             "    main()\n", "ValueError: bad batch\n"]


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    root = tmp_path_factory.mktemp("readers") / "traceml" / "runs"
    for i, name in enumerate(["run-10", "run-2", "run-1", "Run-3"]):
        run: dict[str, Any] = {"name": name, "status": "completed", "started_at": f"2026-11-2{i}T10:00:00Z",
                               "ended_at": f"2026-11-2{i}T10:30:00Z", "duration_s": 1800.0}
        if name == "Run-3":
            del run["duration_s"]  # derived: ended_at − started_at
        if name == "run-1":
            run.update(status="failed", exit={"code": 1, "error_type": "ValueError", "error_message": "bad batch",
                                              "traceback": TRACEBACK})
        folder = write_run(root, f"2026113{i}-100000_{name}_ab1{i}", run)
        if name == "run-1":
            (folder / "logs").mkdir()
            lines = [f"log line {n:07d} " + "x" * 40 + "\n" for n in range(MAX_FILE_BYTES // 40)]
            (folder / "logs" / "run.log").write_text("".join(lines) + "the last line\n")
    with serve(root) as v:
        yield v


def test_the_inspector_shows_a_list_traceback_as_text_and_the_log_from_its_end(
        browser: Browser, readers: Viewer) -> None:
    with open_viewer(browser, readers) as s:
        page = s.page
        row(page, "run-1").locator(".cell-name").click()
        traceback = page.get_by_test_id("error-callout").get_by_test_id("traceback")
        expect(traceback).to_contain_text('File "train.py", line 12, in <module>')
        expect(traceback).to_contain_text("ValueError: bad batch")
        expect(traceback).not_to_contain_text("['Traceback")
        log_button = page.locator("[data-testid=file-button][data-file='logs/run.log']")
        expect(log_button).to_be_enabled()
        log_button.click()
        content = page.get_by_test_id("file-viewer").get_by_test_id("file-content")
        expect(content).to_contain_text("the last line")
        expect(content).to_contain_text(re.compile(r"^\[TraceML: showing the last [\d,]+ of [\d,]+ bytes\]"))
        assert "log line 0000000 " not in content.inner_text()
        s.assert_clean()


def test_the_inspector_marks_a_derived_duration(browser: Browser, readers: Viewer) -> None:
    with open_viewer(browser, readers) as s:
        page = s.page
        row(page, "Run-3").locator(".cell-name").click()
        info = page.get_by_test_id("inspector-info")
        expect(info).to_contain_text("(derived from the times)")
        row(page, "run-2").locator(".cell-name").click()
        expect(page.get_by_test_id("inspector-name")).to_have_text("run-2")
        expect(page.get_by_test_id("inspector-info")).not_to_contain_text("derived")
        s.assert_clean()


def test_the_table_sorts_names_naturally(browser: Browser, readers: Viewer) -> None:
    with open_viewer(browser, readers) as s:
        page = s.page
        page.locator(".col-title[data-column=name] .col-name").click()
        expect(page.locator(".col-title[data-column=name] .col-sort")).to_have_text("↑")
        names = page.get_by_test_id("run-row").locator(".cell-name")
        expect(names).to_have_text(["run-1", "run-2", "Run-3", "run-10"])
        s.assert_clean()
