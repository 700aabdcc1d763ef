"""Export figures, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_export.py``.

1. ``records_from_payload``: records per second over realistic payloads (the workloads of
   ``bench_aggregator.py``: ``mixed`` GPU-rank ticks, ``step_memory`` and ``step_time`` alone),
   measured in the CPU time of this process so that the other users of a shared machine disturb
   it less. Target: ≥ 300,000 records/s.
2. The aggregator's ingest with the ``jsonl`` exporter on all streams against no exporter, in one
   run: the same pre-encoded frames sent by 8 rank connections to a real
   ``python -m traceml_ai.aggregator`` process, the clock stopped when a reader sees every row
   committed in ``telemetry.sqlite`` (as ``bench_aggregator.py`` measures ingest), runs
   alternating between the two so that machine load hits both alike. Target: ≤ 10 % slower with
   the exporter. Each line also gives the aggregator's CPU seconds, and for the exporter the
   time from SIGTERM to a complete export (every ``<STREAM>.jsonl`` closed with its closing line).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_aggregator as agg_bench

from traceml_ai.aggregator.export import RECORD_STREAMS, records_from_payload
from traceml_ai.telemetry.envelope import make_envelope

TARGET_RECORDS_PER_S = 300_000
TARGET_SLOWDOWN = 0.10


def bench_records(seconds: float) -> None:
    print(f"records_from_payload, python {sys.version.split()[0]} (CPU time of this process)", flush=True)
    for workload in ("mixed", "step_memory", "step_time"):
        rng = random.Random(0)
        payloads = []
        for rank in range(8):
            for tick in range(1, 5):
                tables, _rows = agg_bench._tick(workload, rank, tick, 250, rng)
                payloads.append(make_envelope(agg_bench._meta(rank, 8), tables))
        records = 0
        start = time.process_time()
        while time.process_time() - start < seconds:
            for payload in payloads:
                records += len(records_from_payload(payload).records)
        cpu = time.process_time() - start
        rate = records / cpu
        mark = "ok" if rate >= TARGET_RECORDS_PER_S else "UNDER"
        print(f"  {workload:<12} {records:>9,} records in {cpu:5.2f} CPU-s = {rate:>9,.0f} records/s   "
              f"target {TARGET_RECORDS_PER_S:,}  {mark}", flush=True)


def ingest(workload: str, ranks: int, frames_per_rank: int, steps: int, exporter: bool) -> dict[str, Any]:
    """One aggregator run; returns the ingest rate (rows/s) and, with the exporter, the export figures."""
    with tempfile.TemporaryDirectory(prefix="traceml-bench-export-") as tmp:
        run_dir = Path(tmp)
        plans = [agg_bench._plan(agg_bench._frames(workload, r, ranks, 16, steps), frames_per_rank)
                 for r in range(ranks)]
        total_rows = sum(n for _, n in plans)
        extra = ["--exporter", "jsonl", "--export-streams", "all"] if exporter else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id",
             agg_bench.SESSION, "--world-size", str(ranks), *extra],
            stdout=subprocess.PIPE, text=True, env=agg_bench.aggregator_env(),
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("TRACEML_AGGREGATOR_LISTENING"):
            line = proc.stdout.readline()
        port = int(line.split()[2])
        barrier = threading.Barrier(ranks + 1)
        threads = [threading.Thread(target=agg_bench._send, args=(port, r, ranks, fs, barrier))
                   for r, (fs, _) in enumerate(plans)]
        for t in threads:
            t.start()
        process = psutil.Process(proc.pid)
        cpu0 = sum(agg_bench._thread_cpu(process).values())
        barrier.wait()
        t0 = time.perf_counter()
        db = run_dir / "aggregator" / "telemetry.sqlite"
        while agg_bench._count(db) < total_rows:
            time.sleep(0.02)
            if proc.poll() is not None:
                raise RuntimeError("aggregator exited early")
        elapsed = time.perf_counter() - t0
        cpu = sum(agg_bench._thread_cpu(process).values()) - cpu0
        for t in threads:
            t.join()
        stop = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(300)
        drained = time.perf_counter() - stop
        out: dict[str, Any] = {"rows": total_rows, "seconds": elapsed, "rate": total_rows / elapsed, "cpu": cpu,
                               "exit": code, "drain": drained}
        if exporter:
            written = 0
            dropped = set()
            for stream in RECORD_STREAMS:
                path = run_dir / "aggregator" / "export" / f"{stream}.jsonl"
                with open(path, "rb") as handle:
                    handle.seek(max(0, path.stat().st_size - 4096))
                    closing = json.loads(handle.read().splitlines()[-1])
                written += closing["written_records"]
                dropped.add(closing["dropped_batches"])
            out.update(exported=written, dropped_batches=sorted(dropped))
        return out


def bench_ingest(workload: str, ranks: int, frames: int, steps: int, rounds: int) -> None:
    print(f"aggregator ingest, workload {workload}, {ranks} ranks × {frames} frames × {steps} steps, "
          f"{os.cpu_count()} CPUs; alternating runs", flush=True)
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(rounds):
        for exporter in (False, True):
            found = ingest(workload, ranks, frames, steps, exporter)
            results[exporter].append(found)
            label = "jsonl, all streams" if exporter else "no exporter"
            note = ""
            if exporter:
                note = (f"; export complete {found['drain']:.2f} s after SIGTERM, {found['exported']:,} records, "
                        f"dropped batches {found['dropped_batches']}")
            print(f"  {label:<19} {found['rows']:>9,} rows in {found['seconds']:6.2f} s = {found['rate']:>9,.0f} rows/s"
                  f"  (aggregator CPU {found['cpu']:.2f} s){note}", flush=True)
    base = statistics.median(r["rate"] for r in results[False])
    with_export = statistics.median(r["rate"] for r in results[True])
    slowdown = 1 - with_export / base
    mark = "ok" if slowdown <= TARGET_SLOWDOWN else "OVER"
    print(f"  median ingest: {base:,.0f} rows/s without, {with_export:,.0f} rows/s with the jsonl exporter = "
          f"{slowdown:+.1%} slower   target ≤ {TARGET_SLOWDOWN:.0%}  {mark}", flush=True)
    # The aggregator's CPU per row follows the work, not the machine's load (wall rates do).
    cpu_base = statistics.median(r["cpu"] / r["rows"] for r in results[False])
    cpu_export = statistics.median(r["cpu"] / r["rows"] for r in results[True])
    print(f"  median aggregator CPU: {cpu_base * 1e6:.2f} µs/row without, {cpu_export * 1e6:.2f} µs/row with "
          f"the jsonl exporter = {cpu_export / cpu_base - 1:+.1%} CPU (the export worker's share)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per records_from_payload workload")
    parser.add_argument("--workload", choices=["mixed", "step_memory", "step_time"], default="mixed")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--frames", type=int, default=100, help="frames (sampler ticks) per rank")
    parser.add_argument("--steps", type=int, default=250, help="training steps per frame")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, alternating")
    parser.add_argument("--skip-records", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args()
    if not args.skip_records:
        bench_records(args.seconds)
    if not args.skip_ingest:
        bench_ingest(args.workload, args.ranks, args.frames, args.steps, args.rounds)


if __name__ == "__main__":
    main()
