"""The performance columns in a real browser (issue 13 items 1 and 6): real runs captured by
``traceml run`` on the digits example (1 rank healthy, 1 rank with the planted input stall, 2 ranks
with the planted straggler) beside runs that were not captured, in Debian's chromium.

The captures are made once for the module (each takes tens of seconds on a busy machine).
Screenshots land in ``test-artifacts/screens/perf-*.png``.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import run_traceml
from tests.ui.test_browser import CHROMIUM, LAUNCH_ARGS, expect, open_viewer, row, select_runs, serve, shot, sync_api
from traceml_ai.examples import TRAIN_DIGITS
from traceml_ai.runs.fake import generate

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
def browser() -> Iterator[Browser]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield b
        b.close()


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
        expect(area).to_have_attribute("data-source", "waited-for rank")
        perf = viewer.api(f"/api/runs/{urllib.parse.quote(viewer.key_of('lagging'), safe='')}/performance")
        b = perf["breakdown"]
        if area.get_attribute("data-window") == "1":  # a short run: no smoothing, the tallest step is the top
            top = max(sum(v or 0 for v in step) for step in zip(*(x["y"] for x in b["series"]), strict=True))
            assert float(area.get_attribute("data-top") or "nan") == pytest.approx(top)
        # the breakdown's steps are the job's: its median after warm-up is traceml summary's throughput
        after = [v for x, v in zip(b["x"], b["iteration"], strict=True)
                 if v is not None and x >= b["x"][0] + perf["heatmap"]["warmup_steps"]]
        assert b["bucket_steps"] == 1
        throughput = lagging["step_time"]["throughput_steps_per_s"]
        assert 1000 / statistics.median(after) == pytest.approx(throughput, rel=1e-4)
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
        stall_section = page.locator("[data-testid=perf-run][data-name=stall]")
        expect(stall_section.get_by_test_id("perf-fact-verdict")).to_have_text("input_bound")
        shot(page, "perf-view-two-runs")
        s.assert_clean()
