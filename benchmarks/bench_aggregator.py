"""Aggregator ingest figures, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_aggregator.py``.

End to end: several rank connections (real TCP sockets on 127.0.0.1) send pre-encoded batch frames
as fast as they can to a real ``python -m traceml_ai.aggregator`` process; the clock stops when a
read-only reader sees every row committed in ``telemetry.sqlite``. Target: ≥ 200,000 rows/s on the
2-core development machine (DESIGN §7b measured 250–330k rows/s for SQLite inserts alone).

Workloads: ``mixed`` is what a training rank sends per step (one step_time row with the six built-in
phases, one step_memory row) plus a process row, a system row with one GPU and a stdout line every
ten steps; ``step_memory`` and ``step_time`` are the lightest and heaviest single streams.

The machine is shared, so each line also gives the aggregator's own CPU time and rows per
CPU-second, a figure that other processes disturb less than wall time does. The clock includes the
last flush (rows wait up to 0.5 s to commit), so short runs understate the steady rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from traceml_ai.aggregator.store import open_readonly
from traceml_ai.telemetry import frames, schema
from traceml_ai.telemetry.envelope import make_envelope

TARGET_ROWS_PER_S = 200_000
SESSION = "bench-session"


def _meta(rank: int, world_size: int) -> dict[str, Any]:
    return {"session_id": SESSION, "global_rank": rank, "local_rank": rank, "world_size": world_size,
            "local_world_size": world_size, "node_rank": 0, "hostname": "bench", "pid": 100 + rank,
            "sampler": "bench"}


def _events(step: int) -> dict[str, Any]:
    return {p: {"cpu": {"is_gpu": False, "duration_ms": 1.0 + step % 7, "cpu_ms": 1.0 + step % 7, "gpu_ms": None,
                        "n_calls": 1}} for p in schema.BUILTIN_PHASES}


def _tables(workload: str, first_step: int, steps: int) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Rows of ``steps`` training steps and how many table rows they project to."""
    now = time.time_ns()
    st = [{"seq": s, "timestamp_unix_ns": now + s, "step": s, "events": _events(s)}
          for s in range(first_step, first_step + steps)]
    mem = [{"seq": s, "timestamp_unix_ns": now + s, "device": "cuda:0", "step": s, "peak_alloc_bytes": 1e9 + s,
            "peak_reserved_bytes": 2e9 + s} for s in range(first_step, first_step + steps)]
    if workload == "step_time":
        return {"step_time": st}, steps
    if workload == "step_memory":
        return {"step_memory": mem}, steps
    ticks = range(first_step, first_step + steps, 10)
    proc = [{"seq": s, "timestamp_unix_ns": now + s, "cpu_percent": 99.5, "cpu_logical_core_count": 2,
             "ram_used_bytes": 2e9, "ram_total_bytes": 8e9, "gpu_available": 1, "gpu_count": 1,
             "gpu_device_index": 0, "gpu_mem_used_bytes": 3e9, "gpu_mem_reserved_bytes": 4e9,
             "gpu_mem_total_bytes": 8e10} for s in ticks]
    system = [{"seq": s, "timestamp_unix_ns": now + s, "cpu_percent": 50.0, "ram_used_bytes": 2e9,
               "ram_total_bytes": 8e9, "gpu_available": 1, "gpu_count": 1,
               "gpus": [{"util": 90.0, "mem_used_bytes": 3e9, "mem_total_bytes": 8e10, "temperature_c": 60.0,
                         "power_usage_w": 300.0, "power_limit_w": 400.0}]} for s in ticks]
    out = [{"timestamp_unix_ns": now + s, "line": f"step {s} loss 0.{s % 1000:03d}", "stream": "stdout"}
           for s in ticks]
    tables = {"step_time": st, "step_memory": mem, "process": proc, "system": system, "stdout_stderr": out}
    return tables, 2 * steps + 4 * len(ticks)


def _frames(workload: str, rank: int, world_size: int, batches: int, steps: int) -> tuple[list[bytes], int]:
    out, rows = [], 0
    for b in range(batches):
        tables, n = _tables(workload, b * steps, steps)
        out.append(frames.encode_frame(make_envelope(_meta(rank, world_size), tables)))
        rows += n
    return out, rows


def _send(port: int, rank: int, world_size: int, payload: list[bytes], start: threading.Barrier) -> None:
    import socket

    sock = socket.create_connection(("127.0.0.1", port))
    ident = {k: v for k, v in _meta(rank, world_size).items() if k != "session_id"}
    sock.sendall(frames.encode_frame(frames.hello(SESSION, ident)))
    reader = frames.FrameReader()
    while not list(reader.bodies()):
        reader.feed(sock.recv(4096))
    start.wait()
    for data in payload:
        sock.sendall(data)
    sock.sendall(frames.encode_frame(frames.rank_finished(ident, len(payload), 0)))
    sock.close()


def _count(db: Path) -> int:
    """Rows committed so far: AUTOINCREMENT keeps each table's last id in sqlite_sequence, which
    is one tiny table to read, where count(*) would scan the growing tables and slow the writer."""
    if not db.exists():
        return 0
    try:
        conn = open_readonly(db)
        try:
            return int(conn.execute("SELECT coalesce(sum(seq), 0) FROM sqlite_sequence").fetchone()[0])
        finally:
            conn.close()
    except Exception:
        return 0


def run(workload: str, ranks: int, batches: int, steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="traceml-bench-agg-") as tmp:
        run_dir = Path(tmp)
        encoded = [_frames(workload, r, ranks, batches, steps) for r in range(ranks)]
        total_rows = sum(n for _, n in encoded)
        total_bytes = sum(len(f) for fs, _ in encoded for f in fs)
        proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
             "--world-size", str(ranks)],
            stdout=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("TRACEML_AGGREGATOR_LISTENING"):
            line = proc.stdout.readline()
        port = int(line.split()[2])
        barrier = threading.Barrier(ranks + 1)
        threads = [threading.Thread(target=_send, args=(port, r, ranks, fs, barrier)) for r, (fs, _) in
                   enumerate(encoded)]
        for t in threads:
            t.start()
        agg = psutil.Process(proc.pid)
        cpu0 = sum(agg.cpu_times()[:2])
        barrier.wait()
        t0 = time.perf_counter()
        db = run_dir / "aggregator" / "telemetry.sqlite"
        while _count(db) < total_rows:
            time.sleep(0.05)
            if proc.poll() is not None:
                raise RuntimeError("aggregator exited early")
        elapsed = time.perf_counter() - t0
        cpu = sum(agg.cpu_times()[:2]) - cpu0
        for t in threads:
            t.join()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        rate = total_rows / elapsed
        mark = "ok" if rate >= TARGET_ROWS_PER_S else "UNDER"
        print(f"{workload:<12} {ranks} ranks × {batches} frames × {steps} steps: {total_rows:>9,} rows "
              f"({total_bytes / 1e6:5.1f} MB) in {elapsed:6.2f} s = {rate:>9,.0f} rows/s   "
              f"target {TARGET_ROWS_PER_S:,}  {mark}", flush=True)
        print(f"{'':<12} aggregator CPU {cpu:.2f} s = {total_rows / max(cpu, 1e-9):,.0f} rows per CPU-second; "
              f"load average {os.getloadavg()[0]:.1f}; exit {code}; "
              f"warning file: {(run_dir / 'aggregator' / 'finalization_warning.json').exists()}", flush=True)
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batches", type=int, default=100, help="frames per rank")
    parser.add_argument("--steps", type=int, default=500, help="training steps per frame")
    parser.add_argument("--workload", choices=["mixed", "step_memory", "step_time", "all"], default="all")
    args = parser.parse_args()
    print(f"aggregator ingest, {os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)
    workloads = ["mixed", "step_memory", "step_time"] if args.workload == "all" else [args.workload]
    for workload in workloads:
        run(workload, args.ranks, args.batches, args.steps)


if __name__ == "__main__":
    main()
