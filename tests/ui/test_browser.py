"""The viewer in a real browser: Debian's chromium, driven by Playwright, against a real ``traceml ui``.

Each test does what a user does (click, type, drag) and asserts what they see; counts are read
from the footer or the API, never from the rows in the DOM (the table is virtualized). Every page
also records console errors, page errors, CSP violations and dialogs, and a test ends by checking
that there were none. Screenshots of each view land in ``test-artifacts/screens/`` for a human look.

Skipped without the ``playwright`` package or without ``/usr/bin/chromium`` (CI installs both).
"""

from __future__ import annotations

import csv
import http.cookiejar
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from traceml_ai.runs.fake import generate, live_run

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the browser tests need Debian's chromium at /usr/bin/chromium (apt install chromium)"
)

REPO = Path(__file__).resolve().parents[2]
SCREENS = REPO / "test-artifacts" / "screens"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--no-first-run"]
VIEWPORT = {"width": 1440, "height": 1000}
WAIT_MS = 30_000  # generous: a loaded CI machine is slow, and nothing here measures time
XSS_NAME = "<img src=x onerror=alert(1)>"
PNG_300_DPI = 11811  # pixels per metre

expect = sync_api.expect
expect.set_options(timeout=WAIT_MS)

# Records what the page must never do: CSP violations (the console also reports them, but this
# catches the ones a browser reports only as events).
RECORD_CSP = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


# -- the server ------------------------------------------------------------------------------------


@dataclass
class Viewer:
    """A running ``traceml ui`` on a loopback port, and an API client holding its token cookie."""

    url: str  # the printed URL, with ?token=
    root: Path
    proc: subprocess.Popen[str]
    opener: urllib.request.OpenerDirector = field(init=False)

    def __post_init__(self) -> None:
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.opener.open(self.url, timeout=30).read()  # sets the cookie

    @property
    def base(self) -> str:
        return self.url.split("/?")[0]

    @property
    def cache(self) -> Path:
        return self.root.parent / ".cache"

    def api(self, path: str, body: Any = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method or ("POST" if data else "GET"),
                                     # What the page's fetch sends: a change comes from the viewer's own origin.
                                     headers={"Content-Type": "application/json", "Origin": self.base} if data else {})
        with self.opener.open(req, timeout=30) as res:
            return json.loads(res.read())

    def table(self, **params: str | list[str]) -> Any:
        return self.api("/api/table?" + urllib.parse.urlencode(params, doseq=True))

    def key_of(self, name: str) -> str:
        keys = [r["key"] for r in self.api("/api/runs")["runs"] if r["name"] == name]
        assert len(keys) == 1, f"{len(keys)} runs named {name!r}"
        return str(keys[0])

    def forget_view(self) -> None:
        """Start the next page from the default view (the page remembers its last one)."""
        self.api("/api/ui-state", {}, method="PUT")


@contextmanager
def serve(root: Path, **env: str) -> Iterator[Viewer]:
    """``traceml ui ROOT --port 0 --no-browser`` as a user runs it; stopped with Ctrl+C (SIGINT)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    full_env.update({"COLUMNS": "200", **env})
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield Viewer(match.group(1), root, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_xss_run(root: Path) -> None:
    """A completed run whose name, tags and notes are HTML that would run script if inserted as HTML."""
    run_id = "20261130-120000_xss_ab12"
    folder = root / run_id
    folder.mkdir(parents=True)
    run = {
        "schema_version": 1, "id": run_id, "name": XSS_NAME, "group": "<b>group</b>",
        "tags": ["<script>alert(2)</script>"], "notes": "<svg onload=alert(3)>", "status": "completed",
        "started_at": "2026-11-30T12:00:00Z", "ended_at": "2026-11-30T12:10:00Z",
        "heartbeat_at": "2026-11-30T12:10:00Z", "duration_s": 600.0, "exit": {"code": 0, "signal": None},
    }
    (folder / "run.json").write_text(json.dumps(run, indent=2), encoding="utf-8")


@contextmanager
def serve_fake_runs(root: Path, *extras: Callable[[Path], None]) -> Iterator[Viewer]:
    """The 24 fake runs (seed 0) in ``root``, then each of ``extras`` run on that folder (more runs
    written by hand), served by one ``traceml ui``: the browser test modules' shared set-up."""
    generate(root, runs=24, seed=0)
    for extra in extras:
        extra(root)
    with serve(root) as v:
        yield v


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """24 fake runs (seed 0) served by one ``traceml ui`` for the whole module."""
    with serve_fake_runs(tmp_path_factory.mktemp("browser") / "traceml" / "runs") as v:
        yield v


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield b
        b.close()


# -- the page --------------------------------------------------------------------------------------


@dataclass
class Session:
    """One browser tab on the viewer, with everything it must not do recorded."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return list(self.page.evaluate("window.__cspViolations || []"))

    def assert_clean(self) -> None:
        assert self.console_errors == []
        assert self.page_errors == []
        assert self.csp_violations() == []
        assert self.dialogs == []


@contextmanager
def open_viewer(browser: Browser, viewer: Viewer) -> Iterator[Session]:
    """A fresh tab on the viewer's printed URL, from the default view, once the table has loaded."""
    viewer.forget_view()
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.add_init_script(RECORD_CSP)
    page = context.new_page()
    session = Session(page)
    page.on("console", lambda m: session.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: session.page_errors.append(str(e)))
    page.on("request", lambda r: session.requests.append(r.url))

    def on_dialog(d: Any) -> None:
        session.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    page.on("dialog", on_dialog)
    try:
        page.goto(viewer.url)
        expect(page.get_by_test_id("table-info")).to_have_text(re.compile(r"^(\d+ of \d+ runs|\d+ runs?)$"))
        yield session
    finally:
        context.close()


def shot(page: Page, name: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENS / f"{name}.png"))


def row(page: Page, name: str) -> Locator:
    """The table row of the run named ``name`` (exactly)."""
    cell = page.locator(".cell-name").filter(has_text=re.compile(f"^{re.escape(name)}$"))
    return page.get_by_test_id("run-row").filter(has=cell)


def select_runs(page: Page, *names: str) -> None:
    for name in names:
        row(page, name).get_by_test_id("row-check").check()
    expect(page.get_by_test_id("selection-count")).to_have_text(str(len(names)))


def perf_view(page: Page, name: str) -> Locator:
    """The Performance view of the run named ``name``, opened from its inspector (one run shown)."""
    row(page, name).locator(".cell-name").click()
    page.get_by_test_id("inspector-performance").click()
    run = page.get_by_test_id("perf-run")
    expect(run).to_have_count(1)
    expect(run).to_have_attribute("data-name", name)
    return run


def line_chart(page: Page, metric: str) -> Locator:
    """The line chart card of ``metric`` (look it up again after a redraw: charts are replaced)."""
    return page.get_by_test_id("chart-line").filter(has=page.locator(".chart-card-title", has_text=metric))


@contextmanager
def big_run_plotted(browser: Browser, root: Path) -> Iterator[tuple[Viewer, Session]]:
    """Two fake runs in ``root``, ``big-run`` with ~2,000 val/loss points, served with 200 points per
    series at most; ``big-run`` ticked and plotted, its val/loss chart drawn and downsampled."""
    generate(root, runs=2, seed=0, big_run_lines=4000)
    with serve(root, TRACEML_MAX_POINTS_PER_SERIES="200") as v, open_viewer(browser, v) as s:
        row(s.page, "big-run").get_by_test_id("row-check").check()
        s.page.get_by_test_id("selection-plot").click()
        chart = line_chart(s.page, "val/loss")
        expect(chart.locator("canvas")).to_be_visible()
        expect(chart.get_by_test_id("series-detail")).to_have_attribute("data-detail", "downsampled")
        yield v, s


def switch(page: Page, testid: str) -> Locator:
    """The visible label of a toggle (its checkbox is visually hidden)."""
    return page.get_by_test_id(testid).locator("xpath=..")


def shown_keys_are(page: Page, keys: list[str]) -> None:
    """Wait until the rows drawn, top to bottom, are the first of ``keys`` (in that order)."""
    page.wait_for_function(
        """(keys) => {
          const drawn = [...document.querySelectorAll('[data-testid=run-row]')].map((r) => r.dataset.key);
          return drawn.length > 0 && drawn.every((k, i) => k === keys[i]);
        }""",
        arg=keys, timeout=WAIT_MS,
    )


def scrolled_to_end(page: Page, box: Locator) -> None:
    """Wait until ``box`` scrolls (its text is taller than it) and shows its last line."""
    page.wait_for_function(
        "(el) => el.scrollHeight > el.clientHeight && el.scrollTop + el.clientHeight >= el.scrollHeight - 2",
        arg=box.element_handle(), timeout=WAIT_MS,
    )


def painted_pixels(canvas: Locator) -> int:
    """How many pixels of a canvas are not transparent."""
    return int(canvas.evaluate(
        """(c) => {
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0;
          for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
          return n;
        }"""
    ))


def x_range(page: Page, chart: Locator) -> tuple[float, float]:
    """The x values a user reads in the tooltip at the left and right edges of a line chart.

    A live redraw can replace the chart under the mouse; then the mouse simply moves again.
    """
    values: list[float] = []
    for side in (0, 1):
        for _ in range(20):
            box = chart.locator(".u-over").bounding_box()
            if box is None:  # replaced by a live redraw this very moment: look again
                page.wait_for_timeout(100)
                continue
            page.mouse.move(0, 0)
            page.mouse.move(box["x"] + 2 + side * (box["width"] - 4), box["y"] + box["height"] / 2)
            tip = chart.locator(".plot-tip-x")
            try:
                expect(tip).to_be_visible(timeout=1500)
                values.append(float(tip.inner_text(timeout=1500).split()[-1].replace(",", "")))
                break
            except (AssertionError, sync_api.Error):
                continue
        else:
            raise AssertionError("the chart shows no tooltip at its edge")
    page.mouse.move(0, 0)
    return values[0], values[1]


def drag_zoom(page: Page, chart: Locator, start: float, end: float) -> None:
    """Drag across a line chart from ``start`` to ``end`` (fractions of its width) until it zooms.

    Tries again when a live redraw replaced the chart during the drag.
    """
    for _ in range(5):
        box = chart.locator(".u-over").bounding_box()
        if box is None:  # replaced by a live redraw this very moment: look again
            page.wait_for_timeout(100)
            continue
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * start, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * end, y, steps=12)
        page.mouse.up()
        if page.get_by_test_id("reset-zoom").is_enabled():
            return
    raise AssertionError("dragging across the chart did not zoom it")


def redrawn(page: Page, chart: Locator) -> None:
    """Wait until the chart drawn now is replaced by a new one (a live update arrived)."""
    page.wait_for_function("(el) => !el.isConnected", arg=chart.locator(".uplot").element_handle(), timeout=WAIT_MS)


def png_phys(data: bytes) -> tuple[int, int, int]:
    """The pHYs chunk of a PNG: pixels per unit in x and y, and the unit (1 = metre)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos = 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        if kind == b"pHYs":
            x, y, unit = struct.unpack(">IIB", data[pos + 8:pos + 17])
            return x, y, unit
        if kind == b"IDAT":
            break  # pHYs must come before the image data
        pos += 12 + length
    raise AssertionError("the PNG has no pHYs chunk before its image data")


# -- 1. the table on fake runs ---------------------------------------------------------------------


def test_the_table_shows_the_24_fake_runs_with_their_statuses(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")
        expect(page.get_by_test_id("nav-count-runs")).to_have_text("24")
        assert viewer.table()["total"] == 24
        expect(page.get_by_test_id("status-segment-stale")).to_contain_text("1")
        expect(page.get_by_test_id("status-segment-legacy")).to_contain_text("1")
        expect(page.get_by_test_id("count-failed")).to_contain_text("2")  # failed-run and nan-loss
        expect(row(page, "stale-run").get_by_test_id("status-badge")).to_have_text("stale")
        expect(row(page, "legacy-run").get_by_test_id("status-badge")).to_have_text("legacy")
        expect(row(page, "failed-run").get_by_test_id("status-badge")).to_have_text("failed")
        expect(row(page, "baseline").get_by_test_id("status-badge")).to_have_text("completed")
        # malformed-lines skipped corrupt metrics lines: the row carries the file-problem mark
        expect(row(page, "malformed-lines").get_by_test_id("file-problem")).to_be_visible()
        shot(page, "runs-table")

        page.get_by_test_id("nav-overview").click()
        expect(page.get_by_test_id("overview-status-failed")).to_contain_text("2")
        expect(page.get_by_test_id("failed-run").filter(has_text="failed-run")).to_contain_text("OutOfMemoryError")
        shot(page, "overview")
        s.assert_clean()


LISTING = re.compile(r"/api/runs\?since=0&stream=1$")
FIRST_TABLE = re.compile(r"/api/table\?remembered=1&rows=200$")


@contextmanager
def listing_held(browser: Browser, viewer: Viewer, errors: list[str]) -> Iterator[tuple[Page, Any]]:
    """A tab on the viewer whose first table answer brings the rows of its first 3 runs only (the page
    asks for 200), and whose listing is held back until the table is drawn: the tab and the held
    request (for the test to answer). Page errors go into ``errors``."""
    viewer.forget_view()
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    held: list[Any] = []
    try:
        page.route(FIRST_TABLE, lambda route: route.continue_(url=route.request.url.replace("rows=200", "rows=3")))
        page.route(LISTING, lambda route: held.append(route))
        page.goto(viewer.url)
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")
        expect(page.get_by_test_id("run-row")).to_have_count(24)
        assert len(held) == 1
        yield page, held[0]
    finally:
        context.close()


def test_the_table_draws_from_its_first_rows_while_the_listing_streams(browser: Browser, viewer: Viewer) -> None:
    # The page draws the Runs view from the first table answer's rows (here 3 of them), before the
    # listing has brought the other runs; those rows are drawn empty, then filled as it arrives.
    order = viewer.table()["keys"]
    names = {r["key"]: r["name"] for r in viewer.api("/api/runs")["runs"]}
    errors: list[str] = []

    # 1. A listing cut off after its header and 5 rows: the first screen is there, with the rows it
    #    brought, and the page says the listing did not all load.
    partial = order[-5:]
    with listing_held(browser, viewer, errors) as (page, listing):
        header, chunk, _end = listing.fetch().body().splitlines()
        rows = [r for r in json.loads(chunk)["runs"] if r["key"] in partial]
        listing.fulfill(status=200, content_type="application/x-ndjson",
                        body=header + b"\n" + json.dumps({"runs": rows}).encode() + b"\n")
        expect(page.get_by_test_id("toast")).to_contain_text("The runs did not all load")
        expect(page.get_by_test_id("toast")).to_contain_text("cut off")
        for key in [*order[:3], *partial]:
            expect(page.locator(f"[data-testid=run-row][data-key='{key}'] .cell-name")).to_have_text(names[key])
        # A run the page never got is not drawn once the listing has ended (it holds nothing of it).
        expect(page.locator(f"[data-testid=run-row][data-key='{order[3]}']")).to_have_count(0)

    # 2. The whole listing, once the table is drawn: 3 rows with their runs and 21 drawn empty while
    #    the header says it is loading; then every row drawn empty is filled in.
    with listing_held(browser, viewer, errors) as (page, listing):
        expect(page.locator("[data-testid=run-row] .cell-name")).to_have_text([names[k] for k in order[:3]])
        expect(page.locator(f"[data-testid=run-row][data-key='{order[3]}']")).to_contain_text("–")
        expect(page.get_by_test_id("last-refreshed")).to_have_text("Loading runs… 3")
        # The status counts wait for every run: counting the 3 arrived would say 0 failed runs.
        expect(page.get_by_test_id("status-segment-failed")).to_have_text("Failed")
        expect(page.get_by_test_id("count-failed")).to_have_text("…failed")
        listing.continue_()
        expect(page.get_by_test_id("last-refreshed")).to_have_text(re.compile(r"^(Refreshed|Not refreshed)"))
        expect(page.get_by_test_id("status-segment-failed")).to_have_text("Failed2")
        expect(page.get_by_test_id("count-failed")).to_have_text("2failed")
        drawn = page.locator("[data-testid=run-row] .cell-name")
        expect(drawn).to_have_count(24)
        assert sorted(drawn.all_inner_texts()) == sorted(names.values())
    assert errors == []


def test_the_column_chooser_lists_a_bounded_number_of_options_and_its_search_finds_every_column(
    browser: Browser, tmp_path: Path
) -> None:
    # 600 logged keys: the chooser lists 200 of them (and says how many more), a search finds any.
    root = tmp_path / "traceml" / "runs"
    folder = root / "20261130-100000_wide_ab12"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "id": folder.name, "name": "wide", "status": "completed",
        "started_at": "2026-11-30T10:00:00Z", "ended_at": "2026-11-30T10:30:00Z"}))
    (folder / "metrics.json").write_text(json.dumps({"summary": {f"probe/k{i:03d}": i / 1000 for i in range(600)}}))
    with serve(root) as viewer, open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("column-chooser").click()
        chooser = page.get_by_test_id("column-popover")
        summary = chooser.locator("[data-testid=column-option][data-column^='summary.probe/']")
        expect(summary).to_have_count(200)
        expect(chooser.get_by_test_id("column-more")).to_have_text("400 more: type to find them")
        chooser.get_by_test_id("column-search").fill("k599")
        expect(summary).to_have_count(1)
        summary.check()
        chooser.get_by_test_id("column-search").fill("")
        # The chosen column stays listed (checked) beyond the first 200.
        expect(chooser.locator("[data-testid=column-option][data-column='summary.probe/k599']")).to_be_checked()
        expect(summary).to_have_count(201)
        page.keyboard.press("Escape")
        expect(page.locator(".tabulator-col[tabulator-field='summary.probe/k599']")).to_have_count(1)
        s.assert_clean()


# -- 2. filter, search, group, sort ----------------------------------------------------------------


def test_filter_chip_search_group_and_sort_update_the_counts(browser: Browser, viewer: Viewer) -> None:
    runs = viewer.api("/api/runs")["runs"]
    good = [r for r in runs if (r["best"].get("val/auc") or {}).get("value") is not None
            and r["best"]["val/auc"]["value"] >= 0.9]
    assert 0 < len(good) < 24  # the seed gives a real filter
    with open_viewer(browser, viewer) as s:
        page = s.page
        # a per-column filter from the column header's funnel
        page.locator("[data-testid=column-filter][data-column='run.best.val/auc']").click()
        popover = page.get_by_test_id("filter-popover")
        popover.get_by_test_id("filter-input").fill(">=0.9")
        popover.get_by_test_id("filter-apply").click()
        chip = page.get_by_test_id("filter-chip")
        expect(chip).to_have_count(1)
        expect(chip).to_contain_text("val/auc")
        expect(chip).to_contain_text(">=0.9")
        expect(page.get_by_test_id("table-info")).to_have_text(f"{len(good)} of 24 runs")
        expect(page.get_by_test_id("nav-count-runs")).to_have_text(str(len(good)))
        expect(page.get_by_test_id("filter-error")).to_be_hidden()

        # search narrows further (the count is Python's answer for the same query)
        page.get_by_test_id("search").fill("resnet50")
        both = viewer.table(filter="run.best.val/auc:>=0.9", search="resnet50")
        assert both["shown"] < len(good)
        expect(page.get_by_test_id("table-info")).to_have_text(f"{both['shown']} of 24 runs")
        page.get_by_test_id("search").fill("")
        expect(page.get_by_test_id("table-info")).to_have_text(f"{len(good)} of 24 runs")

        # a bad expression shows the server's one-line error
        chip.click()
        page.get_by_test_id("filter-popover").get_by_test_id("filter-input").fill("/[/")
        page.get_by_test_id("filter-popover").get_by_test_id("filter-apply").click()
        expect(page.get_by_test_id("filter-error")).to_contain_text("invalid regular expression")
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")  # the unfiltered order
        # a word where the column holds numbers: the same one line as `traceml runs ls` (issue 14)
        page.get_by_test_id("filter-chip").click()
        page.get_by_test_id("filter-popover").get_by_test_id("filter-input").fill("=abc")
        page.get_by_test_id("filter-popover").get_by_test_id("filter-apply").click()
        expect(page.get_by_test_id("filter-error")).to_contain_text(
            "'abc' is not a number, and run.best.val/auc holds numbers, so it would match no run")
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")
        page.get_by_test_id("filter-chip-remove").click()
        expect(page.get_by_test_id("filter-chip")).to_have_count(0)
        expect(page.get_by_test_id("filter-error")).to_be_hidden()
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")

        # group by dataset: one header per dataset, with its run count
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        groups = viewer.table(group="config.data.dataset")["groups"]
        assert len(groups) >= 3
        headers = page.get_by_test_id("group-header")
        expect(headers).to_have_count(len(groups))
        for g in groups:
            n = len(g["keys"])
            header = page.locator(f"[data-testid=group-header][data-group='{g['label']}']")
            expect(header).to_contain_text(f"{n} run{'' if n == 1 else 's'}")
        assert sum(len(g["keys"]) for g in groups) == 24
        shot(page, "runs-grouped")
        page.get_by_test_id("group-by").select_option("")
        expect(headers).to_have_count(0)

        # click a header: ascending; again: descending; shift-click another: a second sort level
        title = page.locator(".col-title[data-column=group] .col-name")
        # A sort moves the rows the table has, it does not build them again (issue 16: rebuilding
        # 100,000 froze the tab): the drawn row elements are the same ones, in the new order.
        page.evaluate("document.querySelectorAll('[data-testid=run-row]').forEach((el) => { el.__before = true; })")
        title.click()
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("↑")
        shown_keys_are(page, viewer.table(sort="group")["keys"])
        assert page.evaluate("[...document.querySelectorAll('[data-testid=run-row]')].every((el) => el.__before)")
        title.click()
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("↓")
        shown_keys_are(page, viewer.table(sort="-group")["keys"])
        page.locator(".col-title[data-column='run.best.val/auc'] .col-name").click(modifiers=["Shift"])
        expect(page.locator(".col-title[data-column=group] .col-sort")).to_have_text("↓1")
        expect(page.locator(".col-title[data-column='run.best.val/auc'] .col-sort")).to_have_text("↑2")
        two = viewer.table(sort=["-group", "run.best.val/auc"])["keys"]
        assert two != viewer.table(sort="-group")["keys"]  # the second level matters on this data
        shown_keys_are(page, two)
        expect(page.get_by_test_id("table-info")).to_have_text("24 runs")
        s.assert_clean()


# -- 3-5. line charts: plot, zoom, EMA -------------------------------------------------------------

THREE = ("baseline", "high-lr", "small-model")


def plot(page: Page, *names: str) -> Locator:
    """Select runs in the table, press Plot; returns the line charts once each has drawn."""
    select_runs(page, *names)
    page.get_by_test_id("selection-plot").click()
    charts = page.get_by_test_id("chart-line")
    expect(charts.first.locator("canvas")).to_be_visible()
    for i in range(charts.count()):
        expect(charts.nth(i).locator(".uplot canvas")).to_have_count(1)
    return charts


def test_a_reload_opens_the_remembered_view_with_the_table_it_asks_for(browser: Browser, viewer: Viewer) -> None:
    view = {"view": "runs", "filters": [{"column": "run.best.val/auc", "expr": ">=0.9"}],
            "sort": ["run.best.val/auc"], "group": None}
    expected = viewer.table(filter="run.best.val/auc:>=0.9", sort="run.best.val/auc")
    assert 0 < expected["shown"] < 24
    with open_viewer(browser, viewer) as s:
        page = s.page
        viewer.api("/api/ui-state", view, method="PUT")
        s.requests.clear()
        page.reload()
        # The table index.html preloaded for the remembered view is the one drawn, in Python's order.
        expect(page.get_by_test_id("table-info")).to_have_text(f"{expected['shown']} of 24 runs")
        shown_keys_are(page, expected["keys"])
        expect(page.get_by_test_id("filter-chip")).to_contain_text(">=0.9")
        assert any(u.endswith("/api/table?remembered=1&rows=200") for u in s.requests)
        assert any(u.endswith("/api/runs?since=0&stream=1") for u in s.requests)
        s.assert_clean()


def test_a_view_opened_from_a_link_becomes_the_remembered_view(browser: Browser, viewer: Viewer) -> None:
    # Review 16b: after a plot saved Charts as the remembered view, opening `#v=runs` showed the
    # table, but a plain open later showed Charts again.
    with open_viewer(browser, viewer) as s:
        viewer.api("/api/ui-state", {"view": "charts"}, method="PUT")
        linked = s.page.context.new_page()  # (a new tab: the hash is a link, not this tab's reload)
        linked.goto(viewer.url.split("?")[0] + "#v=runs")
        expect(linked.get_by_test_id("view-runs")).to_be_visible()
        deadline = time.monotonic() + WAIT_MS / 1000
        while viewer.api("/api/ui-state").get("view") != "runs":
            assert time.monotonic() < deadline, "the linked view was not remembered"
            time.sleep(0.05)
        linked.close()
        plain = s.page.context.new_page()
        plain.goto(viewer.url.split("?")[0])
        expect(plain.get_by_test_id("view-runs")).to_be_visible()
        expect(plain.get_by_test_id("view-charts")).to_be_hidden()
        plain.close()
        s.assert_clean()


def test_three_selected_runs_plot_as_line_charts_with_a_legend(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        charts = plot(page, *THREE)
        expect(page.get_by_test_id("view-charts")).to_be_visible()
        expect(page.get_by_test_id("chart-scope")).to_have_text("3 selected runs")
        # the default metrics, one chart each, each drawn (its canvas is not blank)
        assert [charts.nth(i).get_attribute("data-metric") for i in range(charts.count())] == [
            "train/loss", "val/loss", "val/auc"]
        for i in range(charts.count()):
            assert painted_pixels(charts.nth(i).locator("canvas")) > 2000
        legend = page.get_by_test_id("legend-item")
        expect(legend).to_have_text(list(THREE))
        # legend click hides a run; the chart redraws without it, and a second click brings it back
        before = painted_pixels(charts.first.locator("canvas"))
        legend.nth(1).click()
        expect(legend.nth(1)).to_have_class(re.compile(r"\bis-off\b"))
        assert painted_pixels(page.get_by_test_id("chart-line").first.locator("canvas")) < before
        legend.nth(1).click()
        expect(legend.nth(1)).not_to_have_class(re.compile(r"\bis-off\b"))
        shot(page, "chart-line")
        s.assert_clean()


def test_drag_zooms_the_x_axis_and_the_zoom_survives_redraws(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        charts = plot(page, *THREE)
        chart = charts.first
        expect(page.get_by_test_id("reset-zoom")).to_be_disabled()
        lo, hi = x_range(page, chart)
        drag_zoom(page, chart, 0.3, 0.6)
        expect(page.get_by_test_id("reset-zoom")).to_be_enabled()
        zlo, zhi = x_range(page, chart)
        assert lo < zlo < zhi < hi
        assert zhi - zlo < 0.5 * (hi - lo)
        # the other metric charts follow (synced x)
        assert x_range(page, charts.nth(2)) == (zlo, zhi)

        # a redraw (log y) and a re-fetch (Refresh) keep the zoom
        switch(page, "log-y").click()
        expect(page.get_by_test_id("log-y")).to_be_checked()
        assert x_range(page, page.get_by_test_id("chart-line").first) == (zlo, zhi)
        with page.expect_response(lambda r: "/api/refresh" in r.url):
            page.get_by_test_id("refresh").click()
        expect(page.get_by_test_id("reset-zoom")).to_be_enabled()
        assert x_range(page, page.get_by_test_id("chart-line").first) == (zlo, zhi)

        # the zoom-out button goes back to the whole range
        page.get_by_test_id("reset-zoom").click()
        expect(page.get_by_test_id("reset-zoom")).to_be_disabled()
        assert x_range(page, page.get_by_test_id("chart-line").first) == (lo, hi)

        # so does a double-click, and the charts are then unzoomed (a redraw shows everything again)
        chart = page.get_by_test_id("chart-line").first
        drag_zoom(page, chart, 0.3, 0.6)
        assert x_range(page, chart)[1] < hi
        chart.locator(".u-over").dblclick()
        assert x_range(page, chart) == (lo, hi)
        expect(page.get_by_test_id("reset-zoom")).to_be_disabled()
        switch(page, "log-y").click()
        expect(page.get_by_test_id("log-y")).not_to_be_checked()
        assert x_range(page, page.get_by_test_id("chart-line").first) == (lo, hi)
        s.assert_clean()


def test_ema_slider_requests_and_draws_smoothed_series(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        charts = plot(page, *THREE)
        raw = painted_pixels(charts.first.locator("canvas"))
        with page.expect_response(lambda r: "/api/series" in r.url and r.request.post_data_json["ema"] == 0.6) as got:
            page.get_by_test_id("ema").fill("0.6")
        expect(page.get_by_test_id("ema-value")).to_have_text("0.60")
        body = got.value.json()
        assert {x["key"] for x in body["series"]} == {viewer.key_of(n) for n in THREE}
        for series in body["series"]:
            assert series["smoothed"] is not None and len(series["smoothed"]) == len(series["y"])
            assert series["smoothed"] != series["y"]
        # the raw lines stay (faint) and the smoothed ones are drawn on top: more ink than before
        charts = page.get_by_test_id("chart-line")
        expect(charts.first.locator(".uplot canvas")).to_have_count(1)
        page.wait_for_function(
            "([el, n]) => { const c = el.querySelector('canvas'); if (!c) return false;"
            " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            " let k = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) k++; return k > n; }",
            arg=[charts.first.element_handle(), raw], timeout=WAIT_MS,
        )
        shot(page, "chart-line-ema")
        s.assert_clean()


# -- scatter, box, bar -----------------------------------------------------------------------------


def test_scatter_box_and_bar_charts_draw_every_shown_run(browser: Browser, viewer: Viewer) -> None:
    runs = viewer.api("/api/runs")["runs"]
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("nav-charts").click()
        expect(page.get_by_test_id("chart-empty")).to_be_visible()  # line charts need a selection

        page.get_by_test_id("chart-kind-scatter").click()
        expect(page.get_by_test_id("chart-scope")).to_have_text("all 24 shown runs (none selected)")
        expect(page.get_by_test_id("chart-scatter")).to_be_visible()
        plotted = int(page.get_by_test_id("scatter-count").inner_text().split()[0])
        expect(page.get_by_test_id("scatter-point")).to_have_count(plotted)
        assert 10 < plotted <= 24
        shot(page, "chart-scatter")

        page.get_by_test_id("chart-kind-box").click()
        datasets = {r["params"].get("data.dataset") for r in runs} - {None}
        expect(page.get_by_test_id("box-group")).to_have_count(len(datasets))
        for name in datasets:
            expect(page.locator(f"[data-testid=box-group][data-group='{name}']")).to_have_count(1)
        points = page.locator("[data-testid=box-point], [data-testid=box-outlier]")
        assert points.count() > 10
        shot(page, "chart-box")

        page.get_by_test_id("chart-kind-bar").click()
        expect(page.get_by_test_id("chart-bar")).to_be_visible()
        n_bars = int(page.get_by_test_id("bar-count").inner_text().split()[0])
        expect(page.get_by_test_id("bar")).to_have_count(n_bars)
        assert 10 < n_bars <= 24
        expect(page.locator("[data-testid=bar][data-label=baseline]")).to_have_count(1)
        shot(page, "chart-bar")
        s.assert_clean()


# -- 6. compare ------------------------------------------------------------------------------------


def test_compare_marks_differing_rows_and_can_hide_the_equal_ones(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        select_runs(page, *THREE)
        page.get_by_test_id("selection-compare").click()
        table = page.get_by_test_id("compare-table")
        expect(table.locator("thead th")).to_have_count(4)
        expect(table.locator("thead")).to_contain_text("baseline")
        expect(table.locator("thead")).to_contain_text("high-lr")
        expect(table.locator("thead")).to_contain_text("small-model")
        rows = page.get_by_test_id("compare-row")
        diff = page.locator("[data-testid=compare-row][data-diff='1']")
        same = page.locator("[data-testid=compare-row][data-diff='0']")
        n_diff = diff.count()
        assert n_diff > 0 and same.count() > 0
        expect(page.get_by_test_id("compare-diff-count")).to_have_text(f"{n_diff} differing rows")
        # the learning rate is what high-lr changes; all three completed
        lr = rows.filter(has=page.locator("td.compare-key", has_text=re.compile(r"^optim\.lr$")))
        expect(lr).to_have_attribute("data-diff", "1")
        status = rows.filter(has=page.locator("td.compare-key", has_text=re.compile(r"^status$")))
        expect(status).to_have_attribute("data-diff", "0")
        shot(page, "compare")

        switch(page, "compare-only-diff").click()
        expect(page.get_by_test_id("compare-only-diff")).to_be_checked()
        expect(same).to_have_count(0)
        expect(rows).to_have_count(n_diff)
        expect(status).to_have_count(0)
        expect(lr).to_have_count(1)
        switch(page, "compare-only-diff").click()
        expect(same.first).to_be_visible()
        s.assert_clean()


# -- 7. inspector ----------------------------------------------------------------------------------


def test_the_inspector_of_the_failed_run_shows_its_error_and_opens_run_json(browser: Browser, viewer: Viewer) -> None:
    run_json = next(viewer.root.glob("*_failed-run_*")) / "run.json"
    on_disk = run_json.read_bytes()
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "failed-run").locator(".cell-name").click()
        inspector = page.get_by_test_id("inspector")
        expect(inspector).to_be_visible()
        expect(page.get_by_test_id("inspector-name")).to_have_text("failed-run")
        callout = page.get_by_test_id("error-callout")
        expect(callout.get_by_test_id("error-type")).to_have_text("OutOfMemoryError")
        expect(callout.get_by_test_id("error-message")).to_contain_text("CUDA out of memory. Tried to allocate")
        expect(callout.get_by_test_id("error-exit")).to_have_text("exit code 1")
        traceback = callout.get_by_test_id("traceback")
        expect(traceback).to_contain_text("torch.OutOfMemoryError: CUDA out of memory")  # the last line
        expect(traceback).to_contain_text('train.py", line 212, in <module>')
        expect(row(page, "failed-run")).to_have_class(re.compile(r"\bis-inspected\b"))
        shot(page, "inspector")

        page.locator("[data-testid=file-button][data-file='run.json']").click()
        viewer_modal = page.get_by_test_id("file-viewer")
        expect(viewer_modal).to_contain_text("read-only")
        # on screen, although run.json holds the traceback on one very long line
        expect(viewer_modal).to_be_in_viewport(ratio=0.99)
        content = viewer_modal.get_by_test_id("file-content")
        expect(content).to_contain_text('"error_type": "OutOfMemoryError"')
        assert json.loads(content.inner_text())["name"] == "failed-run"
        # nothing in it can be edited or saved
        expect(viewer_modal.locator("textarea, input, [contenteditable], button:has-text('Save')")).to_have_count(0)
        shot(page, "inspector-run-json")
        page.keyboard.press("Escape")  # closes the modal first...
        expect(viewer_modal).to_have_count(0)
        expect(inspector).to_be_visible()
        page.keyboard.press("Escape")  # ...then the inspector
        expect(inspector).to_be_hidden()
        s.assert_clean()
    assert run_json.read_bytes() == on_disk


# -- 8. exports ------------------------------------------------------------------------------------


def test_export_table_csv_and_chart_png_into_the_cache_folder(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        page.get_by_test_id("export-table").click()
        bar = page.get_by_test_id("export-bar")
        expect(bar).to_be_visible()
        expect(bar).to_contain_text("Table CSV (24 runs) saved:")
        path = Path(page.get_by_test_id("export-path").inner_text())
        assert path.parent == viewer.cache / "exports" and path.suffix == ".csv"
        latest = viewer.cache / "exports" / "latest.csv"
        assert path.is_file() and latest.is_file()
        with latest.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        head = rows[0]
        assert {"name", "status", "run.best.val/auc"} <= set(head)  # the shown columns
        assert len(rows) == 1 + 24
        assert {r[head.index("name")] for r in rows[1:]} >= set(THREE)
        page.get_by_test_id("export-close").click()
        expect(bar).to_be_hidden()

        plot(page, *THREE)
        page.get_by_test_id("export-chart-png").click()
        expect(bar).to_be_visible()
        expect(bar).to_contain_text("Line chart PNG saved:")
        png = Path(page.get_by_test_id("export-path").inner_text())
        assert png.parent == viewer.cache / "plots" and png.suffix == ".png"
        assert png.is_file()
        assert png_phys(png.read_bytes()) == (PNG_300_DPI, PNG_300_DPI, 1)  # 300 DPI
        s.assert_clean()


# -- 9. live run -----------------------------------------------------------------------------------


@pytest.fixture()
def live(tmp_path: Path) -> Iterator[Viewer]:
    """24 fake runs served with a 1 s poll, one server per test (each test starts its own live run)."""
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=24, seed=0)
    with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v:
        yield v


@contextmanager
def logging_run(root: Path) -> Iterator[None]:
    """``live_run`` writing one epoch every 0.5 s into ``root`` in a thread, until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=live_run, args=(root,), kwargs={"interval": 0.5, "stop": stop}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def step_cell(page: Page) -> Locator:
    return row(page, "live-run").locator(".tabulator-cell[tabulator-field=step]")


def test_a_live_run_appears_and_its_step_grows_without_a_reload(browser: Browser, live: Viewer) -> None:
    with open_viewer(browser, live) as s:
        page = s.page
        expect(page.get_by_test_id("refresh-interval")).to_contain_text("1 s")
        before = len(live.api("/api/runs")["runs"])
        page.evaluate("window.__notReloaded = true")
        page.get_by_test_id("column-chooser").click()
        page.locator("[data-testid=column-option][data-column=step]").check()
        page.keyboard.press("Escape")
        with logging_run(live.root):
            expect(page.get_by_test_id("table-info")).to_have_text(f"{before + 1} runs")
            expect(row(page, "live-run").get_by_test_id("status-badge")).to_have_text("running")
            expect(page.get_by_test_id("count-running")).to_contain_text("1")
            expect(step_cell(page)).to_have_text(re.compile(r"^\d+$"))
            first = int(step_cell(page).inner_text())
            expect(step_cell(page)).not_to_have_text(str(first))
            assert int(step_cell(page).inner_text()) > first
            shot(page, "runs-live")
        assert page.evaluate("window.__notReloaded") is True  # the same page, updated in place
        assert any("/api/events" in u for u in s.requests)  # pushed over server-sent events...
        assert any(re.search(r"/api/runs\?since=[1-9]", u) for u in s.requests)  # ...then fetched as a delta
        s.assert_clean()


def test_a_live_chart_follows_new_steps_and_keeps_a_zoom(browser: Browser, live: Viewer) -> None:
    with logging_run(live.root), open_viewer(browser, live) as s:
        page = s.page
        expect(row(page, "live-run").get_by_test_id("status-badge")).to_have_text("running")
        chart = plot(page, "live-run").first
        expect(page.get_by_test_id("reset-zoom")).to_be_disabled()
        lo, hi = x_range(page, chart)
        # unzoomed, the chart grows with the run (a redraw may bring no new step yet: wait for one that does)
        for _ in range(30):
            redrawn(page, chart)
            lo2, hi2 = x_range(page, chart)
            # the tooltip reads the nearest point: with fewer than 6 steps a zoom's edges would snap to
            # the ends, so wait for enough steps that the zoomed edges fall on inner points
            if hi2 > hi and hi2 >= 5:
                break
        else:
            raise AssertionError(f"the live chart still ends at step {hi2} after 30 updates")
        assert lo2 == lo
        expect(page.get_by_test_id("reset-zoom")).to_be_disabled()
        # zoomed, live redraws keep the zoomed range
        drag_zoom(page, chart, 0.2, 0.7)
        zoomed = x_range(page, chart)
        assert lo < zoomed[0] < zoomed[1] < hi2
        for _ in range(2):
            redrawn(page, chart)
            expect(page.get_by_test_id("reset-zoom")).to_be_enabled()
            assert x_range(page, chart) == zoomed
        s.assert_clean()


# -- 10. a run name that is HTML -------------------------------------------------------------------


def test_a_run_named_like_html_shows_as_text_and_runs_no_script(browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=3, seed=0)
    write_xss_run(root)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        expect(page.get_by_test_id("table-info")).to_have_text("4 runs")
        xss = row(page, XSS_NAME)
        expect(xss.locator(".cell-name")).to_have_text(XSS_NAME)
        expect(xss).to_contain_text("<b>group</b>")
        expect(xss).to_contain_text("<script>alert(2)</script>")
        shot(page, "xss-table")

        xss.locator(".cell-name").click()
        expect(page.get_by_test_id("inspector-name")).to_have_text(XSS_NAME)
        info = page.get_by_test_id("inspector-info")
        expect(info).to_contain_text("<svg onload=alert(3)>")
        expect(info).to_contain_text("<b>group</b>")
        page.locator("[data-testid=file-button][data-file='run.json']").click()
        expect(page.get_by_test_id("file-content")).to_contain_text('"name": "<img src=x onerror=alert(1)>"')
        page.keyboard.press("Escape")
        shot(page, "xss-inspector")

        xss.get_by_test_id("row-check").check()
        row(page, "baseline").get_by_test_id("row-check").check()
        page.get_by_test_id("selection-compare").click()
        expect(page.get_by_test_id("compare-table").locator("thead")).to_contain_text(XSS_NAME)
        page.get_by_test_id("nav-overview").click()
        expect(page.get_by_test_id("recent-runs")).to_contain_text(XSS_NAME)

        # none of it became markup: no image, no bold, no script, no svg from the run's values
        assert page.locator("img, b, script:not([src]), svg[onload]").count() == 0
        assert not any(u.endswith("/x") for u in s.requests)
        s.assert_clean()  # no dialog, no console error, no CSP violation


# -- 11. no console errors, no CSP violations ------------------------------------------------------


def test_every_view_loads_without_console_errors_or_csp_violations(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        page = s.page
        csp = page.evaluate("fetch('/').then((r) => r.headers.get('content-security-policy'))")
        assert "script-src 'self'" in csp and "style-src 'self'" in csp
        for view in ("overview", "runs", "charts", "compare"):
            page.get_by_test_id(f"nav-{view}").click()
            expect(page.get_by_test_id(f"view-{view}")).to_be_visible()
        page.get_by_test_id("nav-runs").click()
        page.get_by_test_id("group-by").select_option("config.data.dataset")
        expect(page.get_by_test_id("group-header").first).to_be_visible()
        page.get_by_test_id("group-by").select_option("")
        plot(page, *THREE)
        for kind in ("scatter", "box", "bar", "line"):
            page.get_by_test_id(f"chart-kind-{kind}").click()
            expect(page.get_by_test_id(f"chart-pane-{kind}")).to_be_visible()
        page.get_by_test_id("nav-compare").click()
        expect(page.get_by_test_id("compare-table")).to_be_visible()
        page.get_by_test_id("nav-runs").click()
        row(page, "failed-run").locator(".cell-name").click()
        expect(page.get_by_test_id("error-callout")).to_be_visible()
        page.locator("[data-testid=file-button][data-file='metrics.jsonl']").click()
        expect(page.get_by_test_id("file-content")).not_to_have_text("Loading…")
        page.keyboard.press("Escape")
        # the page fetched nothing but its own origin
        assert s.requests and all(u.startswith(viewer.base + "/") for u in s.requests)
        assert s.console_errors == []
        assert s.csp_violations() == []
        s.assert_clean()


# -- 12. the telemetry of a captured run -----------------------------------------------------------

HTML_SCRIPT = '''"""The digits example, printing an HTML-looking line on stderr first."""
import runpy
import sys

print("<img src=x onerror=alert(1)>", file=sys.stderr, flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run captured by the real ``traceml run`` on 2 CPU ranks: the digits example with a planted
    straggler (rank 1), whose ranks also print an HTML-looking line on stderr. Returns the runs root."""
    from tests.conftest import run_traceml

    work = tmp_path_factory.mktemp("captured")
    (work / "train_html.py").write_text(HTML_SCRIPT, encoding="utf-8")
    done = run_traceml("run", "--mode", "quiet", "--nproc-per-node", "2", "train_html.py",
                       str(REPO / "examples" / "train_digits.py"), "--epochs", "2", "--plant", "straggler",
                       cwd=work, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    root = work / "traceml" / "runs"
    assert (next(root.iterdir()) / "aggregator" / "final_summary.json").is_file()
    return root


def test_a_captured_run_without_steps_is_not_judged_in_the_inspector(browser: Browser, tmp_path: Path) -> None:
    # Issue 14 item 4: a run that timed no step was shown "No problem found in the telemetry."
    from tests.conftest import run_traceml

    (tmp_path / "nosteps.py").write_text("print('no trace_step here')\n", encoding="utf-8")
    done = run_traceml("run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"), "nosteps.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    with serve(tmp_path / "runs") as v, open_viewer(browser, v) as s:
        page = s.page
        row(page, "nosteps").locator(".cell-name").click()
        section = page.get_by_test_id("inspector-telemetry")
        expect(section.get_by_test_id("finding-not-judged")).to_contain_text("not judged: no training step was timed")
        expect(section.get_by_test_id("finding-none")).to_have_count(0)


@pytest.mark.timeout(600)  # the module fixture runs a real 2-rank training first
def test_the_inspector_shows_the_telemetry_of_a_captured_run(browser: Browser, captured: Path) -> None:
    run_dir = next(captured.iterdir())
    final = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    with serve(captured) as v, open_viewer(browser, v) as s:
        page = s.page
        row(page, "train_html").locator(".cell-name").click()
        section = page.get_by_test_id("inspector-telemetry")
        expect(section).to_be_visible()

        # diagnoses first: the final summary's findings, in its order, and the abstentions folded away
        findings = section.get_by_test_id("finding")
        expect(findings).to_have_count(len(final["findings"]))
        if final["findings"]:
            first = final["findings"][0]
            expect(findings.first.get_by_test_id("finding-summary")).to_have_text(first["summary"])
            expect(findings.first.get_by_test_id("finding-severity")).to_have_text(first["severity"])
        else:  # a healthy verdict is said, not left blank
            expect(section.get_by_test_id("finding-none")).to_have_text("No problem found in the telemetry.")
        abstained = section.get_by_test_id("abstentions")
        expect(abstained).to_contain_text(f"{len(final['abstained'])} rules could not judge")
        expect(abstained.locator("li").first).to_be_hidden()

        # the inspector is a summary: the charts are in the Performance view, which it links to
        expect(section.get_by_test_id("telemetry-steps")).to_have_count(0)
        expect(section.get_by_test_id("telemetry-more")).to_contain_text("in the Performance view")
        shot(page, "inspector-telemetry")
        section.get_by_test_id("telemetry-open-performance").click()
        perf = page.locator("[data-testid=perf-run][data-name=train_html]")
        expect(perf).to_be_visible()

        # the step by phase over steps: a stacked area of the phases (backward among them)
        breakdown = perf.get_by_test_id("perf-breakdown")
        expect(breakdown.get_by_test_id("perf-area")).to_be_visible()
        expect(breakdown.get_by_test_id("perf-area-phase").first).to_be_attached()
        expect(breakdown).to_contain_text("backward")

        # the ranks: both in the heatmap, one marked: the slowest by the straggler measure, labelled
        # "straggler" when the diagnosis names it (the same rank), else "slowest"
        heat = perf.get_by_test_id("perf-heatmap")
        expect(heat.get_by_test_id("heat-row")).to_have_count(2)
        worst = str(final["step_time"]["worst_rank"])
        named = {str(r) for f in final["findings"] if f["kind"] == "straggler" for r in f["evidence"]["ranks"]}
        assert not named or named == {worst}
        expect(heat.locator("[data-testid=heat-row][data-straggler='1']")).to_have_count(len(named))
        expect(heat.locator(f"[data-testid=heat-row][data-rank='{worst}']")).to_contain_text(
            "straggler" if named else "slowest")
        expect(perf.get_by_test_id("telemetry-rss").locator("canvas").first).to_be_visible()
        expect(perf.get_by_test_id("telemetry-host").locator("canvas").first).to_be_visible()
        heat.scroll_into_view_if_needed()
        shot(page, "perf-telemetry-ranks")

        # the captured output: the HTML-looking line is text, not an image
        log = perf.get_by_test_id("telemetry-log")
        log.scroll_into_view_if_needed()
        expect(log).to_contain_text("epoch 1: train/loss")
        html_line = log.get_by_test_id("log-line").filter(has_text=XSS_NAME)
        expect(html_line).to_have_text(XSS_NAME)
        expect(html_line).to_have_attribute("data-stream", "stderr")
        shot(page, "perf-telemetry-logs")
        perf.get_by_test_id("telemetry-log-stderr").click()
        expect(log.locator("[data-testid=log-line][data-stream=stdout]")).to_have_count(0)
        expect(html_line).to_be_visible()
        perf.get_by_test_id("telemetry-log-rank").select_option("1")
        expect(log.get_by_test_id("log-line").filter(has_text=XSS_NAME)).to_have_count(1)
        perf.get_by_test_id("telemetry-log-all").click()
        perf.get_by_test_id("telemetry-log-rank").select_option("0")  # rank 0 prints the epochs
        expect(log.locator("[data-testid=log-line][data-stream=stdout]").first).to_be_visible()

        assert page.locator("#app img, .inspector img").count() == 0
        assert not any(u.endswith("/x") for u in s.requests)
        s.assert_clean()


def test_telemetry_losses_gpu_charts_and_a_corrupt_database_in_the_inspector(browser: Browser, tmp_path: Path) -> None:
    from tests.diagnose.telemetry_db import GIB, RunSpec, write_run
    from traceml_ai.diagnose import write_final_summary

    root = tmp_path / "traceml" / "runs"
    generate(root, runs=4, seed=0)
    gpu_run = next(root.glob("*_baseline_*"))
    write_run(gpu_run, RunSpec(ranks=2, steps=120, gpu=True, gpu_util=lambda t: 35.0,
                               peak_alloc=lambda rank, step: (8 + 0.02 * step) * GIB))
    write_final_summary(gpu_run, degraded="the aggregator exited during the run (exit code -9)")
    (gpu_run / "aggregator" / "finalization_warning.json").write_text(json.dumps(
        {"schema_version": 1, "summary": ["rank 1 dropped 4 batches (its send queue was full)"]}))
    corrupt = next(root.glob("*_high-lr_*")) / "aggregator"
    corrupt.mkdir()
    (corrupt / "telemetry.sqlite").write_bytes(b"not a database\n" * 100)
    (corrupt / "rank_0.log").write_text("stderr | RuntimeError: boom\n")
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        row(page, "baseline").locator(".cell-name").click()
        section = page.get_by_test_id("inspector-telemetry")
        expect(section.get_by_test_id("telemetry-status")).to_contain_text("Telemetry degraded")
        expect(section.get_by_test_id("telemetry-status")).to_contain_text("exit code -9")
        expect(section.get_by_test_id("telemetry-partial")).to_contain_text("rank 1 dropped 4 batches")
        shot(page, "inspector-telemetry-degraded")
        section.get_by_test_id("telemetry-open-performance").click()
        perf = page.locator("[data-testid=perf-run][data-name=baseline]")
        expect(perf.get_by_test_id("telemetry-status")).to_contain_text("Telemetry degraded")
        expect(perf.get_by_test_id("telemetry-partial")).to_contain_text("rank 1 dropped 4 batches")
        expect(perf.get_by_test_id("perf-area")).to_be_visible()
        for chart in ("telemetry-memory", "telemetry-rss", "telemetry-host", "telemetry-gpu"):
            expect(perf.get_by_test_id(chart).locator("canvas").first).to_be_visible()
        expect(perf.get_by_test_id("telemetry-memory")).to_contain_text("rank 1 cuda:1 alloc")
        expect(perf.get_by_test_id("telemetry-logs")).to_contain_text("No captured stdout/stderr.")
        perf.get_by_test_id("telemetry-gpu").scroll_into_view_if_needed()
        shot(page, "perf-telemetry-gpu")

        page.get_by_test_id("nav-runs").click()
        row(page, "high-lr").locator(".cell-name").click()
        expect(page.get_by_test_id("inspector-name")).to_have_text("high-lr")
        section = page.get_by_test_id("inspector-telemetry")
        expect(section.get_by_test_id("telemetry-status")).to_contain_text("telemetry database is damaged")
        expect(page.get_by_test_id("inspector-metrics")).to_be_visible()  # the rest of the inspector is fine
        shot(page, "inspector-telemetry-corrupt")
        section.get_by_test_id("telemetry-open-performance").click()
        perf = page.locator("[data-testid=perf-run][data-name=high-lr]")
        expect(perf.get_by_test_id("telemetry-log")).to_have_text("RuntimeError: boom")  # read without the database
        expect(perf.get_by_test_id("perf-area")).to_have_count(0)
        page.get_by_test_id("nav-runs").click()

        row(page, "small-model").locator(".cell-name").click()  # never captured: no Telemetry section
        expect(page.get_by_test_id("inspector-name")).to_have_text("small-model")
        expect(page.get_by_test_id("inspector-params")).to_be_visible()
        expect(page.get_by_test_id("inspector-telemetry")).to_have_count(0)
        s.assert_clean()


def test_the_ranks_stat_says_which_ranks_in_words(browser: Browser, tmp_path: Path) -> None:
    """Issue 14: the Telemetry section's "ranks" stat showed a bare "1", which reads as rank 1."""
    from tests.diagnose.telemetry_db import RunSpec, write_run
    from traceml_ai.diagnose import write_final_summary

    root = tmp_path / "traceml" / "runs"
    generate(root, runs=4, seed=0)
    one, two = next(root.glob("*_baseline_*")), next(root.glob("*_high-lr_*"))
    write_run(one, RunSpec(steps=60))
    write_run(two, RunSpec(ranks=2, steps=60))
    for run in (one, two):
        write_final_summary(run)
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        for name, said in (("baseline", "1 rank (rank 0)"), ("high-lr", "ranks 0–1 of 2")):
            row(page, name).locator(".cell-name").click()
            expect(page.get_by_test_id("inspector-name")).to_have_text(name)
            stat = page.get_by_test_id("inspector-telemetry").get_by_test_id("telemetry-stat-ranks")
            expect(stat.locator(".telem-stat-v")).to_have_text(said)
        s.assert_clean()


# -- an empty runs folder ------------------------------------------------------------------------


def test_an_empty_folder_says_how_to_get_runs_not_to_clear_filters(browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    root.mkdir(parents=True)
    with serve(root) as empty, open_viewer(browser, empty) as s:
        placeholder = s.page.get_by_test_id("table-empty")
        expect(placeholder).to_contain_text("No runs in this folder yet")
        expect(placeholder).to_contain_text("traceml run")
        expect(placeholder).not_to_contain_text("filters")
        s.assert_clean()


def test_no_match_says_to_clear_the_filters(browser: Browser, viewer: Viewer) -> None:
    with open_viewer(browser, viewer) as s:
        s.page.get_by_test_id("search").fill("no-run-is-named-like-this")
        placeholder = s.page.get_by_test_id("table-empty")
        expect(placeholder).to_contain_text("No runs match")
        expect(placeholder).to_contain_text("Clear the search, the filters")
        s.assert_clean()
