"""Costs of the rank-side capture runtime, printed (never asserted) (DESIGN §3.2: never slow the training).

    .venv/bin/python benchmarks/bench_capture_session.py

- ``submit``: what the training side pays per payload handed to the transport client (queue path,
  and drop-oldest path with a full queue and no aggregator);
- ``print``: one 80-character ``print`` to a file, plain and through the stdout tee;
- ``tick``: one collect of the built-in process and system sources;
- ``scan``: one runtime_environment look (garbage-collector walk for DDP/FSDP/DeepSpeed wrappers)
  with torch imported and a small model alive, and how many objects it walked;
- ``send``: envelopes per second from the client to a reading TCP peer on 127.0.0.1.
"""

from __future__ import annotations

import gc
import os
import socket
import statistics
import threading
import time
from typing import Any

from traceml_ai.capture.client import TransportClient
from traceml_ai.capture.identity import detect_identity
from traceml_ai.capture.samplers.process import ProcessSampler
from traceml_ai.capture.samplers.runtime_environment import detect
from traceml_ai.capture.samplers.stdout_stderr import TeeStream, _LineBuffer
from traceml_ai.capture.samplers.system import SystemSampler
from traceml_ai.telemetry import frames

ENVELOPE: dict[str, Any] = {
    "meta": {"session_id": "bench", "global_rank": 0, "sampler": "capture"},
    "tables": {"process": [{"seq": 1, "timestamp_unix_ns": 1, "cpu_percent": 12.5, "ram_used_bytes": 1e9}]},
}


def per_call_ns(fn: Any, n: int) -> float:
    best = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best.append((time.perf_counter_ns() - start) / n)
    return min(best)


def bench_submit() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()
    client = TransportClient(dead, "bench", {}, max_queue=1_000_000)
    print(f"submit, queue path:            {per_call_ns(lambda: client.submit(ENVELOPE), 100_000):8.0f} ns/call")
    full = TransportClient(dead, "bench", {}, max_queue=16)
    full.start()
    print(f"submit, full queue drop-oldest: {per_call_ns(lambda: full.submit(ENVELOPE), 100_000):8.0f} ns/call")
    full.close(timeout_s=0.1)


def bench_print() -> None:
    line = "x" * 80
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        tee = TeeStream(devnull, "stdout", _LineBuffer(10_000_000))
        plain = per_call_ns(lambda: print(line, file=devnull), 100_000)
        teed = per_call_ns(lambda: print(line, file=tee), 100_000)
    print(f"print 80 chars, plain:          {plain:8.0f} ns/line")
    print(f"print 80 chars, through tee:    {teed:8.0f} ns/line  (+{teed - plain:.0f} ns)")


def bench_tick() -> None:
    process, system = ProcessSampler(0), SystemSampler()
    samples = []
    for seq in range(50):
        start = time.perf_counter_ns()
        process.collect(seq, 0)
        system.collect(seq, 0)
        samples.append(time.perf_counter_ns() - start)
        time.sleep(0.01)
    print(f"tick, process + system collect: {statistics.median(samples) / 1000:8.0f} µs (median of 50)")


def bench_scan() -> None:
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(50)])
    ident = detect_identity({})
    samples = []
    for _ in range(5):
        start = time.perf_counter_ns()
        detect(ident)
        samples.append(time.perf_counter_ns() - start)
    print(f"runtime_environment look:       {statistics.median(samples) / 1e6:8.1f} ms over "
          f"{len(gc.get_objects())} gc objects (torch imported, {len(list(model.modules()))} modules)")


def bench_send(n: int = 20_000) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    got = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        reader = frames.FrameReader()
        count = 0
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            reader.feed(chunk)
            for body in reader.bodies():
                kind = frames.control_kind(body)
                if kind == frames.HELLO:
                    conn.sendall(frames.encode_frame(frames.welcome()))
                elif kind is None:
                    count += 1
                    if count == n:
                        got.set()

    threading.Thread(target=serve, daemon=True).start()
    client = TransportClient(listener.getsockname(), "bench", {}, max_queue=n)
    client.start()
    start = time.perf_counter()
    for _ in range(n):
        client.submit(ENVELOPE)
    got.wait(60)
    elapsed = time.perf_counter() - start
    client.close(timeout_s=2)
    print(f"send to a reading peer:         {n / elapsed:8.0f} envelopes/s ({client.dropped_batches} dropped)")


if __name__ == "__main__":
    bench_submit()
    bench_print()
    bench_tick()
    bench_scan()
    bench_send()
