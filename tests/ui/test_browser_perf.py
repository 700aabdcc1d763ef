"""The performance columns and the Performance view in a real browser (issue 13 items 1-4 and 6):
real runs captured by ``traceml run`` on the digits example (1 rank healthy, 1 rank with the planted
input stall, 2 ranks with the planted straggler) beside runs that were not captured, and a captured
run that is still training while the page is open, in Debian's chromium.

The captures are made once for the module (each takes tens of seconds on a busy machine).
Screenshots land in ``test-artifacts/screens/perf-*.png``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import run_traceml
from tests.diagnose.telemetry_db import RunSpec, write_run
from tests.ui.test_browser import (
    WAIT_MS,
    expect,
    open_viewer,
    painted_pixels,
    png_phys,
    row,
    select_runs,
    serve,
    shot,
)
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from traceml_ai.diagnose import write_final_summary
from traceml_ai.examples import TRAIN_DIGITS
from traceml_ai.runs.fake import generate, live_run
from traceml_ai.runs.writer import atomic_write, dump_json

pytest.importorskip("torch")
pytest.importorskip("sklearn")

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.ui.test_browser import Viewer

CAPTURES = (("steady", "none", 1), ("stall", "input_stall", 1), ("lagging", "straggler", 2))


@pytest.fixture(scope="module")
def perf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs root with the three captured runs and three fake runs without telemetry."""
    work = tmp_path_factory.mktemp("perf")
    root = work / "traceml" / "runs"
    for name, plant, nproc in CAPTURES:
        done = run_traceml("run", "--mode", "quiet", "--name", name, "--logs-dir", str(root),
                           "--nproc-per-node", str(nproc), str(TRAIN_DIGITS), "--epochs", "1", "--plant", plant,
                           cwd=work, timeout=400)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    generate(root, runs=3, seed=3)
    return root


def run_dir(root: Path, name: str) -> Path:
    (found,) = [p for p in root.iterdir() if f"_{name}_" in p.name]
    return found


def summary_json(root: Path, name: str) -> dict[str, Any]:
    """What ``traceml summary RUN --json`` prints for the run."""
    done = run_traceml("summary", str(run_dir(root, name)), "--json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def phase_share(doc: dict[str, Any], phase: str) -> float:
    return float(next(p["share"] for p in doc["step_time"]["phases"] if p["name"] == phase))


@pytest.fixture(scope="module")
def viewer(perf_root: Path) -> Iterator[Viewer]:
    with serve(perf_root) as v:
        yield v


def cell(page: Page, name: str, column: str) -> Any:
    return row(page, name).locator(f".tabulator-cell[tabulator-field='{column}']")


def test_sorting_by_input_share_puts_the_input_stall_run_first(browser: Browser, viewer: Viewer,
                                                               perf_root: Path) -> None:
    stall = summary_json(perf_root, "stall")
    assert stall["findings"][0]["kind"] == "input_bound"
    with open_viewer(browser, viewer) as s:
        page = s.page
        # The defaults show the verdict, the median step time and the input share of captured runs.
        header = page.locator(".col-title[data-column='perf.share.dataloader']")
        expect(header).to_be_visible()
        expect(page.locator(".col-title[data-column='perf.verdict']")).to_be_visible()
        header.locator(".col-name").click()
        expect(header.locator(".col-sort")).to_have_text("↑")
        header.locator(".col-name").click()
        expect(header.locator(".col-sort")).to_have_text("↓")
        keys = viewer.table(sort="-perf.share.dataloader")["keys"]
        assert keys[0] == viewer.key_of("stall")
        page.wait_for_function(
            "(k) => document.querySelector('[data-testid=run-row]')?.dataset.key === k", arg=keys[0])
        first = page.get_by_test_id("run-row").first
        expect(first.locator(".cell-name")).to_have_text("stall")

        # The numbers in the page are those of `traceml summary --json`.
        share = cell(page, "stall", "perf.share.dataloader")
        expect(share).to_have_text(f"{phase_share(stall, 'traceml:dataloader_next') * 100:.1f}%")
        assert float(share.get_attribute("title") or "nan") == phase_share(stall, "traceml:dataloader_next")
        p50 = cell(page, "stall", "perf.step_ms.p50")
        assert float(p50.get_attribute("title") or "nan") == stall["step_time"]["iteration_median_ms"]
        expect(cell(page, "stall", "perf.verdict")).to_have_text("input_bound")

        # Captured runs carry the badge; runs without telemetry show – in every perf cell.
        expect(page.get_by_test_id("perf-badge")).to_have_count(3)
        badge = row(page, "stall").get_by_test_id("perf-badge")
        expect(badge).to_have_attribute("data-verdict", "input_bound")
        expect(badge).to_have_attribute("data-severity", stall["findings"][0]["severity"])
        fake = next(r["name"] for r in viewer.api("/api/runs")["runs"] if not r["perf"])
        expect(cell(page, fake, "perf.verdict")).to_have_text("–")
        expect(row(page, fake).get_by_test_id("perf-badge")).to_have_count(0)
        shot(page, "perf-table-sorted-by-input-share")

        # The same language filters the perf columns.
        page.locator("[data-testid=column-filter][data-column='perf.share.dataloader']").click()
        popover = page.get_by_test_id("filter-popover")
        popover.get_by_test_id("filter-input").fill(">0.5")
        popover.get_by_test_id("filter-apply").click()
        expect(page.get_by_test_id("table-info")).to_have_text("1 of 6 runs")
        expect(page.get_by_test_id("run-row").first.locator(".cell-name")).to_have_text("stall")
        s.assert_clean()


def test_the_straggler_appears_as_such_in_the_table_the_chooser_and_runs_ls(browser: Browser, viewer: Viewer,
                                                                              perf_root: Path) -> None:
    lagging = summary_json(perf_root, "lagging")
    named = sorted({r for f in lagging["findings"] if f["kind"] == "straggler" for r in f["evidence"]["ranks"]})
    assert lagging["findings"][0]["kind"] == "straggler" and named
    with open_viewer(browser, viewer) as s:
        page = s.page
        expect(cell(page, "lagging", "perf.verdict")).to_have_text("straggler")
        expect(row(page, "lagging").get_by_test_id("perf-badge")).to_have_attribute("data-verdict", "straggler")
        # The column chooser lists the perf columns under their own kind; add the straggler and skew.
        page.get_by_test_id("column-chooser").click()
        chooser = page.get_by_test_id("column-popover")
        expect(chooser).to_contain_text("Performance (telemetry)")
        for column in ("perf.straggler", "perf.skew_pct", "perf.worst_rank"):
            option = chooser.locator(f"[data-testid=column-option][data-column='{column}']")
            option.check()
        page.keyboard.press("Escape")
        expect(cell(page, "lagging", "perf.straggler")).to_have_text(";".join(map(str, named)))
        expect(cell(page, "lagging", "perf.worst_rank")).to_have_text(str(lagging["step_time"]["worst_rank"]))
        assert str(lagging["step_time"]["worst_rank"]) in [str(r) for r in named]  # one measure: the straggler
        skew = cell(page, "lagging", "perf.skew_pct")
        assert float(skew.get_attribute("title") or "nan") == pytest.approx(lagging["step_time"]["skew"] * 100)
        expect(cell(page, "steady", "perf.straggler")).to_have_text("–")
        cell(page, "lagging", "perf.worst_rank").scroll_into_view_if_needed()
        shot(page, "perf-table-straggler")
        s.assert_clean()
    # The command line lists the same columns.
    done = run_traceml("runs", "ls", str(perf_root), "--json", "--sort", "-perf.skew_pct",
                       "--columns", "perf.verdict,perf.straggler,perf.skew_pct")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout.splitlines()[0])
    assert first["name"] == "lagging"
    assert first["values"]["perf.verdict"] == "straggler"
    assert first["values"]["perf.straggler"] == ";".join(map(str, named))


def test_compare_charts_and_csv_carry_the_perf_columns(browser: Browser, viewer: Viewer, perf_root: Path) -> None:
    steady, stall = summary_json(perf_root, "steady"), summary_json(perf_root, "stall")
    with open_viewer(browser, viewer) as s:
        page = s.page
        # compare: a Performance section, the differing rows marked
        select_runs(page, "steady", "stall")
        page.get_by_test_id("selection-compare").click()
        table = page.get_by_test_id("compare-table")
        expect(table).to_contain_text("Performance")
        rows = page.get_by_test_id("compare-row")
        share = rows.filter(has=page.locator("td.compare-key", has_text=re.compile(r"^input share$")))
        expect(share).to_have_attribute("data-diff", "1")
        expect(share).to_contain_text(f"{phase_share(stall, 'traceml:dataloader_next') * 100:.1f}%")
        expect(share).to_contain_text(f"{phase_share(steady, 'traceml:dataloader_next') * 100:.1f}%")
        telemetry = rows.filter(has=page.locator("td.compare-key", has_text=re.compile(r"^telemetry$")))
        expect(telemetry).to_have_attribute("data-diff", "0" if steady["telemetry"]["status"] ==
                                            stall["telemetry"]["status"] else "1")
        shot(page, "perf-compare")

        # a scatter of step time against batch size: one point per captured run
        page.get_by_test_id("nav-charts").click()
        page.get_by_test_id("chart-kind-scatter").click()
        page.get_by_test_id("scatter-x").select_option("config.batch_size")
        page.get_by_test_id("scatter-y").select_option("perf.step_ms.p50")
        expect(page.get_by_test_id("scatter-point")).to_have_count(2)  # the selection: steady and stall
        shot(page, "perf-scatter")
        s.assert_clean()
    # the table export has the perf columns, the numbers unrounded
    keys = viewer.table(sort="-perf.step_ms.p50")["keys"]
    exported = viewer.api("/api/export/table", {"keys": keys, "columns": ["perf.verdict", "perf.step_ms.p50"]})
    text = Path(exported["path"]).read_text(encoding="utf-8")
    rows_out = {r["name"]: r for r in csv.DictReader(io.StringIO(text))}
    assert rows_out["stall"]["perf.verdict"] == "input_bound"
    assert float(rows_out["stall"]["perf.step_ms.p50"]) == stall["step_time"]["iteration_median_ms"]
    assert float(rows_out["steady"]["perf.step_ms.p50"]) == steady["step_time"]["iteration_median_ms"]


def test_the_performance_view_of_two_runs_shows_which_phase_changed(browser: Browser, viewer: Viewer,
                                                                   perf_root: Path) -> None:
    steady, stall, lagging = (summary_json(perf_root, n) for n in ("steady", "stall", "lagging"))
    with open_viewer(browser, viewer) as s:
        page = s.page
        # From the inspector of one run: its Performance view alone.
        row(page, "lagging").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        runs = page.get_by_test_id("perf-run")
        expect(runs).to_have_count(1)
        lag = runs.first
        expect(lag).to_have_attribute("data-name", "lagging")
        # diagnoses first, as traceml summary --json has them
        findings = lag.get_by_test_id("finding")
        expect(findings).to_have_count(len(lagging["findings"]))
        expect(findings.first.get_by_test_id("finding-summary")).to_have_text(lagging["findings"][0]["summary"])
        # the ranks x steps heatmap: both ranks, the straggler marked as such
        named = {str(r) for f in lagging["findings"] if f["kind"] == "straggler" for r in f["evidence"]["ranks"]}
        heat = lag.get_by_test_id("perf-heatmap")
        expect(heat.get_by_test_id("heat-row")).to_have_count(2)
        for rank in named:
            straggler_row = heat.locator(f"[data-testid=heat-row][data-rank='{rank}']")
            expect(straggler_row).to_have_attribute("data-straggler", "1")
            expect(straggler_row).to_contain_text("straggler")
        # the phase breakdown: a stacked area per phase, the warm-up shaded, ms or share
        area = lag.get_by_test_id("perf-area")
        expect(area).to_have_attribute("data-mode", "ms")
        # one rank at every step: the slowest by the straggler measure, the summary's worst_rank
        expect(area).to_have_attribute("data-rank", str(lagging["step_time"]["worst_rank"]))
        expect(area).to_have_attribute("data-rank-basis", "straggler measure")
        perf = viewer.api(f"/api/runs/{urllib.parse.quote(viewer.key_of('lagging'), safe='')}/performance")
        b = perf["breakdown"]
        if area.get_attribute("data-window") == "1":  # no smoothing: the top tick is above the tallest step
            top = max(sum(v or 0 for v in step) for step in zip(*(x["y"] for x in b["series"]), strict=True))
            shown_top = float(area.get_attribute("data-top") or "nan")
            ticks = [float(t.removesuffix(" ms")) for t in lag.get_by_test_id("perf-area-ytick").all_text_contents()]
            assert shown_top >= top and shown_top == pytest.approx(ticks[-1]) and shown_top - top < ticks[1] - ticks[0]
        # the breakdown's steps are that rank's: its median after warm-up is traceml summary's per-rank median
        after = [v for x, v in zip(b["x"], b["iteration"], strict=True)
                 if v is not None and x >= b["x"][0] + perf["heatmap"]["warmup_steps"]]
        assert b["bucket_steps"] == 1 and b["rank"] == lagging["step_time"]["worst_rank"]
        shown = next(r for r in lagging["step_time"]["per_rank"] if r["rank"] == b["rank"])
        assert statistics.median(after) == pytest.approx(shown["median_ms"], rel=1e-4)
        assert lag.get_by_test_id("perf-area-phase").count() >= 4
        expect(lag.get_by_test_id("perf-warmup")).to_have_count(1)
        # a CPU run: the panels without data say why
        expect(lag.get_by_test_id("perf-missing")).to_contain_text("no GPU on this host")
        heat.scroll_into_view_if_needed()
        shot(page, "perf-view-straggler")
        lag.get_by_test_id("perf-mode-share").click()
        expect(lag.get_by_test_id("perf-area")).to_have_attribute("data-mode", "share")

        # Two selected runs: their phase shares as paired bars, with the difference.
        page.get_by_test_id("nav-runs").click()
        select_runs(page, "steady", "stall")
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-run")).to_have_count(2)
        pairs = page.get_by_test_id("perf-pairs")
        expect(pairs).to_be_visible()
        share_stall = phase_share(stall, "traceml:dataloader_next")
        share_steady = phase_share(steady, "traceml:dataloader_next")
        bar = pairs.locator("[data-testid=perf-pair-bar][data-phase=dataloader][data-run=stall]")
        assert float(bar.get_attribute("data-share") or "nan") == share_stall
        expect(bar.get_by_test_id("perf-pair-diff")).to_have_text(f"+{(share_stall - share_steady) * 100:.1f} pp")
        # A CPU run has no h2d phase: its "–" says why (issue 13 review).
        h2d = pairs.locator("[data-testid=perf-pair-bar][data-phase=h2d][data-run=stall]")
        expect(h2d.get_by_test_id("perf-pair-missing")).to_have_text("–")
        expect(h2d.locator(":scope > title")).to_have_text(
            "not measured: no CUDA device (h2d is the time of host-to-GPU copies)")
        stall_section = page.locator("[data-testid=perf-run][data-name=stall]")
        expect(stall_section.get_by_test_id("perf-fact-verdict")).to_have_text("input_bound")
        shot(page, "perf-view-two-runs")
        s.assert_clean()


def copies_of(original: Path, tmp_path: Path, tails: list[str]) -> Path:
    """A new runs root holding copies of the run folder ``original``, one per id tail (the same
    name, different ids, as two runs of one script are); returns the root."""
    import shutil

    root = tmp_path / "traceml" / "runs"
    base = original.name.rsplit("_", 1)[0]
    for tail in tails:
        shutil.copytree(original, root / f"{base}_{tail}")
    return root


def tick(page: Page, n: int, *, of: int) -> Any:
    """Tick the first ``n`` of the table's ``of`` rows; returns the row checkboxes."""
    checks = page.get_by_test_id("row-check")
    expect(checks).to_have_count(of)
    for i in range(n):
        checks.nth(i).check()
    return checks


def test_two_runs_sharing_a_name_are_told_apart_in_the_performance_view(browser: Browser, perf_root: Path,
                                                                        tmp_path: Path) -> None:
    """Review 13c: two runs named alike were indistinguishable in the paired bars' legend and the
    verdict table ("stall against stall"); like Compare, each gets its short id (``stall · 0a1b``)."""
    root = copies_of(run_dir(perf_root, "stall"), tmp_path, ["0a1b", "9f8e"])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        tick(page, 2, of=2)
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-run")).to_have_count(2)
        legend = page.get_by_test_id("perf-pairs").get_by_test_id("perf-legend-label")
        expect(legend).to_have_count(2)
        assert sorted(legend.all_text_contents()) == ["stall · 0a1b", "stall · 9f8e"]
        head = page.get_by_test_id("perf-verdicts").get_by_test_id("perf-verdict-head")
        expect(head).to_have_text(re.compile(r"^stall · (0a1b|9f8e) against stall · (0a1b|9f8e)$"))
        first, second = head.text_content().split(" against ")  # type: ignore[union-attr]
        assert first != second
        s.assert_clean()


def test_more_selected_runs_than_the_view_compares_are_said_not_dropped_silently(
        browser: Browser, perf_root: Path, tmp_path: Path) -> None:
    """Review 13d: 14 captured runs selected, 4 drawn, no word."""
    root = copies_of(run_dir(perf_root, "steady"), tmp_path, [f"{i:04x}" for i in range(6)])
    with serve(root) as v, open_viewer(browser, v) as s:
        page = s.page
        checks = tick(page, 5, of=6)
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-run")).to_have_count(4)
        expect(page.get_by_test_id("perf-runs-capped")).to_contain_text("Showing 4 of the 5 selected captured runs")
        page.get_by_test_id("nav-runs").click()
        checks.nth(5).check()  # one more: the note follows
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-runs-capped")).to_contain_text("Showing 4 of the 6 selected")
        s.assert_clean()


def test_selected_runs_without_telemetry_are_named_not_dropped_silently(browser: Browser, viewer: Viewer) -> None:
    """Review 13h: a selected run that has no telemetry (not captured by traceml run) vanished from
    the Performance view without a word; alone, it got the generic "Select captured runs" hint."""
    with open_viewer(browser, viewer) as s:
        page = s.page
        plain = [r for r in viewer.api("/api/runs")["runs"] if not r.get("perf")]
        name = plain[0]["name"]
        row(page, "steady").get_by_test_id("row-check").check()
        row(page, name).get_by_test_id("row-check").check()
        page.get_by_test_id("nav-performance").click()
        expect(page.get_by_test_id("perf-run")).to_have_count(1)
        expect(page.get_by_test_id("perf-runs-left-out")).to_have_text(
            f"Left out of this view: {name} (not captured by traceml run).")
        page.get_by_test_id("nav-runs").click()
        row(page, "steady").get_by_test_id("row-check").uncheck()
        page.get_by_test_id("nav-performance").click()
        empty = page.get_by_test_id("performance-empty")
        expect(empty).to_contain_text(f"{name} has no telemetry to show")
        expect(empty).to_contain_text(f"Left out: {name} (not captured by traceml run)")
        expect(empty).not_to_contain_text("Select captured runs")
        s.assert_clean()


def test_the_phase_charts_scale_is_kept_in_the_address(browser: Browser, viewer: Viewer) -> None:
    """Review 13h: the ms / Share choice was lost on a reload (the zoom was kept)."""
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "stall").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        area = page.locator("[data-testid=perf-run][data-name=stall] [data-testid=perf-area]")
        expect(area).to_have_attribute("data-mode", "ms")
        page.get_by_test_id("perf-mode-share").click()
        expect(area).to_have_attribute("data-mode", "share")
        expect(area.get_by_test_id("perf-warmup")).to_be_visible()  # over the areas, not hidden under them
        area.scroll_into_view_if_needed()
        shot(page, "perf-share-mode")
        page.wait_for_function("() => location.hash.includes('pm=share')")
        # a reload opens the remembered view (saved a moment after each change: wait for it)
        deadline = time.monotonic() + WAIT_MS / 1000
        while viewer.api("/api/ui-state").get("perfMode") != "share":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        page.reload()
        expect(page.locator("[data-testid=perf-run][data-name=stall] [data-testid=perf-area]")).to_have_attribute(
            "data-mode", "share")
        page.get_by_test_id("perf-mode-ms").click()
        page.wait_for_function("() => !location.hash.includes('pm=')")
        other = page.context.new_page()  # a link with pm=share opens the chart in shares
        other.goto(page.url.replace("#", "#pm=share&", 1))
        expect(other.locator("[data-testid=perf-run][data-name=stall] [data-testid=perf-area]")).to_have_attribute(
            "data-mode", "share")
        other.close()
        s.assert_clean()


def median_shown(heat_row: Any) -> float:
    """The median a heatmap row shows on its right (ms)."""
    return float(heat_row.get_by_test_id("heat-median").get_attribute("data-value") or "nan")


def test_the_heatmap_tells_the_ddp_straggler_by_its_work_outside_backward(browser: Browser, viewer: Viewer,
                                                                          perf_root: Path) -> None:
    lagging = summary_json(perf_root, "lagging")
    named = {str(r) for f in lagging["findings"] if f["kind"] == "straggler" for r in f["evidence"]["ranks"]}
    per_rank = {str(r["rank"]): r for r in lagging["step_time"]["per_rank"]}
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "lagging").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        heat = page.get_by_test_id("perf-heatmap")
        # A straggler is named: the heatmap shows the work outside backward first, where under DDP the
        # straggler stands out (its iteration is like the others', the fast ranks wait in backward).
        expect(heat.get_by_test_id("heat-svg")).to_have_attribute("data-mode", "local")
        medians = {r.get_attribute("data-rank"): median_shown(r) for r in heat.get_by_test_id("heat-row").all()}
        for rank, value in medians.items():
            assert value == pytest.approx(per_rank[str(rank)]["outside_backward_median_ms"], rel=1e-3)
        (straggler,) = named
        assert medians[straggler] == max(medians.values())
        # printed as every other step time on the page is (review 13h: "106.62 ms" here, "107 ms" there)
        for text in heat.get_by_test_id("heat-median").all_text_contents():
            assert re.fullmatch(r"(\d{3,}|\d{2}\.\d|\d\.\d\d) ms", text), text
        # the step axis runs from the run's first measured step to its last
        answer = viewer.api(f"/api/runs/{urllib.parse.quote(viewer.key_of('lagging'), safe='')}/performance")["heatmap"]
        expect(heat.get_by_test_id("heat-first-label")).to_have_text(f"step {answer['first_step']}")
        expect(heat.get_by_test_id("heat-last-label")).to_have_text(f"step {answer['last_step']}")
        # The cells are painted in one canvas, not one element each; the straggler's row is the
        # reddest (blue is the fastest bucket, red the slowest).
        cells = heat.get_by_test_id("heat-cells")
        expect(cells).to_be_visible()
        assert cells.get_attribute("data-rows") == str(len(medians))
        assert painted_pixels(cells) > 0
        expect(heat.locator("[data-testid=heat-svg] rect")).to_have_count(0)
        redness = cells.evaluate(
            """(c) => { const ctx = c.getContext('2d'); const rows = Number(c.dataset.rows);
                const h = c.height / rows; const out = [];
                for (let i = 0; i < rows; i++) {
                  const d = ctx.getImageData(0, Math.floor(i * h + h / 2), c.width, 1).data;
                  let red = 0; for (let k = 0; k < d.length; k += 4) red += d[k] - d[k + 2];
                  out.push(red);
                }
                return out; }""")
        order = [r.get_attribute("data-rank") for r in heat.get_by_test_id("heat-row").all()]
        assert order[redness.index(max(redness))] == straggler
        # The iteration view has traceml summary's per-rank medians.
        heat.get_by_test_id("perf-heat-iteration").click()
        expect(heat.get_by_test_id("heat-svg")).to_have_attribute("data-mode", "iteration")
        for r in heat.get_by_test_id("heat-row").all():
            assert median_shown(r) == pytest.approx(per_rank[str(r.get_attribute("data-rank"))]["median_ms"], rel=1e-3)
        # The table formats the step time in ms.
        page.get_by_test_id("nav-runs").click()
        p50 = cell(page, "lagging", "perf.step_ms.p50")
        expect(p50).to_have_text(re.compile(r"^\d+(\.\d{1,2})? ms$"))
        s.assert_clean()


def test_every_performance_panel_exports_csv_and_a_300_dpi_png(browser: Browser, viewer: Viewer,
                                                               perf_root: Path) -> None:
    lagging = summary_json(perf_root, "lagging")
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "lagging").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        lag = page.get_by_test_id("perf-run").first
        expect(lag.get_by_test_id("perf-heatmap").get_by_test_id("heat-svg")).to_be_visible()
        written: dict[tuple[str, str], Path] = {}
        for panel in ("step", "ranks", "memory", "gpu"):
            for fmt in ("csv", "png"):
                before = page.get_by_test_id("export-path").all_inner_texts()
                lag.get_by_test_id(f"perf-export-{fmt}-{panel}").click()
                path_el = page.get_by_test_id("export-path")
                expect(path_el).to_have_text(re.compile(rf"plot-lagging-telemetry-{panel}-.*\.{fmt}$"))
                assert path_el.all_inner_texts() != before
                path = Path(path_el.inner_text())
                assert path.parent == viewer.cache / "plots" and path.is_file()
                written[(panel, fmt)] = path
        shot(page, "perf-view-exported")
        s.assert_clean()
    for panel in ("step", "ranks", "memory", "gpu"):
        data = written[(panel, "png")].read_bytes()
        assert png_phys(data) == (11811, 11811, 1)  # 300 DPI
    # The step CSV is the page's rank step by step (the slowest by the straggler measure): one row per
    # step it ran, its median after warm-up the summary's per-rank median of that rank.
    rows = list(csv.DictReader(io.StringIO(written[("step", "csv")].read_text(encoding="utf-8"))))
    worst = lagging["step_time"]["worst_rank"]
    assert len(rows) == lagging["steps"]["seen"] and {r["rank"] for r in rows} == {str(worst)}
    assert {"step", "rank", "iteration_ms", "dataloader_next_ms", "forward_ms", "backward_ms"} <= set(rows[0])
    warm = int(rows[0]["step"]) + viewer.api(
        f"/api/runs/{urllib.parse.quote(viewer.key_of('lagging'), safe='')}/performance")["heatmap"]["warmup_steps"]
    after = [float(r["iteration_ms"]) for r in rows if int(r["step"]) >= warm and r["iteration_ms"]]
    shown = next(r for r in lagging["step_time"]["per_rank"] if r["rank"] == worst)
    assert statistics.median(after) == pytest.approx(shown["median_ms"], rel=1e-4)
    # The ranks CSV: a column per rank, the summary's per-rank medians after warm-up.
    ranks = list(csv.DictReader(io.StringIO(written[("ranks", "csv")].read_text(encoding="utf-8"))))
    for r in lagging["step_time"]["per_rank"]:
        column = f"rank_{r['rank']}_ms"
        values = [float(x[column]) for x in ranks if int(x["step"]) >= warm and x[column]]
        assert statistics.median(values) == pytest.approx(r["median_ms"], rel=1e-4)
    # A CPU run: the GPU CSV has host rows and no GPU rows.
    gpu = list(csv.DictReader(io.StringIO(written[("gpu", "csv")].read_text(encoding="utf-8"))))
    assert gpu and {g["series"] for g in gpu} <= {"CPU", "RAM"}


def test_two_runs_side_by_side_show_traceml_compares_verdict_per_metric(browser: Browser, viewer: Viewer,
                                                                        perf_root: Path) -> None:
    done = run_traceml("compare", str(run_dir(perf_root, "steady")), str(run_dir(perf_root, "stall")), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    verdicts = {m["metric"]: m["verdict"] for m in doc["metrics"]}
    why = [m["reason"] for m in doc["metrics"] if m["metric"] == "dataloader_next_ms"]
    assert verdicts["dataloader_next_ms"] == "regression", (why, doc["problems"])
    with open_viewer(browser, viewer) as s:
        page = s.page
        select_runs(page, "steady", "stall")
        page.get_by_test_id("nav-performance").click()
        table = page.get_by_test_id("perf-verdicts")
        expect(table.get_by_test_id("perf-verdict-row")).to_have_count(len(verdicts))
        for metric, verdict in verdicts.items():
            expect(table.locator(f"[data-testid=perf-verdict-row][data-metric='{metric}']")).to_have_attribute(
                "data-verdict", verdict)
        expect(table.locator("[data-testid=perf-verdict-row][data-metric=dataloader_next_ms]")
               .get_by_test_id("perf-verdict")).to_have_text("regression")
        expect(table.get_by_test_id("perf-verdicts-provisional")).to_have_count(0)  # both runs finished
        table.scroll_into_view_if_needed()
        shot(page, "perf-view-verdicts")
        s.assert_clean()


# -- live: a captured run that trains while the page is open -----------------------------------------

LIVE_SCRIPT = """
import os, sys, time, torch, traceml_ai
stop = sys.argv[1]
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(100000):
    with traceml_ai.trace_step(model):
        loss = model(torch.randn(32, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    time.sleep(0.02)
    if i >= 40 and os.path.exists(stop):
        break
print("stopped at step", i, flush=True)
"""


@pytest.mark.timeout(600)
def test_a_live_captured_run_updates_its_performance_view_by_push_and_keeps_the_zoom(
        browser: Browser, tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    root.mkdir(parents=True)
    generate(root, runs=2, seed=1)
    script, stop = tmp_path / "train_live.py", tmp_path / "stop"
    script.write_text(LIVE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--name", "live-perf",
         "--logs-dir", str(root), str(script), str(stop)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v, open_viewer(browser, v) as s:
            page = s.page
            page.evaluate("window.__notReloaded = true")
            expect(row(page, "live-perf").get_by_test_id("status-badge")).to_have_text("running", timeout=120_000)
            row(page, "live-perf").locator(".cell-name").click()
            page.get_by_test_id("inspector-performance").click()
            run = page.locator("[data-testid=perf-run][data-name=live-perf]")
            expect(run.get_by_test_id("perf-live")).to_be_visible(timeout=WAIT_MS)
            # provisional diagnoses: no final summary yet, the rules judge the rows written so far
            expect(run.get_by_test_id("perf-fact-verdict")).to_contain_text("(provisional)")
            expect(run.get_by_test_id("telemetry-diagnoses")).to_contain_text("provisional")
            # pushed updates: the breakdown and the heatmap grow without a reload
            area = run.get_by_test_id("perf-area")
            expect(area).to_be_visible(timeout=WAIT_MS)
            first = int(area.get_attribute("data-last-step") or "0")
            page.wait_for_function(
                "(n) => { const a = document.querySelector('[data-name=live-perf] [data-testid=perf-area]');"
                " return !!a && Number(a.dataset.lastStep) > n; }", arg=first, timeout=60_000)
            heat = run.get_by_test_id("heat-svg")
            expect(heat).to_have_attribute("data-last-step", re.compile(r"^\d+$"))
            # zoom the phase breakdown (drag across it): live redraws keep the zoomed range
            area.scroll_into_view_if_needed()
            box = run.get_by_test_id("perf-area-over").bounding_box()
            assert box is not None
            y = box["y"] + box["height"] / 2
            page.mouse.move(box["x"] + box["width"] * 0.25, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=12)
            page.mouse.up()
            expect(area).to_have_attribute("data-zoomed", "1", timeout=WAIT_MS)
            zoomed = (area.get_attribute("data-x0"), area.get_attribute("data-x1"))
            assert zoomed[0] is not None and zoomed[1] is not None and float(zoomed[0]) < float(zoomed[1])
            expect(run.get_by_test_id("perf-breakdown")).to_contain_text("double-click for every step")
            for _ in range(2):  # two pushed updates later the chart is redrawn, still zoomed to the same steps
                grown = int(area.get_attribute("data-last-step") or "0")
                page.wait_for_function(
                    "(n) => { const a = document.querySelector('[data-name=live-perf] [data-testid=perf-area]');"
                    " return !!a && Number(a.dataset.lastStep) > n; }", arg=grown, timeout=60_000)
                expect(area).to_have_attribute("data-zoomed", "1")
                assert (area.get_attribute("data-x0"), area.get_attribute("data-x1")) == zoomed
            shot(page, "perf-view-live")
            # the run ends: the final summary replaces the provisional diagnoses, still without a reload
            stop.write_text("")
            assert proc.wait(timeout=240) == 0, proc.stderr.read() if proc.stderr else ""
            expect(run.get_by_test_id("perf-live")).to_be_hidden(timeout=60_000)
            expect(run.get_by_test_id("perf-fact-verdict")).not_to_contain_text("provisional", timeout=60_000)
            expect(run.get_by_test_id("perf-fact-telemetry")).to_have_text(re.compile("^(ok|partial|degraded)$"))
            assert page.evaluate("window.__notReloaded") is True
            assert any("/api/events" in u for u in s.requests)
            s.assert_clean()
    finally:
        stop.write_text("")
        if proc.poll() is None:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_reopening_a_runs_performance_view_or_inspector_makes_no_request(browser: Browser, viewer: Viewer) -> None:
    """Issue 13 item 5 (warm): a run's performance-page answer is fetched once and kept; the view and
    the inspector shown again draw it with no request while the run has not changed."""
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "lagging").locator(".cell-name").click()
        expect(page.get_by_test_id("inspector-telemetry").get_by_test_id("telemetry-more")).to_be_visible()
        page.get_by_test_id("inspector-performance").click()
        run = page.locator("[data-testid=perf-run][data-name=lagging]")
        expect(run.get_by_test_id("perf-area")).to_be_visible()
        expect(run.get_by_test_id("heat-svg")).to_be_visible()
        fetched = [u for u in s.requests if "/performance-page" in u]
        assert len(fetched) == 1, fetched  # the inspector and the view shared one answer
        s.requests.clear()
        for _ in range(2):
            page.get_by_test_id("nav-runs").click()
            row(page, "lagging").locator(".cell-name").click()  # its inspector again
            expect(page.get_by_test_id("inspector-telemetry").get_by_test_id("telemetry-more")).to_be_visible()
            page.get_by_test_id("nav-performance").click()
            expect(run.get_by_test_id("perf-area")).to_be_visible()
            expect(run.get_by_test_id("heat-row")).to_have_count(2)
        page.wait_for_timeout(500)  # a late request would show here
        # (the inspector's own sections, the run's details and attachments, are asked again)
        answers = re.compile(r"/api/runs/[^?]*/(performance-page|telemetry|performance)\b")
        telemetry = [u for u in s.requests if answers.search(u)]
        assert not telemetry, telemetry
        s.assert_clean()


def test_a_page_opened_on_the_views_address_asks_for_its_run_once(browser: Browser, viewer: Viewer) -> None:
    """Issue 13 item 5 (cold, from a link or a reload): the run's answer is asked for as the page's
    HTML is read (early.js), and the app takes that request over: one request for the run, the
    panels drawn; the page's first listing of the runs does not count as the run having changed (it
    sent the answer's request a second time). An address naming no captured run still says so."""
    with open_viewer(browser, viewer) as s:
        key = viewer.key_of("lagging")
        base = viewer.url.split("/?")[0]
        other = s.page.context.new_page()  # the token cookie is set: a bare address works
        asked: list[str] = []
        other.on("request", lambda r: asked.append(r.url))
        other.goto(base + "/#" + urllib.parse.urlencode({"v": "performance", "pr": key}))
        run = other.locator("[data-testid=perf-run][data-name=lagging]")
        expect(run.get_by_test_id("perf-area")).to_be_visible()
        expect(run.get_by_test_id("heat-row")).to_have_count(2)
        other.wait_for_timeout(800)  # a second request would show by now
        answers = [u for u in asked if "/performance-page" in u]
        assert len(answers) == 1, answers
        assert urllib.parse.unquote(answers[0]).endswith(f"/api/runs/{key}/performance-page")
        order = [u.rsplit("/", 1)[-1] for u in asked]
        assert order.index("early.js") < order.index("app.js")  # sent before the app's script ran

        errors: list[str] = []
        other.on("pageerror", lambda e: errors.append(str(e)))
        other.goto(base + "/#" + urllib.parse.urlencode({"v": "performance", "pr": "/no/such/run"}))
        other.reload()
        expect(other.get_by_test_id("view-performance")).to_be_visible()
        expect(other.get_by_test_id("table-info")).to_be_attached()
        assert not errors, errors
        other.close()
        s.assert_clean()


def _root_and_staged_run(tmp_path: Path) -> tuple[Path, Path]:
    """A runs root of two fake runs, and one more run folder outside it, to be moved in while a
    page looks (a run the server has not listed yet): ``(root, that folder)``."""
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=2, seed=1)
    staging = tmp_path / "staging"
    generate(staging, runs=1, seed=3)
    (made,) = staging.iterdir()
    return root, made


def test_a_link_to_a_run_not_listed_yet_says_so_and_draws_it_once_listed(browser: Browser, tmp_path: Path) -> None:
    """Review 13f: a Performance link to a run that just started (not yet listed, then without
    telemetry) showed "Select captured runs" for good. Now the view says why it waits and draws the
    run once a poll brings it."""
    root, made = _root_and_staged_run(tmp_path)
    meta = json.loads((made / "run.json").read_text())  # a run that just started: running
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta.update(status="running", started_at=now, heartbeat_at=now, ended_at=None, exit=None, duration_s=None)
    atomic_write(made / "run.json", dump_json(meta))
    future = root / made.name  # the run's folder once it is moved in: its key
    with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v, open_viewer(browser, v) as s:
        page = s.page
        base = v.url.split("/?")[0]
        link = base + "/#" + urllib.parse.urlencode({"v": "performance", "pr": str(future.resolve())})
        other = page.context.new_page()
        other.goto(link)
        waiting = other.get_by_test_id("performance-waiting")
        expect(waiting).to_contain_text(f"Run {made.name} is not listed yet")
        made.rename(future)  # the run appears, not captured yet
        expect(waiting).to_contain_text(f"{future.name.split('_')[1]} has no telemetry yet")
        write_run(future, RunSpec(ranks=2, steps=120))  # its aggregator writes
        run = other.locator("[data-testid=perf-run]")
        expect(run.get_by_test_id("perf-area")).to_be_visible()
        expect(run.get_by_test_id("heat-row")).to_have_count(2)
        expect(waiting).to_have_count(0)
        other.close()
        s.assert_clean()


def test_a_selection_in_the_address_waits_for_runs_not_listed_yet(browser: Browser, tmp_path: Path) -> None:
    """Review 13i: ``#v=performance&s=<run>`` for a run the server had not listed yet dropped it from
    the selection (and the address) at the first listing: the view never showed it."""
    root, made = _root_and_staged_run(tmp_path)
    write_run(made, RunSpec(ranks=1, steps=60))  # captured already; it is moved in while the page looks
    future = root / made.name
    with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v, open_viewer(browser, v) as s:
        page = s.page
        base = v.url.split("/?")[0]
        link = base + "/#" + urllib.parse.urlencode({"v": "performance", "s": str(future.resolve())})
        other = page.context.new_page()
        other.goto(link)
        empty = other.get_by_test_id("performance-empty")
        expect(empty).to_contain_text(f"Run {made.name} is not listed yet")
        expect(empty).to_contain_text("not listed by the server")
        assert "s=" in urllib.parse.urlsplit(other.url).fragment  # still selected
        made.rename(future)
        run = other.locator("[data-testid=perf-run]")
        expect(run.get_by_test_id("perf-area")).to_be_visible()
        expect(empty).to_have_count(0)
        other.close()
        s.assert_clean()


def _hash_zoom(page: Page) -> Any:
    """The phase-chart zooms the address holds (``pz`` in its hash), or None."""
    got = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).fragment).get("pz")
    return json.loads(got[0]) if got else None


def test_a_phase_chart_zoom_is_kept_in_the_address_and_across_a_reopen(browser: Browser, viewer: Viewer) -> None:
    """Issue 13 item 3: the steps a user zoomed the phase chart to stay when the view is left and
    opened again, after a reload and in a tab opened on the link; a double-click forgets them."""
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "lagging").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        run = page.locator("[data-testid=perf-run][data-name=lagging]")
        area = run.get_by_test_id("perf-area")
        expect(area).to_be_visible()
        expect(area).to_have_attribute("data-zoomed", "0")
        whole = (float(area.get_attribute("data-x0") or "nan"), float(area.get_attribute("data-x1") or "nan"))
        box = run.get_by_test_id("perf-area-over").bounding_box()
        assert box is not None
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=12)
        page.mouse.up()
        expect(area).to_have_attribute("data-zoomed", "1")
        zoomed = (float(area.get_attribute("data-x0") or "nan"), float(area.get_attribute("data-x1") or "nan"))
        assert whole[0] < zoomed[0] < zoomed[1] < whole[1]
        expect(run.get_by_test_id("perf-area-from")).to_have_text(f"step {int(zoomed[0])}")
        page.wait_for_function("() => location.hash.includes('pz=')")
        assert _hash_zoom(page) == {viewer.key_of("lagging"): [zoomed[0], zoomed[1]]}

        def still_zoomed(p: Page) -> None:
            a = p.locator("[data-testid=perf-run][data-name=lagging] [data-testid=perf-area]")
            expect(a).to_have_attribute("data-zoomed", "1")
            assert (float(a.get_attribute("data-x0") or "nan"), float(a.get_attribute("data-x1") or "nan")) == zoomed

        page.get_by_test_id("nav-runs").click()  # left and opened again
        expect(page.get_by_test_id("performance")).to_be_hidden()
        page.get_by_test_id("nav-performance").click()
        still_zoomed(page)
        # a reload opens the remembered view (saved a moment after each change: wait for it)
        deadline = time.monotonic() + WAIT_MS / 1000
        while (saved := viewer.api("/api/ui-state")).get("view") != "performance" or not saved.get("perfZoom"):
            assert time.monotonic() < deadline, saved
            time.sleep(0.1)
        assert saved["perfZoom"] == {viewer.key_of("lagging"): [zoomed[0], zoomed[1]]}
        page.reload()
        still_zoomed(page)
        shot(page, "perf-zoom-reopened")
        other = page.context.new_page()  # a new tab on the link
        other.goto(page.url)
        still_zoomed(other)
        other.close()

        run.get_by_test_id("perf-area-over").dblclick()  # every step again: the address forgets the zoom
        expect(area).to_have_attribute("data-zoomed", "0")
        page.wait_for_function("() => !location.hash.includes('pz=')")
        assert _hash_zoom(page) is None
        s.assert_clean()


def test_a_run_that_ends_with_the_same_telemetry_files_loses_its_live_badge(browser: Browser, tmp_path: Path) -> None:
    """A captured run whose final summary was written while run.json still said running, then
    ended: its files are the same, but the answer now says it is not live. The page took the new
    answer for the kept one (same stamp) and kept saying "live" until a reload."""
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=2, seed=1)
    stop = threading.Event()
    first_epoch = threading.Event()
    thread = threading.Thread(target=live_run, args=(root,), daemon=True,
                              kwargs={"interval": 0.5, "stop": stop, "on_epoch": lambda e: first_epoch.set()})
    thread.start()
    try:
        assert first_epoch.wait(60)
        (run,) = [p for p in root.iterdir() if "_live-run_" in p.name]
        write_run(run, RunSpec(ranks=2, steps=120))
        write_final_summary(run)
        with serve(root, TRACEML_REFRESH_INTERVAL_SECONDS="1") as v, open_viewer(browser, v) as s:
            page = s.page
            page.evaluate("window.__notReloaded = true")
            expect(row(page, "live-run").get_by_test_id("status-badge")).to_have_text("running")
            row(page, "live-run").locator(".cell-name").click()
            page.get_by_test_id("inspector-performance").click()
            perf = page.locator("[data-testid=perf-run][data-name=live-run]")
            expect(perf.get_by_test_id("perf-area")).to_be_visible()
            expect(perf.get_by_test_id("perf-live")).to_be_visible()
            stamp = v.api(f"/api/runs/{urllib.parse.quote(str(run), safe='')}/performance-page")["stamp"]
            # the run ends: only run.json changes
            stop.set()
            thread.join(timeout=30)
            meta = json.loads((run / "run.json").read_text())
            meta.update(status="completed", ended_at=meta["heartbeat_at"], exit={"code": 0, "signal": None})
            atomic_write(run / "run.json", dump_json(meta))
            deadline = time.monotonic() + WAIT_MS / 1000
            status = lambda: next(r for r in v.api("/api/runs")["runs"] if r["name"] == "live-run")["display_status"]  # noqa: E731
            while status() != "completed":
                assert time.monotonic() < deadline
                time.sleep(0.2)
            expect(perf.get_by_test_id("perf-live")).to_be_hidden()
            answer = v.api(f"/api/runs/{urllib.parse.quote(str(run), safe='')}/performance-page")
            assert answer["stamp"] == stamp and answer["live"] is False  # the same files, not live now
            assert page.evaluate("window.__notReloaded") is True
            s.assert_clean()
    finally:
        stop.set()
        thread.join(timeout=30)


def test_the_performance_views_charts_keep_their_size_while_the_view_is_hidden(browser: Browser,
                                                                               viewer: Viewer) -> None:
    """Leaving the view hid its charts: each was shrunk to its narrowest and widened again when the
    view came back (two redraws per chart for nothing, and a flash of narrow charts)."""
    with open_viewer(browser, viewer) as s:
        page = s.page
        row(page, "lagging").locator(".cell-name").click()
        page.get_by_test_id("inspector-performance").click()
        run = page.locator("[data-testid=perf-run][data-name=lagging]")
        canvas = run.get_by_test_id("telemetry-rss").locator("canvas").first
        expect(canvas).to_be_visible()
        page.wait_for_timeout(300)  # settled at its width
        width = canvas.evaluate("(c) => c.width")
        assert width > 400
        page.get_by_test_id("nav-runs").click()
        expect(page.get_by_test_id("performance")).to_be_hidden()
        page.wait_for_timeout(400)  # past the resize debounce
        assert canvas.evaluate("(c) => c.width") == width  # hidden: not redrawn narrow
        page.get_by_test_id("nav-performance").click()
        expect(canvas).to_be_visible()
        assert canvas.evaluate("(c) => c.width") == width
        s.assert_clean()
