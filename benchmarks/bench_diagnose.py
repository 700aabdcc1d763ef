"""Diagnose and compare figures, printed (never asserted). Run: ``.venv/bin/python benchmarks/bench_diagnose.py``.

Builds real telemetry.sqlite files (the seven tables of ``traceml_ai.telemetry.schema``) holding
``--steps`` steps for each of ``--ranks`` ranks (six built-in phases per step, one step_memory row
per step) and one process snapshot per rank plus one system snapshot every 50 steps, then times
``diagnose`` (read + every rule + summary) and ``compare`` of two such runs.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from traceml_ai.diagnose import compare, diagnose
from traceml_ai.telemetry import schema

T0 = 1_764_000_000_000_000_000
PHASES = {schema.DATALOADER_NEXT: 1.0, schema.H2D: 0.1, schema.FORWARD: 4.0, schema.BACKWARD: 7.0,
          schema.OPTIMIZER_STEP: 2.0}


def build(path: Path, steps: int, ranks: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    for table in schema.TABLES:
        conn.execute(table.create_sql())
    ident = ("node", )
    step_rows, mem_rows, proc_rows, sys_rows = [], [], [], []
    for rank in range(ranks):
        t = T0
        for step in range(steps):
            ph = {k: v * scale * (1 + 0.05 * rng.standard_normal()) for k, v in PHASES.items()}
            total = sum(ph.values()) + 0.5
            t += int(total * 1e6)
            events = {k: {"cpu": {"is_gpu": False, "duration_ms": v, "cpu_ms": v, "gpu_ms": None, "n_calls": 1}}
                      for k, v in {**ph, schema.STEP: total}.items()}
            head = (T0, rank, rank, rank, ranks, ranks, 0, *ident)
            step_rows.append((*head, t, step, step, orjson.dumps(events).decode()))
            mem_rows.append((*head, t, step, "cpu", step, None, None))
            if step % 50 == 0:
                proc_rows.append((*head, t, step, 100.0, 8, 9e8, 6.4e10, 0, 0, None, None, None, None))
                if rank == 0:
                    sys_rows.append((T0, 0, 0, ranks, ranks, 0, *ident, t, step, 60.0, 2e10, 6.4e10, 0, 0))
    conn.executemany(schema.STEP_TIME_SAMPLES.insert_sql(), step_rows)
    conn.executemany(schema.STEP_MEMORY_SAMPLES.insert_sql(), mem_rows)
    conn.executemany(schema.PROCESS_SAMPLES.insert_sql(), proc_rows)
    conn.executemany(schema.SYSTEM_SAMPLES.insert_sql(), sys_rows)
    conn.commit()
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a = Path(tmp) / "a" / "aggregator" / "telemetry.sqlite"
        b = Path(tmp) / "b" / "aggregator" / "telemetry.sqlite"
        build(a, args.steps, args.ranks, 1.0, 1)
        build(b, args.steps, args.ranks, 1.1, 2)
        rows = args.steps * args.ranks
        t0 = time.perf_counter()
        summary = diagnose(a)
        t1 = time.perf_counter()
        result = compare(a.parents[1], b.parents[1])
        t2 = time.perf_counter()
        print(f"diagnose: {rows:,} step rows ({args.ranks} ranks x {args.steps:,} steps) in {t1 - t0:.2f} s "
              f"({rows / (t1 - t0):,.0f} step rows/s); findings: {[f.kind for f in summary.findings]}")
        verdict = next(m for m in result.metrics if m.metric == "step_time_ms")
        print(f"compare: two such runs in {t2 - t1:.2f} s; step_time_ms {verdict.verdict} "
              f"({verdict.change_pct:+.1f}%)")


if __name__ == "__main__":
    main()
