"""``Run.log()`` cost on the training thread (issue 14, item 12; target ≤ 50 µs per call).

Logs ``--calls`` rows of ``--metrics`` metrics into a run folder under ``--dir`` (default: a temp
folder; give a folder on the disk your runs go to, since fsync cost is the disk's) and prints the
median, 99th percentile and mean time of one call, plus the load average.

    .venv/bin/python benchmarks/bench_run_log.py [--calls 20000] [--metrics 5] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--metrics", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the run folder goes (default: a temp folder)")
    args = parser.parse_args()

    import traceml_ai

    os.environ.pop("TRACEML_RUN_DIR", None)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="traceml-bench-log-", dir=args.dir) as tmp:
        names = [f"train/m{i}" for i in range(args.metrics)]
        times: list[int] = []
        with traceml_ai.Run(tmp, "bench", best={names[0]: "min"}) as run:
            for step in range(args.calls):
                values = {name: 1.0 / (step + 1 + i) for i, name in enumerate(names)}
                t0 = time.perf_counter_ns()
                run.log(step, values)
                times.append(time.perf_counter_ns() - t0)
        lines = sum(1 for _ in open(os.path.join(run.dir, "metrics.jsonl"), "rb"))
    times.sort()
    print(f"{args.calls} log() calls of {args.metrics} metrics, load average {load:.2f} ({os.cpu_count()} CPUs)")
    median, p99 = times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000
    print(f"per call: median {median:.1f} us, p99 {p99:.1f} us, "
          f"mean {statistics.fmean(times) / 1000:.1f} us, max {times[-1] / 1000:.0f} us (target median <= 50 us)")
    print(f"rows in metrics.jsonl after the run: {lines} of {args.calls}")


if __name__ == "__main__":
    main()
