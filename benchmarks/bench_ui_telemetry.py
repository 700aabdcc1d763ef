"""How long ``GET /api/runs/{key}/telemetry`` takes to build (a first read) and to answer again from
its cache (a finished run polled), for a synthetic 4-rank run of 20,000 steps.

Run: ``.venv/bin/python benchmarks/bench_ui_telemetry.py``. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.diagnose.telemetry_db import RunSpec, write_run

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.telemetry import TelemetryViews


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        generate(root, runs=1, seed=0)
        run_dir = next(root.iterdir())
        t = time.perf_counter()
        write_run(run_dir, RunSpec(ranks=4, steps=20_000, gpu=True, interval_s=1.0))
        print(f"wrote 4 ranks x 20,000 steps in {time.perf_counter() - t:.1f} s")
        store = RunStore([root])
        store.poll()
        run = store.runs()[0]
        views = TelemetryViews()
        t = time.perf_counter()
        payload = views.payload(run)
        first = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(100):
            views.payload(run)
        cached = (time.perf_counter() - t) / 100
        size = len(orjson.dumps(payload))
        print(f"first answer: {first * 1000:.0f} ms; cached answer: {cached * 1000:.2f} ms; "
              f"{size / 1024:.0f} KiB of JSON; step chart {len(payload['steps']['x'])} points")


if __name__ == "__main__":
    main()
