"""Catalog benchmark (issue 6, item 8): discovery + ``list_runs()`` over 10,000 TraceML sessions
grouped by 1,000 run envelopes, cold (no parse cache) and warm (parse cache in the cache folder
beside the root). Targets: cold ≤ 3 s, warm ≤ 1 s.

Each session is a run folder as ``traceml run`` leaves it (run.json, params.yaml, config.json,
metrics.jsonl, metrics.json, logs/ checkpoints/ artifacts/, aggregator/ with manifest.json,
telemetry.sqlite, export/, final_summary.json). Each envelope names its 10 sessions (ranks 0-9 of
one job) and two attachments (a relative profiler trace and a URL). Every measurement runs in a
fresh Python process, so it includes opening the files but not importing the package (printed apart).

    .venv/bin/python benchmarks/bench_catalog.py [--envelopes 1000] [--per-envelope 10] [--repeat 3]
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

MEASURE = """
import sys, time, json
t0 = time.perf_counter()
import traceml_ai.catalog as catalog
t1 = time.perf_counter()
store = catalog.open([sys.argv[1]], cache_dir=sys.argv[2] if sys.argv[2] != "-" else None)
runs = store.list_runs()
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_list_s": t2 - t1, "runs": len(runs),
                  "sessions": sum(r.session_count for r in runs), "warnings": len(store.warnings),
                  "hits": store.cache_hits, "misses": store.cache_misses}))
"""


def write_json(path: Path, doc: object) -> None:
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


def generate(root: Path, envelopes: int, per_envelope: int) -> None:
    t_ns = 1_764_497_700_000_000_000
    for e in range(envelopes):
        job = root / f"job-{e:04d}"
        job.mkdir(parents=True)
        sessions = []
        for r in range(per_envelope):
            run = job / f"20261130-101500_job{e:04d}-rank{r}_{(e * per_envelope + r) % 65536:04x}"
            for sub in ("logs", "checkpoints", "artifacts", "aggregator/export"):
                (run / sub).mkdir(parents=True)
            sid = f"job-{e:04d}-rank-{r}"
            write_json(run / "run.json", {"schema_version": 1, "id": run.name, "name": run.name, "status": "completed",
                                          "started_at": "2026-11-30T10:15:00Z", "ended_at": "2026-11-30T11:15:00Z"})
            (run / "params.yaml").write_text("lr: 0.001\nbatch_size: 64\n", encoding="utf-8")
            write_json(run / "config.json", {"model": {"width": 256}})
            (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": {1 / (s + 1)}}}\n'
                                                       for s in range(20)), encoding="utf-8")
            write_json(run / "metrics.json", {"schema_version": 1, "step": 19, "last": {"loss": 0.05}})
            write_json(run / "aggregator" / "manifest.json", {
                "format": "traceml.session_manifest", "schema_version": 1, "session_id": sid,
                "job_id": f"job-{e:04d}", "run_id": run.name, "mode": "run", "status": "completed",
                "started_at_ns": t_ns, "ended_at_ns": t_ns + 3_600_000_000_000, "world_size": per_envelope,
                "nnodes": 1, "nproc_per_node": per_envelope, "node_rank": 0, "rank": r, "local_rank": r,
                "hostname": "node-a", "command": ["python", "train.py"], "exit_code": 0})
            (run / "aggregator" / "telemetry.sqlite").write_bytes(b"")
            (run / "aggregator" / "export" / "step_time.jsonl").write_text("{}\n", encoding="utf-8")
            write_json(run / "aggregator" / "final_summary.json", {"findings": []})
            sessions.append({"session_id": sid, "job_id": f"job-{e:04d}", "rank": r, "local_rank": r,
                             "world_size": per_envelope, "role": "rank", "metadata": {}})
        write_json(job / "stormlog_run.json", {
            "schema_version": 1, "format": "stormlog.run_envelope", "run_id": f"run-{e:04d}", "job_id": f"job-{e:04d}",
            "title": f"Job {e}", "tags": ["bench"], "sessions": sessions,
            "attachments": [
                {"attachment_id": "rank0-profiler", "kind": "profiler_trace", "storage": "reference",
                 "path": "traces/rank0.trace", "session_id": sessions[0]["session_id"], "rank": 0,
                 "metadata": {"tool": "nsys"}},
                {"attachment_id": "wandb", "kind": "experiment", "storage": "reference",
                 "url": f"https://wandb.example/team/proj/run-{e:04d}", "source_namespace": "wandb",
                 "source_ref": f"team/proj/run-{e:04d}", "metadata": {}},
            ],
            "metadata": {}})


def measure(root: Path, cache: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(root), cache], capture_output=True, text=True,
                          check=True)
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envelopes", type=int, default=1000)
    parser.add_argument("--per-envelope", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the generated folder")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="traceml-bench-catalog-"))
    root = base / "artifacts"
    cache = base / ".cache"
    try:
        t0 = time.perf_counter()
        generate(root, args.envelopes, args.per_envelope)
        print(f"generated {args.envelopes:,} envelopes x {args.per_envelope} sessions in "
              f"{time.perf_counter() - t0:.1f} s under {root}")
        colds, warms, nocache = [], [], []
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            cold = measure(root, str(cache))
            warm = measure(root, str(cache))
            plain = measure(root, "-")
            colds.append(cold["open_list_s"])
            warms.append(warm["open_list_s"])
            nocache.append(plain["open_list_s"])
        print(f"runs {int(cold['runs']):,}, sessions {int(cold['sessions']):,}, warnings {int(cold['warnings'])}; "
              f"cold read {int(cold['misses']):,} files, warm took {int(warm['hits']):,} from the cache "
              f"and read {int(warm['misses'])}")
        print(f"import traceml_ai.catalog: {cold['import_s']:.2f} s (not counted below)")
        print(f"discovery + list_runs, cold (no parse cache, writes it)  [<= 3 s]: "
              f"median {statistics.median(colds):.2f} s  (runs: {', '.join(f'{x:.2f}' for x in colds)})")
        print(f"discovery + list_runs, warm (parse cache beside the root) [<= 1 s]: "
              f"median {statistics.median(warms):.2f} s  (runs: {', '.join(f'{x:.2f}' for x in warms)})")
        print(f"discovery + list_runs, no cache at all:                         "
              f"median {statistics.median(nocache):.2f} s")
        print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
