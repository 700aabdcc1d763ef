"""The page at scale (issue 16 item 3), printed (never asserted): ``traceml ui`` on the runs that
``traceml bench --scale`` generates, opened in headless chromium (Playwright, Debian's
/usr/bin/chromium) twice, as a user opens it and again on the warm server. Per open it prints:

- **first rows**: from the page's address to the first table row drawn (target ≤ 3 s at 100,000);
- **longest frame**: the longest gap between two animation frames in the first 3 s after that (the
  tab is frozen while it lasts), and how many frames took over 200 ms;
- **server RSS**: the viewer's peak resident memory (``VmHWM``) so far (target ≤ 1 GB).

On the second open it then sorts by name (a header click), goes back to newest first and groups by
a config value, each timed until the rows are drawn in their new order, with the longest frame.

Also the time from the launch of ``traceml ui`` to its printed URL (the warm start, wall).

Run: ``.venv/bin/python benchmarks/bench_page_scale.py --size 100000`` (the runs are generated
once into the scale benchmark's cache folder, ``--cache``; 100,000 take minutes).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceml_ai.cli.bench_scale import default_cache, ensure_runs

FRAMES = """
window.__gaps = [];
(() => {
  let last = performance.now();
  const tick = (t) => { window.__gaps.push(t - last); last = t; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
})();
"""


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _timed(page: Any, act: Callable[[], None], done: str) -> str:
    """Do ``act``, wait until the page's JavaScript expression ``done`` holds; the time it took and
    the longest frame from the action to 2 s after it."""
    page.evaluate("window.__gaps = []")
    t = time.perf_counter()
    act()
    # (polled from here: the page's Content-Security-Policy refuses wait_for_function's eval)
    while not page.evaluate(done):
        if time.perf_counter() - t > 120:
            raise TimeoutError(f"not done after 120 s: {done}")
        time.sleep(0.01)
    took = time.perf_counter() - t
    page.wait_for_timeout(2000)
    gaps = page.evaluate("window.__gaps")
    return f"{took:.2f} s, longest frame {max(gaps, default=0):.0f} ms"


FIRST_KEY = "document.querySelector('[data-testid=run-row]')?.getAttribute('data-key')"


def sort_and_group(page: Any) -> None:
    """A sort by name (click its header), then back to newest first, then a group by a config value:
    each until the rows are drawn in their new order, and the longest frame meanwhile."""
    before = page.evaluate(FIRST_KEY)
    name = page.locator(".col-title[data-column=name] .col-name")
    took = _timed(page, name.click, f"{FIRST_KEY} !== {before!r}")
    print(f"    sort by name: first row redrawn after {took}", flush=True)
    sorted_first = page.evaluate(FIRST_KEY)
    took = _timed(page, lambda: (name.click(), name.click()), f"{FIRST_KEY} !== {sorted_first!r}")
    print(f"    back to newest first (two clicks): {took}", flush=True)
    took = _timed(page, lambda: page.get_by_test_id("group-by").select_option("config.model.name"),
                  "document.querySelector('[data-testid=group-header]') !== null")
    print(f"    group by config.model.name: group headers drawn after {took}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=10_000, help="runs (default 10,000)")
    parser.add_argument("--cache", type=Path, default=None, help="the scale benchmark's cache folder")
    args = parser.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("needs playwright (pip install -e '.[test]')")
    if not Path("/usr/bin/chromium").exists():
        sys.exit("needs Debian's chromium at /usr/bin/chromium (apt install chromium)")
    cache = args.cache or default_cache()
    root = ensure_runs(cache, args.size, lambda m: print(m, flush=True))
    cache_dir = cache / str(args.size) / "cache"
    launched = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "TRACEML_CACHE_DIR": str(cache_dir), "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)", proc.stdout.readline())
    if not match:
        proc.kill()
        sys.exit("traceml ui did not print its URL")
    url = match.group(1)
    print(f"{args.size:,} runs: traceml ui printed its URL after {time.perf_counter() - launched:.2f} s (wall)")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(viewport={"width": 1400, "height": 900})  # keeps the token cookie
            # From the default view (the Runs table, newest first), whatever was remembered in the cache folder.
            token = url.split("token=")[1]
            context.request.put(url.split("/?")[0] + "/api/ui-state", data={}, headers={"x-traceml-token": token})
            for i, label in enumerate(("first open", "second open")):
                page = context.new_page()
                page.add_init_script(FRAMES)
                t = time.perf_counter()
                page.goto(url if i == 0 else url.split("/?")[0] + "/", wait_until="commit")
                page.wait_for_selector("[data-testid=run-row]", timeout=300_000)
                first = time.perf_counter() - t
                page.wait_for_timeout(3000)
                gaps = page.evaluate("window.__gaps")
                info = page.inner_text("[data-testid=table-info]")
                print(f"  {label}: first rows {first:.2f} s (target 3 s); longest frame {max(gaps):.0f} ms, "
                      f"{sum(g > 200 for g in gaps)} over 200 ms; server peak RSS {peak_rss_mb(proc.pid):.0f} MB "
                      f"(target 1,000); table: {info}", flush=True)
                if i == 1:
                    sort_and_group(page)
                    print(f"    server peak RSS after them {peak_rss_mb(proc.pid):.0f} MB", flush=True)
                page.close()
            browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


if __name__ == "__main__":
    main()
