"""Step-time overhead of TraceML's step capture on CPU training steps (DESIGN §3.1).

Runs one training loop (DataLoader over a TensorDataset, an MLP, MSE loss, backward, SGD step) in
two modes, interleaved in blocks within one process so that both see the same machine state:

- ``plain``: the loop as a user writes it, on untouched torch (``instrument.uninstall()`` puts the
  originals back before each plain block);
- ``traced``: the same loop inside ``trace_step`` (the tracer that ``traceml_ai.trace_step`` drives,
  with every automatic phase: dataloader, forward, backward, optimizer, step) plus a background
  thread that collects the ``step_time`` and ``step_memory`` sources every 0.1 s, as the capture
  session's sampler thread would (10x more often than the session's default 1 s).

The batch size is calibrated so that a plain step takes about the target time (10 ms and 1 ms by
default). For each mode it prints the median time of one iteration (fetch included) and the overhead
of ``traced`` over ``plain`` in percent, against the targets (<= 1 % at 10 ms, <= 5 % at 1 ms).

    .venv/bin/python benchmarks/bench_capture_overhead.py [--rounds 30] [--block 20]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from traceml_ai.capture import instrument
from traceml_ai.capture.steps import StepTracer

TARGETS = ((10.0, 1.0), (1.0, 5.0))  # (step ms, overhead % target)


def make_loop(batch: int, width: int, steps: int) -> tuple[nn.Module, Callable[[Any], list[int]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = DataLoader(TensorDataset(torch.randn(batch * steps, 64), torch.randn(batch * steps, 1)), batch_size=batch)

    def run(scope: Callable[[], Any]) -> list[int]:
        times = []
        last = time.perf_counter_ns()
        for x, y in data:
            with scope():
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            now = time.perf_counter_ns()
            times.append(now - last)
            last = now
        return times[1:]  # the first iteration includes creating the iterator

    return model, run


def calibrate(target_ms: float, width: int) -> int:
    """A batch size whose plain step takes about ``target_ms`` (step time is close to linear in it)."""
    batch = 16
    for _ in range(4):
        _, run = make_loop(batch, width, 30)
        median_ms = statistics.median(run(contextlib.nullcontext)) / 1e6
        if abs(median_ms - target_ms) <= 0.1 * target_ms:
            break
        batch = max(1, round(batch * target_ms / median_ms))
    return batch


class Collector:
    """Collects both sources every ``interval`` s on a background thread, like the session's sampler."""

    def __init__(self, tracer: StepTracer, interval: float = 0.1) -> None:
        self.tracer = tracer
        self.interval = interval
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Collector:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seq = 0
        while not self._stop.wait(self.interval):
            seq += 1
            now = time.time_ns()
            self.rows += len(self.tracer.time_source.collect(seq, now))
            self.rows += len(self.tracer.memory_source.collect(seq, now))
        now = time.time_ns()
        self.rows += len(self.tracer.time_source.collect_final(seq + 1, now))
        self.rows += len(self.tracer.memory_source.collect(seq + 1, now))


def bench(target_ms: float, goal_pct: float, rounds: int, block: int, interval: float) -> None:
    width = 512 if target_ms >= 5 else 64
    batch = calibrate(target_ms, width)
    model, run = make_loop(batch, width, block + 1)
    tracer = StepTracer(echo_notes=False)
    collector = Collector(tracer, interval) if interval > 0 else contextlib.nullcontext()
    samples: dict[str, list[int]] = {"plain": [], "traced": []}

    def traced_scope() -> Any:
        return tracer.step(model)

    run(contextlib.nullcontext)
    with collector:
        run(traced_scope)  # warm-up: patches installed, pools and caches filled
    for i in range(rounds):
        order = ("plain", "traced") if i % 2 == 0 else ("traced", "plain")
        for mode in order:
            if mode == "plain":
                # Untouched torch: the originals go back; the traced block's first step puts
                # TraceML's patches in again.
                instrument.uninstall()
                samples[mode].extend(run(contextlib.nullcontext))
            else:
                with collector:
                    samples[mode].extend(run(traced_scope))
    plain = statistics.median(samples["plain"]) / 1e6
    traced = statistics.median(samples["traced"]) / 1e6
    overhead = (traced - plain) / plain * 100
    verdict = "ok" if overhead <= goal_pct else "OVER TARGET"
    print(
        f"~{target_ms:g} ms steps (batch {batch}, width {width}, {len(samples['plain'])} steps per mode): "
        f"plain median {plain:.3f} ms, traced median {traced:.3f} ms, overhead {overhead:+.2f} % "
        f"(target <= {goal_pct:g} %: {verdict}); rows collected {getattr(collector, 'rows', 0)}, "
        f"dropped {tracer.time_source.dropped_steps}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per step size")
    parser.add_argument("--block", type=int, default=20, help="steps per mode per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--interval", type=float, default=0.1, help="collect period in s (0: no collecting thread)")
    parser.add_argument("--only", type=float, default=None, help="run only this target step time in ms")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} intra-op thread(s)")
    for target_ms, goal_pct in TARGETS:
        if args.only is None or args.only == target_ms:
            bench(target_ms, goal_pct, args.rounds, args.block, args.interval)


if __name__ == "__main__":
    main()
