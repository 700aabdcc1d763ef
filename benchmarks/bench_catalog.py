"""Catalog benchmark (issue 10, item 6): ``query runs`` over N real Stormlog sink sessions, TraceML
against real Stormlog 0.4.3 side by side on the same root, and the ratio. Target: TraceML at least
3x faster than Stormlog both cold (TraceML with an empty parse cache) and warm (TraceML's parse
cache filled; Stormlog has none, so it is simply run again, with the OS file cache warm).

The root: N sink folders of one session each (jobs of 8 ranks: ``job_id``, ``rank``, ``world_size``
8), as ``AppendOnlyTelemetrySink`` writes them: ``manifest.json`` (ledger + segments),
``segment-000001.jsonl`` and ``rollups.json``. One sink per job rank is written by Stormlog's own
writer; the others are byte-for-byte copies of those with the session id, rank, job and times
replaced (writing 10,000 sinks through the writer takes minutes; what is read is the same).

Each measurement is one fresh Python process doing what ``stormlog query runs`` / ``traceml query
runs`` do after their imports: open the store and list the runs (the import time is printed apart).
Both must give the same run ids, or the benchmark stops.

    .venv/bin/python benchmarks/bench_catalog.py [--sessions 10000] [--repeat 3] [--query runs|events|issues|summary]

``--query`` asks both tools for events, issues or a summary instead (same root, same check that
both give the same rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASK = """
def ask(store, what):
    import hashlib
    if what == "runs":
        runs = store.list_runs()
        return sorted(r.run_id for r in runs), sum(r.session_count for r in runs)
    rows = {"events": store.query_events, "issues": store.list_issues,
            "summary": lambda: store.summarize("peak_device_used_bytes", group_by="session-rank")}[what]()
    text = json.dumps([r.as_dict() for r in rows], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), len(rows)
"""

OURS = """
import sys, time, json
t0 = time.perf_counter()
import traceml_ai.catalog as catalog
t1 = time.perf_counter()
""" + ASK + """
store = catalog.open([sys.argv[1]], cache_dir=sys.argv[2] if sys.argv[2] != "-" else None)
runs, sessions = ask(store, sys.argv[3])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_list_s": t2 - t1, "runs": runs, "sessions": sessions,
                  "hits": store.cache_hits}))
"""

THEIRS = """
import sys, time, json
t0 = time.perf_counter()
import stormlog.query
t1 = time.perf_counter()
""" + ASK + """
store = stormlog.query.open([sys.argv[1]])
runs, sessions = ask(store, sys.argv[3])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_list_s": t2 - t1, "runs": runs, "sessions": sessions, "hits": 0}))
"""

T0 = 1_796_000_000_000_000_000
PER_JOB = 8


def _template(base: Path, rank: int) -> Path:
    """One sink session written by real Stormlog's writer."""
    from stormlog.session import create_session_summary
    from stormlog.telemetry import telemetry_event_from_record, telemetry_event_to_dict
    from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig

    folder = base / f"template-{rank}"
    sid = f"TEMPLATESID{rank}"
    sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir=folder))
    sink.start_session(create_session_summary(source="stormlog.cpu_profiler", session_id=sid, started_at_ns=T0,
                                              host="node-a", pid=4242, job_id="TEMPLATEJOB", rank=rank,
                                              local_rank=rank, world_size=PER_JOB))
    for i in range(20):
        raw = {"schema_version": 4, "session_id": sid, "timestamp_ns": T0 + i * 100_000_000, "event_type": "sample",
               "collector": "stormlog.cpu_tracker", "sampling_interval_ms": 100, "pid": 4242, "host": "node-a",
               "job_id": "TEMPLATEJOB", "rank": rank, "local_rank": rank, "world_size": PER_JOB, "device_id": -1,
               "allocator_allocated_bytes": 1 << 20, "allocator_reserved_bytes": 1 << 20,
               "allocator_active_bytes": None, "allocator_inactive_bytes": None, "allocator_change_bytes": 0,
               "device_used_bytes": 1 << 20, "device_free_bytes": None, "device_total_bytes": None, "context": None,
               "metadata": {}}
        sink.append(telemetry_event_to_dict(telemetry_event_from_record(raw)))
    sink.close()
    return folder


def generate(root: Path, sessions: int) -> None:
    templates = [_template(root.parent, r) for r in range(PER_JOB)]
    files = [{p.name: p.read_text(encoding="utf-8") for p in t.iterdir()} for t in templates]
    for i in range(sessions):
        job, rank = divmod(i, PER_JOB)
        folder = root / f"job-{job:05d}" / f"rank-{rank}"
        folder.mkdir(parents=True)
        for name, text in files[rank].items():
            text = (text.replace(f"TEMPLATESID{rank}", f"job-{job:05d}-rank-{rank}")
                    .replace("TEMPLATEJOB", f"job-{job:05d}").replace(str(T0), str(T0 + i * 1_000_000_000)))
            (folder / name).write_text(text, encoding="utf-8")
    for t in templates:
        shutil.rmtree(t)


def measure(code: str, root: Path, cache: str, what: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", code, str(root), cache, what], capture_output=True, text=True,
                          check=True)
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the generated folder")
    parser.add_argument("--query", choices=("runs", "events", "issues", "summary"), default="runs",
                        help="what both tools are asked (default runs, the issue's figure); events, issues and "
                             "summary read every segment (TraceML's parse cache does not hold events)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="traceml-bench-catalog-"))
    root = base / "artifacts"
    cache = base / "cache"
    try:
        t0 = time.perf_counter()
        generate(root, args.sessions)
        print(f"generated {args.sessions:,} sink sessions ({args.sessions // PER_JOB:,} jobs of {PER_JOB}) in "
              f"{time.perf_counter() - t0:.1f} s under {root}")
        ours_cold: list[float] = []
        ours_warm: list[float] = []
        theirs_cold: list[float] = []
        theirs_warm: list[float] = []
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            # Stormlog first: it reads every file the page cache may not hold
            first = measure(THEIRS, root, "-", args.query)
            again = measure(THEIRS, root, "-", args.query)
            cold = measure(OURS, root, str(cache), args.query)
            warm = measure(OURS, root, str(cache), args.query)
            for a in (again, cold, warm):
                if a["runs"] != first["runs"] or a["sessions"] != first["sessions"]:
                    raise SystemExit(f"TraceML and Stormlog give different {args.query}: not comparable")
            theirs_cold.append(float(first["open_list_s"]))  # type: ignore[arg-type]
            theirs_warm.append(float(again["open_list_s"]))  # type: ignore[arg-type]
            ours_cold.append(float(cold["open_list_s"]))  # type: ignore[arg-type]
            ours_warm.append(float(warm["open_list_s"]))  # type: ignore[arg-type]
        if args.query == "runs":
            print(f"runs {len(first['runs']):,}, sessions {first['sessions']:,} (the same in both); "  # type: ignore
                  f"TraceML warm took {warm['hits']:,} facts from its parse cache")
        else:
            print(f"{args.query}: {first['sessions']:,} rows, the same in both (SHA-256 of the rows' JSON)")
        print(f"import: stormlog.query {first['import_s']:.2f} s, traceml_ai.catalog {cold['import_s']:.2f} s "
              "(not counted below)")

        def line(name: str, xs: list[float]) -> float:
            m = statistics.median(xs)
            print(f"  {name:<38} median {m:6.2f} s  (runs: {', '.join(f'{x:.2f}' for x in xs)})")
            return m

        print(f"open + {args.query}:")
        sc, sw = line("Stormlog, first run", theirs_cold), line("Stormlog, run again", theirs_warm)
        oc, ow = line("TraceML, cold (empty parse cache)", ours_cold), line("TraceML, warm (parse cache)", ours_warm)
        target = " [>= 3x]" if args.query == "runs" else ""
        print(f"ratio cold (Stormlog first / TraceML cold){target}: {sc / oc:.1f}x")
        print(f"ratio warm (Stormlog again / TraceML warm){target}: {sw / ow:.1f}x")
        print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
