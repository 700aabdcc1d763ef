"""Fresh-user review of the Performance view's telemetry axes and run colours, in a real browser:
a plateau at the top of a chart (RSS at ~480 MiB, a GPU at 92 %, host CPU at 53 %) had no tick at
or above it (the highest read 384 MiB, 75 %, 40 %), the host chart had no ``0s`` at its origin, and
two of 4 runs shown together were drawn in the same colour.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.diagnose.telemetry_db import MIB, RunSpec
from tests.ui.test_browser import CHROMIUM, Viewer, expect, open_viewer, row, serve
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from tests.ui.test_browser_perf_gpu import BYTE_UNITS, _run, card, perf_view, ticks
from traceml_ai.telemetry import schema

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="the browser tests need /usr/bin/chromium")

NAMES = ["plateau", "second", "third", "fourth"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    root = tmp_path_factory.mktemp("perfaxes") / "traceml" / "runs"
    _run(root, 0, "plateau", RunSpec(steps=60, gpu=True, interval_s=0.5, gpu_util=lambda t: 92.0,
                                     host_cpu=lambda t: 53.0, rss=lambda r, t: 480 * MIB))
    for i, name in enumerate(NAMES[1:], start=1):
        _run(root, i, name, RunSpec(steps=30, interval_s=0.5, seed=i))
    # the host's first sample 3 s after the run's first step: its chart starts at 0 s all the same
    late = _run(root, 4, "latehost", RunSpec(steps=60, interval_s=0.5))
    with sqlite3.connect(late / "aggregator" / "telemetry.sqlite") as conn:
        conn.execute(f"UPDATE {schema.SYSTEM_SAMPLES.name} SET timestamp_unix_ns = timestamp_unix_ns + 3000000000")
    with serve(root) as v:
        yield v


def bytes_of(label: str) -> float:
    return 0.0 if label == "0" else float(label.split(" ")[0]) * BYTE_UNITS[label.split(" ")[1]]


def test_each_y_axis_ends_on_a_tick_at_or_above_its_plateau(browser: Browser, workspace: Viewer) -> None:
    with open_viewer(browser, workspace) as s:
        run = perf_view(s.page, "plateau")
        rss = ticks(card(run, "telemetry-rss"), "y")
        assert max(bytes_of(t) for t in rss) >= 480 * MIB, rss  # 512 MiB, not 384 MiB
        for testid, top in (("telemetry-gpu", 92.0), ("telemetry-host", 53.0)):
            labels = ticks(card(run, testid), "y")
            assert all(t.endswith("%") for t in labels), labels
            assert max(float(t[:-1]) for t in labels) >= top, (testid, labels)
        s.assert_clean()


def test_a_host_chart_whose_samples_start_late_still_labels_0s_at_its_origin(browser: Browser,
                                                                            workspace: Viewer) -> None:
    with open_viewer(browser, workspace) as s:
        run = perf_view(s.page, "latehost")
        labels = ticks(card(run, "telemetry-host"), "x")
        assert labels[0] in ("0", "0s"), labels
        assert ticks(card(run, "telemetry-rss"), "x")[0] in ("0", "0s")
        s.assert_clean()


def test_four_runs_shown_together_have_four_colours(browser: Browser, workspace: Viewer) -> None:
    """A run selected again after others took its colour is given a free one."""
    with open_viewer(browser, workspace) as s:
        page = s.page

        def check(name: str) -> Locator:
            return row(page, name).get_by_test_id("row-check")

        check("plateau").check()
        check("second").check()
        check("plateau").uncheck()
        check("third").check()  # took plateau's colour while it was not selected
        check("fourth").check()
        check("plateau").check()
        expect(page.get_by_test_id("selection-count")).to_have_text("4")
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-run")).to_have_count(4)
        legend = page.get_by_test_id("perf-pairs").locator(".legend-item")
        expect(legend).to_have_count(4)
        swatches = legend.locator(".swatch")
        expect(swatches).to_have_count(4)
        # (read once the view has settled: an element it replaced mid-read has no computed style)
        read = "els => els.map(e => e.isConnected ? getComputedStyle(e).backgroundColor : '')"
        colours: list[str] = swatches.evaluate_all(read)
        for _ in range(50):
            if all(colours):
                break
            page.wait_for_timeout(100)
            colours = swatches.evaluate_all(read)
        assert all(colours) and len(set(colours)) == 4, colours
        s.assert_clean()
