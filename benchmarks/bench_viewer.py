"""Viewer figures of issue 3, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_viewer.py``.

1. first table data from runs.sqlite with 1,000 runs, after start (target ≤ 0.1 s);
2. series of a 200,000-line run, cold (≤ 0.4 s) and warm (≤ 20 ms);
3. server RSS with 10,000 runs after the page's first requests (≤ 150 MB);
4. page usable (table rows and a chart painted) in headless chromium on 1,000 runs (≤ 1.0 s) and
   10,000 runs (≤ 2.5 s) — needs the built front end, Playwright and /usr/bin/chromium;
2b. issue 15 items 23-24, on the same 200,000-line run: the history load, the first chart once the
   rows are parsed (cold: the per-metric arrays built; ≤ 0.2 s) and again (warm: ≤ 20 ms), and the
   re-polls after the load (≤ 1 ms each: the time the garbage collector spends in them, and the
   polls themselves), with and without ``gc.freeze()`` after the load (CPU seconds: the machine
   may be shared), on a root of 10 runs beside the big one (a poll of 1,000 run folders costs
   about 3 ms of listing and stat calls with or without a history);
5. the perf.* columns of 1,000 captured runs (issue 13 item 5): read cold from their
   final_summary.json files (≤ 0.2 s; a fresh process, the files in the OS cache), and what a
   no-change poll adds (nothing read; the time of the join's pass over the runs is printed);
6. the Performance view of one run of 8 ranks x 100,000 steps (issue 13 item 5): the two answers
   the page asks for (``/telemetry`` and ``/performance``, built one after the other, so the sum is
   an upper bound of the page's wait) cold (≤ 1.0 s: fresh caches, the database in the OS cache)
   and warm (≤ 50 ms: the same run asked again, nothing changed). The database is written
   synthetically with the real schema (tests/diagnose/telemetry_db.py, as the aggregator writes it:
   WAL, every table, GPU ranks with per-step memory, 1 s snapshots).
6b. the same run's Performance view in a real browser (``--only-perf-view-browser``; headless
   chromium, Playwright): from the click on "Performance" in the sidebar (the run ticked in the
   table, the server just started: nothing cached) to every panel drawn (the stacked area, the
   heatmap, the memory, RSS, host and GPU charts, the captured output), cold (≤ 1.0 s), from the
   address (the page loaded on the view's URL: the app's start included), and warm (back to Runs and
   Performance again, the same run unchanged: ≤ 50 ms), with the answers' sizes and the requests
   the warm reopen made (none: the page keeps the answer until the run changes);
7. chart PNG export (issue 15 item 7), through the viewer as the page asks for it: one metric of 5
   runs (≤ 0.5 s) and the worst case, 4 metrics × 30 runs × 5,000 points (≤ 1.5 s); medians of 3.
   ``--only-png`` prints just these.
"""

from __future__ import annotations

import argparse
import gc
import http.cookiejar
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from traceml_ai.diagnose.perf import PerfIndex
from traceml_ai.diagnose.summary import write_final_summary
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.perf import join_perf
from traceml_ai.ui.performance import PerformanceViews
from traceml_ai.ui.reads import SHARED as SHARED_READS
from traceml_ai.ui.service import Viewer
from traceml_ai.ui.telemetry import TelemetryViews

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.diagnose.telemetry_db import RunSpec, write_run

ROWS: list[tuple[str, float, float, str]] = []


def record(label: str, seconds: float, target: float, unit: str = "s") -> None:
    ROWS.append((label, seconds, target, unit))
    shown = f"{seconds * 1e3:.1f} ms" if unit == "s" and seconds < 0.1 else f"{seconds:.3f} {unit}"
    if unit == "MB":
        shown = f"{seconds:.0f} MB"
    mark = "ok" if seconds <= target else "OVER"
    print(f"{label:<62} {shown:>12}   target {target:g} {unit}   {mark}", flush=True)


def first_table_from_db(root: Path, cache: Path) -> None:
    viewer = Viewer(RunStore([root]), CacheFolder(cache, roots=[root]))
    viewer.poll()
    viewer.close()  # writes runs.sqlite
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fresh = Viewer(RunStore([root]), CacheFolder(cache, roots=[root]))
        fresh.start()
        body = fresh.table_payload()
        runs = fresh.runs_payload(0)
        times.append(time.perf_counter() - t)
        assert body["shown"] >= 1000 and len(runs["runs"]) >= 1000, body["shown"]
    record("first table data from runs.sqlite (1,000 runs) after start", statistics.median(times), 0.1)


def series_cold_warm(root: Path) -> None:
    big = next(p for p in root.iterdir() if "_big-run_" in p.name)
    cold, warm = [], []
    for _ in range(3):
        viewer = Viewer(RunStore([root]), None)
        viewer.poll()
        key = str(big)
        t = time.perf_counter()
        viewer.series_payload([key], ["val/auc"], "step", 0.0)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        viewer.series_payload([key], ["val/auc"], "step", 0.0)
        warm.append(time.perf_counter() - t)
        del viewer
    record("series of a 200,000-line run, cold (history load included)", statistics.median(cold), 0.4)
    record("series of a 200,000-line run, warm", statistics.median(warm), 0.020)


def chart_after_load_and_repolls(root: Path) -> None:
    """Issue 15 items 23-24: figures in CPU seconds of this process (a shared machine slows wall
    time, not CPU time), the medians of 3 fresh viewers each."""
    import traceml_ai.ui.service as service

    big = str(next(p for p in root.iterdir() if "_big-run_" in p.name))
    gc_spent: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.process_time())
        elif started:
            gc_spent.append(time.process_time() - started.pop())

    gc.callbacks.append(on_gc)
    try:
        for freeze in (False, True):
            service.FREEZE_AFTER_ROWS = 50_000 if freeze else 10**12
            load, cold, warm, first_poll, worst_poll, poll_gc, full_gc = [], [], [], [], [], [], []
            for _ in range(3):
                gc.unfreeze()
                gc.collect()
                viewer = Viewer(RunStore([root]), None)
                viewer.poll()
                t = time.process_time()
                viewer.history(big)
                load.append(time.process_time() - t)
                t = time.process_time()
                viewer.series_payload([big], ["val/auc"], "step", 0.0)
                cold.append(time.process_time() - t)
                t = time.process_time()
                viewer.series_payload([big], ["val/auc"], "step", 0.0)
                warm.append(time.process_time() - t)
                t = time.process_time()
                gc.collect()  # what a re-poll pays when it is the one that triggers a full collection
                full_gc.append(time.process_time() - t)
                polls = []
                gc_spent.clear()
                for _ in range(20):
                    t = time.process_time()
                    viewer.poll()
                    polls.append(time.process_time() - t)
                    # What the page does between polls: a table answer (allocations that trigger the collector).
                    viewer._tables.clear()
                    viewer.table_payload()
                first_poll.append(polls[0])
                worst_poll.append(max(polls))
                poll_gc.append(sum(gc_spent))
                del viewer
            tag = "with gc.freeze" if freeze else "no gc.freeze "
            if freeze:
                record("200,000-line history: load (parse), CPU", statistics.median(load), 0.4)
                record("first chart once the rows are parsed (cold), CPU", statistics.median(cold), 0.2)
                record("first chart, warm, CPU", statistics.median(warm), 0.020)
            record(f"a full collection after the load ({tag}), CPU", statistics.median(full_gc), 0.001)
            record(f"re-polls after the load ({tag}): collector time in 20 polls", statistics.median(poll_gc), 0.001)
            record(f"re-polls after the load ({tag}): first poll, CPU", statistics.median(first_poll), 0.001)
            record(f"re-polls after the load ({tag}): slowest of 20, CPU", statistics.median(worst_poll), 0.001)
    finally:
        gc.callbacks.remove(on_gc)
        gc.unfreeze()


def start_ui(root: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)", line)
    if not match:
        raise RuntimeError(f"traceml ui did not start: {line}")
    return proc, match.group(1)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def server_rss(root: Path) -> None:
    proc, url = start_ui(root)
    try:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        opener.open(url, timeout=60)
        base = url.split("/?")[0]
        runs = json.loads(opener.open(base + "/api/runs", timeout=60).read())
        opener.open(base + "/api/table", timeout=60).read()
        keys = [r["key"] for r in runs["runs"][:3]]
        body = json.dumps({"keys": keys, "metrics": ["val/auc"]}).encode()
        req = urllib.request.Request(base + "/api/series", data=body, headers={"content-type": "application/json"},
                                     method="POST")
        opener.open(req, timeout=60).read()
        record(f"server RSS with {len(runs['runs']):,} runs", rss_mb(proc.pid), 150, "MB")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def page_usable(root: Path, label: str, target: float) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print(f"{label}: skipped (playwright not installed)")
        return
    if not Path("/usr/bin/chromium").exists():
        print(f"{label}: skipped (no /usr/bin/chromium)")
        return
    proc, url = start_ui(root)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            rows_times, times = [], []
            context = browser.new_context(viewport={"width": 1400, "height": 900})  # keeps the token cookie
            for i in range(3):
                if i:
                    # Each load starts from the default view: the page remembers its view 0.6 s
                    # after a change, so a slow chart could leave the next load on the Charts view.
                    context.request.put(url.split("/?")[0] + "/api/ui-state", data={})
                page = context.new_page()
                t = time.perf_counter()
                page.goto(url if i == 0 else url.split("/?")[0] + "/")
                page.wait_for_selector("[data-testid=run-row]", timeout=60_000)
                rows_times.append(time.perf_counter() - t)
                # Usable: pick three runs and plot them, as a user would right after the page opens.
                checks = page.locator("[data-testid=row-check]")
                for k in range(3):
                    checks.nth(k).click()
                page.get_by_test_id("selection-plot").click()
                page.wait_for_selector("[data-testid=chart-line] canvas", timeout=60_000)
                page.wait_for_function(
                    "() => [...document.querySelectorAll('[data-testid=chart-line]')].length > 0"
                    " && document.querySelectorAll('[data-testid=legend-item]').length >= 3",
                    timeout=60_000,
                )
                times.append(time.perf_counter() - t)
                page.close()
            browser.close()
        record(label.replace("(rows + chart painted)", "(table rows painted)"), statistics.median(rows_times), target)
        record(label, statistics.median(times), target)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _final_summary(i: int) -> dict[str, Any]:
    """A final_summary.json document shaped like the diagnosis writes it (docs/diagnoses.md), 2
    ranks, every phase, its numbers varied per run."""
    loader = 0.02 + (i % 50) / 100
    phases = [("traceml:dataloader_next", loader), ("traceml:h2d", 0.01), ("traceml:forward", 0.25),
              ("traceml:backward", 0.4 - loader / 2), ("traceml:optimizer_step", 0.1), ("other", 0.2 - loader / 2)]
    step = 20.0 + i % 17
    return {
        "schema_version": 1, "generated_at": "2026-11-30T10:20:31Z",
        "telemetry": {"source": "aggregator/telemetry.sqlite", "status": "ok", "detail": None,
                      "rows": {"step_time_samples": 4000, "step_memory_samples": 4000, "process_samples": 300,
                               "system_samples": 150, "system_gpu_samples": 0}, "problems": []},
        "steps": {"seen": 2000, "first": 0, "last": 1999, "analysed": 3990, "sampled_every": 1},
        "ranks": {"seen": [0, 1], "world_size": 2, "missing": []},
        "warmup": {"steps_skipped_per_rank": 5},
        "step_time": {"iteration_median_ms": step, "iteration_p90_ms": step * 1.2, "iteration_p95_ms": step * 1.3,
                      "throughput_steps_per_s": 1000 / step, "dataloader_outside_step": 0,
                      "phases": [{"name": n, "median_ms": step * sh, "p90_ms": step * sh * 1.1, "share": sh,
                                  "steps": 3990} for n, sh in phases],
                      "per_rank": [{"rank": r, "steps": 1995, "median_ms": step + r, "p90_ms": step * 1.2,
                                    "outside_backward_median_ms": step / 2} for r in (0, 1)],
                      "worst_rank": 1, "skew": 1 / step},
        "memory": {"device": "cpu", "peak_alloc_bytes": None, "peak_reserved_bytes": None,
                   "device_total_bytes": None, "rss_peak_bytes": {"0": 943718400, "1": 943718400 + i},
                   "ram_total_bytes": 68719476736},
        "system": {"samples": 130, "cpu_percent_median": 98.0, "cpu_percent_p90": 100.0,
                   "ram_used_fraction_median": 0.31, "ram_used_fraction_max": 0.32, "gpu_count": 0,
                   "gpu_util_median": None, "gpu_util_p90": None, "gpu_util_mean": None},
        "findings": [{"kind": "input_bound" if loader > 0.3 else "compute_bound", "severity": "warning",
                      "summary": "The data loader takes a large share of the step (a sentence with numbers).",
                      "action": "Use more DataLoader workers, pin memory, or prefetch (a sentence).",
                      "evidence": {"metric": "dataloader_share", "value": loader, "threshold": 0.3,
                                   "ranks": [0, 1], "steps": [5, 1999]}}],
        "abstained": [{"rule": "low_gpu_util", "reason": "no GPU utilisation samples (CPU-only run)"},
                      {"rule": "gpu_memory_pressure", "reason": "no GPU memory totals (CPU-only run)"}],
        "rules_checked": ["input_bound", "h2d_bound", "optimizer_bound", "compute_bound", "straggler",
                          "memory_creep", "host_memory_pressure"],
    }


def perf_columns(root: Path) -> None:
    """Every run of ``root`` gets an ``aggregator/final_summary.json``; then the perf join is timed
    cold (a fresh index, as at a viewer's start) and on a no-change poll."""
    for i, run in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        (run / "aggregator").mkdir(exist_ok=True)
        doc = orjson.dumps(_final_summary(i), option=orjson.OPT_INDENT_2)
        (run / "aggregator" / "final_summary.json").write_bytes(doc)
    store = RunStore([root])
    store.poll()
    n = len(store.runs())
    cold, again = [], []
    reads_again = 0
    for _ in range(5):
        index = PerfIndex()
        for r in store.runs():  # forget the facts the previous round attached
            store.set_perf(r.key, {})
        t = time.perf_counter()
        changed = join_perf(store, index)
        cold.append(time.perf_counter() - t)
        assert len(changed) == n and index.reads == n, (len(changed), index.reads)
        before = index.reads
        t = time.perf_counter()
        assert join_perf(store, index) == []
        again.append(time.perf_counter() - t)
        reads_again += index.reads - before
    record(f"perf.* columns of {n:,} captured runs, cold (final summaries read)", statistics.median(cold), 0.2)
    print(f"{'  no-change poll: final summaries read':<62} {reads_again:>12}   target 0", flush=True)
    record("  no-change poll: the join's pass over the runs", statistics.median(again), 0.2)
    viewer = Viewer(store, None)
    viewer.poll()
    t = time.perf_counter()
    body = viewer.table_payload(sorts=["-perf.share.dataloader"], columns=["name", "perf.share.dataloader"])
    record("  table sorted by perf.share.dataloader (1,000 runs, uncached)", time.perf_counter() - t, 0.2)
    assert body["keys"] and "perf.share.dataloader" in body["columns"]["numeric"]


def performance_view(root: Path, ranks: int = 8, steps: int = 100_000) -> None:
    """One captured run of ``ranks`` x ``steps``; its Performance view's answers cold and warm."""
    generate(root, runs=1, seed=2)
    run_dir = next(p for p in root.iterdir() if p.is_dir())
    t = time.perf_counter()
    write_run(run_dir, RunSpec(ranks=ranks, steps=steps, gpu=True, interval_s=1.0, noise=0.1))
    write_final_summary(run_dir)  # a finished capture has one (a live run is judged on each read instead)
    print(f"wrote {ranks} ranks x {steps:,} steps in {time.perf_counter() - t:.1f} s "
          f"({(run_dir / 'aggregator' / 'telemetry.sqlite').stat().st_size / 1e6:.0f} MB)", flush=True)
    store = RunStore([root])
    store.poll()
    (run,) = store.runs()
    cold, warm, parts, cpu = [], [], [], []
    for _ in range(3):
        SHARED_READS.clear()  # forget the shared read: a cold start
        telemetry, performance = TelemetryViews(), PerformanceViews()
        t, c = time.perf_counter(), time.process_time()
        telemetry.payload(run)
        t_tel = time.perf_counter() - t
        performance.payload(run)
        cold.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        parts.append((t_tel, cold[-1] - t_tel))
        for _ in range(5):
            t = time.perf_counter()
            telemetry.payload(run)
            performance.payload(run)
            warm.append(time.perf_counter() - t)
    best = min(range(len(cold)), key=lambda i: cold[i])
    record(f"Performance view of {ranks} ranks x {steps:,} steps, cold (both answers)", statistics.median(cold), 1.0)
    print(f"{'  of which /telemetry, /performance (fastest round)':<62} "
          f"{parts[best][0] * 1e3:>6.0f} + {parts[best][1] * 1e3:.0f} ms", flush=True)
    print(f"{'  CPU seconds of the cold build (median; the machine may be shared)':<62} "
          f"{statistics.median(cpu):>10.3f} s", flush=True)
    record("  warm (asked again, nothing changed)", statistics.median(warm), 0.05)


PANELS_DRAWN = """() => {
  const view = document.querySelector('[data-testid=view-performance]');
  const run = view && !view.hidden ? view.querySelector('[data-testid=perf-run]') : null;
  if (!run || run.textContent.includes('Loading…')) return false;
  const drawn = !!run.querySelector('[data-testid=perf-area] polygon')
    && !!run.querySelector('[data-testid=heat-svg] [data-testid=heat-cells]')
    && run.querySelectorAll('.telem-card canvas').length >= 4
    && !!run.querySelector('[data-testid=telemetry-logs]');
  // ms from the click (or the navigation's start) to the frame this is checked in
  return drawn ? performance.now() - (window.__clickAt ?? 0) : false;
}"""
CLICK_CLOCK = "document.addEventListener('click', () => { window.__clickAt = performance.now(); }, true)"
"""Stamps each click in the page: the figures are the page's own clock, from the click to the frame
in which every panel is there (not Playwright's round trips)."""


def performance_view_browser(root: Path, ranks: int = 8, steps: int = 100_000, rounds: int = 3) -> None:
    """The Performance view of one run of ``ranks`` x ``steps`` in headless chromium: cold (a fresh
    server, the click in the sidebar), from its address, and warm (reopened); printed, never asserted."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("Performance view in a browser: skipped (playwright not installed)")
        return
    if not Path("/usr/bin/chromium").exists():
        print("Performance view in a browser: skipped (no /usr/bin/chromium)")
        return
    if not any(root.glob("*/aggregator/telemetry.sqlite")):
        generate(root, runs=1, seed=2)
        run_dir = next(p for p in root.iterdir() if p.is_dir())
        write_run(run_dir, RunSpec(ranks=ranks, steps=steps, gpu=True, interval_s=1.0, noise=0.1))
        write_final_summary(run_dir)
    cold, by_url, warm, warm_requests, sizes = [], [], [], [], {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        for _ in range(rounds):
            for how in ("click", "address"):
                proc, url = start_ui(root)  # a fresh server: its answers are built from the database
                try:
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    context.add_init_script(CLICK_CLOCK)
                    page = context.new_page()
                    api_calls: list[str] = []

                    def seen(resp: Any, calls: list[str] = api_calls) -> None:
                        if "/api/runs/" in resp.url:
                            calls.append(resp.url)
                            body = resp.body()
                            sizes[resp.url.rsplit("/", 1)[-1].split("?")[0]] = len(body)

                    page.on("response", seen)
                    base = url.split("/?")[0]
                    if how == "address":
                        page.goto(url + "#v=runs")  # sets the token cookie
                        page.wait_for_selector("[data-testid=run-row]", timeout=60_000)
                        key = json.loads(context.request.get(base + "/api/runs").text())["runs"][0]["key"]
                        target = base + "/#" + urllib.parse.urlencode({"v": "performance", "pr": key})
                        fresh = context.new_page()  # a new page load on the view's address
                        fresh.goto(target)
                        by_url.append(fresh.wait_for_function(PANELS_DRAWN, polling="raf", timeout=120_000)
                                      .json_value() / 1e3)
                    else:
                        page.goto(url + "#v=runs")
                        page.wait_for_selector("[data-testid=run-row]", timeout=60_000)
                        page.locator("[data-testid=row-check]").first.check()
                        page.get_by_test_id("nav-performance").click()
                        cold.append(page.wait_for_function(PANELS_DRAWN, polling="raf", timeout=120_000)
                                    .json_value() / 1e3)
                        for _ in range(5):
                            page.get_by_test_id("nav-runs").click()
                            page.wait_for_selector("[data-testid=view-runs]:not([hidden])")
                            page.wait_for_timeout(200)
                            before = len(api_calls)
                            page.get_by_test_id("nav-performance").click()
                            warm.append(page.wait_for_function(PANELS_DRAWN, polling="raf", timeout=60_000)
                                        .json_value() / 1e3)
                            page.wait_for_timeout(300)  # a request the reopen made would show by now
                            warm_requests.append(len(api_calls) - before)
                    context.close()
                finally:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(30)
        browser.close()
    label = f"{ranks} ranks x {steps:,} steps"
    record(f"Performance view in chromium, {label}: cold (click)", statistics.median(cold), 1.0)
    record("  cold, page loaded on the view's address", statistics.median(by_url), 1.0)
    record("  warm (reopened, the run unchanged)", statistics.median(warm), 0.05)
    print(f"{'  requests made by a warm reopen (median)':<62} {statistics.median(warm_requests):>10g}", flush=True)
    print(f"{'  answers (bytes)':<62} " + ", ".join(f"{k} {v:,}" for k, v in sorted(sizes.items())), flush=True)
    print(f"{'  cold (click) each round':<62} " + ", ".join(f"{v:.3f}" for v in cold), flush=True)


def _write_long_run(folder: Path, i: int, points: int) -> None:
    """A completed run with ``points`` metrics.jsonl rows of four metrics (for the PNG worst case)."""
    folder.mkdir(parents=True)
    run = {"schema_version": 1, "id": folder.name, "name": f"run-{i}", "status": "completed",
           "started_at": "2026-11-30T12:00:00Z", "ended_at": "2026-11-30T14:00:00Z",
           "heartbeat_at": "2026-11-30T14:00:00Z", "duration_s": 7200.0, "exit": {"code": 0, "signal": None}}
    (folder / "run.json").write_text(json.dumps(run), encoding="utf-8")
    lines = []
    for step in range(points):
        f = step / points
        lines.append(orjson.dumps({
            "step": step, "epoch": step // 100, "time": 1_790_000_000.0 + step * 1.4,
            "train/loss": 2.0 * (1 - f) ** 2 + 0.05 * ((step * 7919 + i) % 97) / 97,
            "val/loss": 2.1 * (1 - f) ** 2 + 0.1 + 0.01 * i, "val/auc": 0.5 + 0.4 * f - 0.002 * i,
            "train/lr": 1e-3 * (1 - f),
        }))
    (folder / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def png_export(tmp: Path) -> None:
    from traceml_ai.runs.analysis import parse_chart_spec

    root = tmp / "png" / "traceml" / "runs"
    generate(root, runs=5, seed=0)
    for i in range(30):
        _write_long_run(root / f"20261130-1200{i:02d}_long-{i}_ab{i:02d}", i, 5000)
    viewer = Viewer(RunStore([root]), CacheFolder(tmp / "png" / "traceml" / ".cache", roots=[root]))
    viewer.poll()
    runs = viewer.store.runs()
    small = [r.key for r in runs if "_long-" not in r.key][:5]
    long = [r.key for r in runs if "_long-" in r.key]
    cases = [
        ("PNG export: 1 metric of 5 runs", small, ["val/auc"], 0.5),
        ("PNG export: 4 metrics x 30 runs x 5,000 points", long,
         ["train/loss", "val/loss", "val/auc", "train/lr"], 1.5),
    ]
    for label, keys, metrics, target in cases:
        spec = parse_chart_spec({"chart": "line", "keys": keys, "metrics": metrics, "x": "step", "ema": 0.0,
                                 "log_y": False, "group_by": None})
        viewer.export_chart(spec, "png")  # matplotlib imported and the histories loaded: not measured
        times, cpu = [], []
        for _ in range(3):
            t, c = time.perf_counter(), time.process_time()
            viewer.export_chart(spec, "png")
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        record(label, statistics.median(times), target)
        note = "  (CPU seconds of this process, median; the machine may be busy)"
        print(f"{note:<62} {statistics.median(cpu):>10.3f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-10k", action="store_true", help="skip the 10,000-run figures")
    parser.add_argument("--only-perf", action="store_true", help="only the perf.* column figures (item 5 of issue 13)")
    parser.add_argument("--only-perf-view", action="store_true",
                        help="only the Performance view of 8 ranks x 100,000 steps (item 5 of issue 13)")
    parser.add_argument("--only-perf-view-browser", action="store_true",
                        help="only the Performance view of 8 ranks x 100,000 steps in headless chromium (issue 13 "
                             "item 5); --root DIR keeps the run written there between invocations")
    parser.add_argument("--root", type=Path, default=None, help="with --only-perf-view-browser: the runs root to use")
    parser.add_argument("--only-chart", action="store_true",
                        help="only the chart and re-poll figures of a 200,000-line run (items 23-24 of issue 15)")
    parser.add_argument("--only-png", action="store_true",
                        help="only the chart PNG export figures (item 7 of issue 15)")
    args = parser.parse_args()
    if args.only_png:
        with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
            png_export(Path(tmp))
        return
    if args.only_perf_view_browser:
        if args.root is not None:
            performance_view_browser(args.root)
            return
        with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
            performance_view_browser(Path(tmp) / "traceml" / "runs")
        return
    if args.only_perf_view:
        with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
            performance_view(Path(tmp) / "traceml" / "runs")
        return
    if args.only_chart:
        with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
            root = Path(tmp) / "traceml" / "runs"
            generate(root, runs=10, seed=0, big_run_lines=200_000)
            chart_after_load_and_repolls(root)
        return
    if args.only_perf:
        with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
            root = Path(tmp) / "traceml" / "runs"
            generate(root, runs=1000, seed=0)
            perf_columns(root)
        return
    with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
        root = Path(tmp) / "traceml" / "runs"
        t = time.perf_counter()
        generate(root, runs=1000, seed=0, big_run_lines=200_000)
        print(f"wrote 1,000 runs + a 200,000-line run in {time.perf_counter() - t:.1f} s", flush=True)
        first_table_from_db(root, Path(tmp) / "traceml" / ".cache")
        series_cold_warm(root)
        small = Path(tmp) / "small" / "traceml" / "runs"  # re-polls of the big run, not of 1,000 folders
        generate(small, runs=10, seed=0, big_run_lines=200_000)
        chart_after_load_and_repolls(small)
        page_usable(root, "page usable on 1,000 runs (rows + chart painted)", 1.0)
        perf_columns(root)
        performance_view(Path(tmp) / "perfview" / "traceml" / "runs")
        performance_view_browser(Path(tmp) / "perfview" / "traceml" / "runs")
        png_export(Path(tmp))
        if not args.skip_10k:
            root10 = Path(tmp) / "big" / "traceml" / "runs"
            t = time.perf_counter()
            generate(root10, runs=10_000, seed=1)
            print(f"wrote 10,000 runs in {time.perf_counter() - t:.1f} s", flush=True)
            server_rss(root10)
            page_usable(root10, "page usable on 10,000 runs (rows + chart painted)", 2.5)


if __name__ == "__main__":
    main()
