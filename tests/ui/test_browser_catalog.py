"""The run catalog in a real browser (docs/catalog.md, "In the viewer"): group the table by the
``catalog_run`` column, open a run's inspector, see its attachments, open the local one read-only,
and find the remote one as a link that nothing fetched.

Driven as ``tests/ui/test_browser.py`` drives the viewer (its server, page and screenshot helpers);
skipped without playwright or ``/usr/bin/chromium``. The screenshot lands in
``test-artifacts/screens/inspector-attachments.png``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.ui.test_browser import CHROMIUM, expect, open_viewer, row, serve, shot
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from tests.ui.test_catalog_view import REMOTE_URL, SECRET, build_workspace

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from tests.ui.test_browser import Viewer

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)


@pytest.fixture(scope="module")
def catalog_viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """Run folders grouped by an envelope (see ``build_workspace``) served by ``traceml ui``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRACEML_RUN_DIR", raising=False)
        root = build_workspace(tmp_path_factory.mktemp("catalog"))
    with serve(root) as v:
        yield v


def _hashes(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def test_group_by_catalog_run_and_open_the_attachments(browser: Browser, catalog_viewer: Viewer) -> None:
    before = _hashes(catalog_viewer.root)
    with open_viewer(browser, catalog_viewer) as s:
        page = s.page
        # An envelope exists: the column is shown, with its label, and the table groups by it.
        expect(page.locator(".col-title[data-column=catalog_run] .col-name")).to_have_text("Catalog run")
        page.get_by_test_id("group-by").select_option("catalog_run")
        expect(page.get_by_test_id("group-header")).to_have_count(4)
        expect(page.locator("[data-testid=group-header][data-group='exp-1']")).to_contain_text("2 runs")
        expect(page.locator("[data-testid=group-header][data-group='(none)']")).to_contain_text("1 run")
        # The rejected duplicate envelope is a file problem of its run (the table's warning icon).
        expect(row(page, "dup-a").get_by_test_id("file-problem")).to_have_count(1)

        row(page, "rank1").locator(".cell-name").click()
        section = page.get_by_test_id("inspector-attachments")
        expect(section.get_by_test_id("attachments-run")).to_contain_text("exp-1")
        expect(section.get_by_test_id("attachments-run")).to_contain_text("Experiment exp-1")
        items = section.get_by_test_id("attachment")
        expect(section.locator("[data-testid=attachment][data-id=notes]")).to_contain_text("Experiment notes")
        for refused in ("escape", "passwd", "link"):
            item = section.locator(f"[data-testid=attachment][data-id={refused}]")
            expect(item.get_by_test_id("attachment-refused")).to_contain_text("outside the roots")
            expect(item.get_by_test_id("attachment-open")).to_have_count(0)
        assert items.count() >= 7  # six from the envelope, and the sessions' own artifacts

        # The remote attachment is a plain link: href present, opens elsewhere, never requested.
        link = section.get_by_test_id("attachment-link")
        expect(link).to_have_attribute("href", REMOTE_URL)
        expect(link).to_have_attribute("rel", "noopener noreferrer")
        expect(link).to_have_attribute("target", "_blank")
        section.scroll_into_view_if_needed()
        shot(page, "inspector-attachments")

        # The local one opens read-only, as text (its HTML is not rendered).
        section.locator("[data-testid=attachment][data-id=notes]").get_by_test_id("attachment-open").click()
        modal = page.get_by_test_id("attachment-viewer")
        expect(modal).to_contain_text("read-only")
        content = modal.get_by_test_id("attachment-content")
        expect(content).to_have_text("Notes of experiment 1: <b>not bold</b>")
        expect(content.locator("b")).to_have_count(0)
        expect(modal.locator("textarea, input, [contenteditable]")).to_have_count(0)
        shot(page, "inspector-attachment-open")
        page.keyboard.press("Escape")
        expect(modal).to_have_count(0)

        assert not [u for u in s.requests if "example.invalid" in u]
        assert SECRET not in page.content()
        s.assert_clean()
    assert _hashes(catalog_viewer.root) == before
