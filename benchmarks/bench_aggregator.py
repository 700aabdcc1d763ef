"""Aggregator ingest figures, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_aggregator.py``.

End to end: rank connections (real TCP sockets on 127.0.0.1) send pre-encoded frames as fast as
they can to a real ``python -m traceml_ai.aggregator`` process; the clock stops when a read-only
reader sees every row committed in ``telemetry.sqlite``. Target (issue 11 item 8): ≥ 150,000 rows/s
of the realistic mixed stream on the 2-core development machine; the single-stream workloads are
printed against the same figure.

Workloads (rows as the capture side makes them, DESIGN §3.1):

- ``mixed``: what a GPU training rank sends each sampler tick, one envelope per tick: per training
  step one ``step_time`` row (the six built-in phases on the rank's GPU, ``cuda:<local_rank>`` as
  under torchrun: ``dataloader_next`` timed on the CPU only, the others with CUDA-event
  milliseconds at float32 precision and CPU milliseconds from nanoseconds) and one ``step_memory``
  row; per tick one ``process`` row, on local rank 0 one ``system`` row with one ``gpus`` item per
  local GPU, a few stdout lines, and the ``runtime_environment`` row in the rank's first tick;
- ``step_memory`` and ``step_time``: the lightest and the heaviest stream alone.

Each rank pre-encodes ``--distinct`` frames and sends them in turn until it has sent its frames
(the aggregator never compares rows, so repeats cost it what new rows would). The clock includes
the last flush (rows wait up to 0.5 s to commit), so each workload sends enough rows for several
seconds of work (``DEFAULT_FRAMES``) and that wait is a small part of it.

The machine is shared, so each line also gives the aggregator's own CPU time, split into its
main thread (the asyncio server reading the sockets) and the others (the SQLite writer thread,
which decodes, projects and writes), rows per CPU-second, a figure that other processes disturb
less than wall time does, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from traceml_ai.aggregator.store import open_readonly
from traceml_ai.telemetry import frames, jobsecret, schema
from traceml_ai.telemetry.envelope import make_envelope

TARGET_ROWS_PER_S = 150_000
DEFAULT_FRAMES = {"mixed": 200, "step_memory": 1000, "step_time": 200}
"""Frames per rank of each workload: 0.8, 2 and 0.4 million rows with the default 8 ranks."""
SESSION = "bench-session"
SECRET = "bench-job-secret-0123456789abcdef"
"""The job secret the benchmark gives its aggregator (``TRACEML_JOB_SECRET``) and signs hellos with."""
GPUS_PER_NODE = 8
_F32 = struct.Struct("<f")


def _meta(rank: int, world_size: int) -> dict[str, Any]:
    local = rank % GPUS_PER_NODE
    return {"session_id": SESSION, "global_rank": rank, "local_rank": local, "world_size": world_size,
            "local_world_size": min(world_size, GPUS_PER_NODE), "node_rank": rank // GPUS_PER_NODE,
            "hostname": f"gpu-node-{rank // GPUS_PER_NODE:02d}", "pid": 4000 + rank, "sampler": "capture"}


def _f32(value: float) -> float:
    """``value`` at float32 precision, as ``torch.cuda.Event.elapsed_time`` reports milliseconds."""
    return float(_F32.unpack(_F32.pack(value))[0])


def _events(rng: random.Random, device: str) -> dict[str, Any]:
    """One step's ``events`` map as ``capture.timing`` makes it on a GPU rank (ms)."""
    out: dict[str, Any] = {}
    for phase in schema.BUILTIN_PHASES:
        cpu_ms = rng.randrange(20_000, 9_000_000) / 1e6  # perf_counter_ns difference / 1e6
        if phase == "traceml:dataloader_next":
            stats = {"is_gpu": False, "duration_ms": cpu_ms, "cpu_ms": cpu_ms, "gpu_ms": None, "n_calls": 1}
        else:
            gpu_ms = _f32(rng.uniform(0.05, 40.0))
            stats = {"is_gpu": True, "duration_ms": gpu_ms, "cpu_ms": cpu_ms, "gpu_ms": gpu_ms, "n_calls": 1}
        out[phase] = {device: stats}
    return out


def _tick(workload: str, rank: int, tick: int, steps: int, rng: random.Random) -> tuple[dict[str, Any], int]:
    """The tables of one sampler tick (``steps`` training steps) and how many table rows they make."""
    now = 1_764_500_000_000_000_000 + tick * 1_000_000_000
    first = tick * steps
    device = f"cuda:{rank % GPUS_PER_NODE}"
    st = [{"seq": tick, "timestamp_unix_ns": now + i * 3_999_917, "step": first + i, "events": _events(rng, device)}
          for i in range(steps)]
    mem = [{"seq": tick, "timestamp_unix_ns": now + i * 3_999_917, "device": device, "step": first + i,
            "peak_alloc_bytes": float(11_811_160_064 + rng.randrange(0, 1 << 20) * 512),
            "peak_reserved_bytes": float(14_000_000_000 + rng.randrange(0, 1 << 12) * 2_097_152)}
           for i in range(steps)]
    if workload == "step_time":
        return {"step_time": st}, steps
    if workload == "step_memory":
        return {"step_memory": mem}, steps
    tables: dict[str, Any] = {"step_time": st, "step_memory": mem}
    rows = 2 * steps
    tables["process"] = [{
        "seq": tick, "timestamp_unix_ns": now, "cpu_percent": round(rng.uniform(95, 140), 1),
        "cpu_logical_core_count": 96, "ram_used_bytes": float(rng.randrange(8, 12) << 30),
        "ram_total_bytes": float(1 << 40), "gpu_available": True, "gpu_count": GPUS_PER_NODE,
        "gpu_device_index": rank % GPUS_PER_NODE, "gpu_mem_used_bytes": float(rng.randrange(60, 70) << 30),
        "gpu_mem_reserved_bytes": float(72 << 30), "gpu_mem_total_bytes": float(80 << 30)}]
    rows += 1
    if rank % GPUS_PER_NODE == 0:
        gpus = [{"util": float(rng.randrange(70, 101)), "mem_used_bytes": float(rng.randrange(60, 70) << 30),
                 "mem_total_bytes": float(80 << 30), "temperature_c": float(rng.randrange(55, 80)),
                 "power_usage_w": rng.uniform(250, 690), "power_limit_w": 700.0} for _ in range(GPUS_PER_NODE)]
        tables["system"] = [{
            "seq": tick, "timestamp_unix_ns": now, "cpu_percent": round(rng.uniform(20, 60), 1),
            "ram_used_bytes": float(rng.randrange(100, 200) << 30), "ram_total_bytes": float(2 << 40),
            "gpu_available": True, "gpu_count": GPUS_PER_NODE, "gpus": gpus}]
        rows += 1 + GPUS_PER_NODE
    lines = max(1, steps // 50)
    tables["stdout_stderr"] = [
        {"timestamp_unix_ns": now + i, "line": f"epoch 3 step {first + i * 50}: loss {rng.uniform(0.1, 2):.4f} "
                                               f"lr 3.0e-04 grad_norm {rng.uniform(0.1, 5):.3f}\n",
         "stream": "stdout"} for i in range(lines)]
    rows += lines
    if tick == 0:
        tables["runtime_environment"] = [{
            "seq": 0, "timestamp_unix_ns": now, "topology": "multi_node", "distributed_initialized": True,
            "distributed_backend": "nccl", "training_strategy": "ddp", "strategy_source": "model_wrapper",
            "strategy_confidence": "high"}]
        rows += 1
    return tables, rows


def _frames(workload: str, rank: int, world_size: int, distinct: int, steps: int) -> list[tuple[bytes, int]]:
    rng = random.Random(rank)
    out = []
    for tick in range(distinct):
        tables, rows = _tick(workload, rank, tick, steps, rng)
        out.append((frames.encode_frame(make_envelope(_meta(rank, world_size), tables)), rows))
    return out


def _plan(encoded: list[tuple[bytes, int]], count: int) -> tuple[list[bytes], int]:
    """``count`` frames taken in turn from ``encoded`` (tick 0, with runtime_environment, only once)."""
    sent = [encoded[0]] + [encoded[1 + i % (len(encoded) - 1)] for i in range(count - 1)]
    return [data for data, _ in sent], sum(rows for _, rows in sent)


def aggregator_env() -> dict[str, str]:
    """The environment of the benchmark's aggregator process: this one's plus the job secret."""
    return {**os.environ, jobsecret.ENV_JOB_SECRET: SECRET}


def _next_body(sock: socket.socket, reader: frames.FrameReader) -> Any:
    while True:
        for body in reader.bodies():
            return body
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("the aggregator closed the connection during the handshake")
        reader.feed(chunk)


def _send(port: int, rank: int, world_size: int, payload: list[bytes], start: threading.Barrier) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    ident = {k: v for k, v in _meta(rank, world_size).items() if k != "session_id"}
    reader = frames.FrameReader()
    challenge = frames.challenge_value(_next_body(sock, reader))
    if challenge is None:
        raise RuntimeError("the aggregator's first frame is not a challenge")
    sock.sendall(frames.encode_frame(frames.hello(SESSION, ident, SECRET, challenge)))
    answer = _next_body(sock, reader)
    if frames.control_kind(answer) != frames.WELCOME:
        raise RuntimeError(f"the aggregator did not welcome rank {rank}: {answer!r}")
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


def _thread_cpu(process: psutil.Process) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``process``, by thread id."""
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def run(workload: str, ranks: int, frames_per_rank: int, distinct: int, steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="traceml-bench-agg-") as tmp:
        run_dir = Path(tmp)
        plans = [_plan(_frames(workload, r, ranks, distinct, steps), frames_per_rank) for r in range(ranks)]
        total_rows = sum(n for _, n in plans)
        total_bytes = sum(len(f) for fs, _ in plans for f in fs)
        proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
             "--world-size", str(ranks)],
            stdout=subprocess.PIPE, text=True, env=aggregator_env(),
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("TRACEML_AGGREGATOR_LISTENING"):
            line = proc.stdout.readline()
        port = int(line.split()[2])
        barrier = threading.Barrier(ranks + 1)
        threads = [threading.Thread(target=_send, args=(port, r, ranks, fs, barrier)) for r, (fs, _) in
                   enumerate(plans)]
        for t in threads:
            t.start()
        agg = psutil.Process(proc.pid)
        load0 = os.getloadavg()[0]
        cpu0 = _thread_cpu(agg)
        barrier.wait()
        t0 = time.perf_counter()
        db = run_dir / "aggregator" / "telemetry.sqlite"
        while _count(db) < total_rows:
            time.sleep(0.05)
            if proc.poll() is not None:
                raise RuntimeError("aggregator exited early")
        elapsed = time.perf_counter() - t0
        cpu1 = _thread_cpu(agg)
        main_cpu = cpu1.get(proc.pid, 0.0) - cpu0.get(proc.pid, 0.0)
        cpu = sum(cpu1.values()) - sum(cpu0.values())
        load1 = os.getloadavg()[0]
        for t in threads:
            t.join()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        rate = total_rows / elapsed
        mark = "ok" if rate >= TARGET_ROWS_PER_S else "UNDER"
        print(f"{workload:<12} {ranks} ranks × {frames_per_rank} frames × {steps} steps: {total_rows:>9,} rows "
              f"({total_bytes / 1e6:5.1f} MB) in {elapsed:6.2f} s = {rate:>9,.0f} rows/s   "
              f"target {TARGET_ROWS_PER_S:,}  {mark}", flush=True)
        print(f"{'':<12} aggregator CPU {cpu:.2f} s (main thread {main_cpu:.2f} s, writer {cpu - main_cpu:.2f} s) "
              f"= {total_rows / max(cpu, 1e-9):,.0f} rows per CPU-second; "
              f"load average {load0:.1f} → {load1:.1f}; exit {code}; "
              f"warning file: {(run_dir / 'aggregator' / 'finalization_warning.json').exists()}", flush=True)
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--frames", type=int, default=None,
                        help=f"frames (sampler ticks) per rank; default by workload {DEFAULT_FRAMES}")
    parser.add_argument("--distinct", type=int, default=16, help="distinct pre-encoded frames per rank")
    parser.add_argument("--steps", type=int, default=250, help="training steps per frame")
    parser.add_argument("--workload", choices=["mixed", "step_memory", "step_time", "all"], default="all")
    args = parser.parse_args()
    if args.distinct < 2 or (args.frames is not None and args.frames < 1):
        parser.error("--distinct must be at least 2 and --frames at least 1")
    print(f"aggregator ingest, {os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)
    workloads = ["mixed", "step_memory", "step_time"] if args.workload == "all" else [args.workload]
    for workload in workloads:
        run(workload, args.ranks, args.frames or DEFAULT_FRAMES[workload], args.distinct, args.steps)


if __name__ == "__main__":
    main()
