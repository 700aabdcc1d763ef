"""Viewer figures of issue 3, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_viewer.py``.

1. first table data from runs.sqlite with 1,000 runs, after start (target ≤ 0.1 s);
2. series of a 200,000-line run, cold (≤ 0.4 s) and warm (≤ 20 ms);
3. server RSS with 10,000 runs after the page's first requests (≤ 150 MB);
4. page usable (table rows and a chart painted) in headless chromium on 1,000 runs (≤ 1.0 s) and
   10,000 runs (≤ 2.5 s) — needs the built front end, Playwright and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
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
import urllib.request
from pathlib import Path

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-10k", action="store_true", help="skip the 10,000-run figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="traceml-bench-ui-") as tmp:
        root = Path(tmp) / "traceml" / "runs"
        t = time.perf_counter()
        generate(root, runs=1000, seed=0, big_run_lines=200_000)
        print(f"wrote 1,000 runs + a 200,000-line run in {time.perf_counter() - t:.1f} s", flush=True)
        first_table_from_db(root, Path(tmp) / "traceml" / ".cache")
        series_cold_warm(root)
        page_usable(root, "page usable on 1,000 runs (rows + chart painted)", 1.0)
        if not args.skip_10k:
            root10 = Path(tmp) / "big" / "traceml" / "runs"
            t = time.perf_counter()
            generate(root10, runs=10_000, seed=1)
            print(f"wrote 10,000 runs in {time.perf_counter() - t:.1f} s", flush=True)
            server_rss(root10)
            page_usable(root10, "page usable on 10,000 runs (rows + chart painted)", 2.5)


if __name__ == "__main__":
    main()
