"""Small, readable on-disk fixtures for the catalog tests: envelopes, sidecars, TraceML run folders
and telemetry JSONL files, written the way their writers do. Stormlog's own artifacts (sinks,
bundles, tracker outputs) are made by real Stormlog: see ``stormlog_real.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEED_MINIMAL_ENVELOPE = """{
  "schema_version": 1,
  "format": "stormlog.run_envelope",
  "run_id": "run-train-42",
  "job_id": "train-42",
  "sessions": [
    {
      "session_id": "session-rank-0",
      "job_id": "train-42",
      "rank": 0,
      "local_rank": 0,
      "world_size": 8,
      "role": "rank",
      "metadata": {}
    }
  ],
  "attachments": [
    {
      "attachment_id": "rank0-profiler",
      "title": "Rank 0 profiler trace",
      "kind": "profiler_trace",
      "storage": "reference",
      "path": "traces/rank0.trace",
      "session_id": "session-rank-0",
      "job_id": "train-42",
      "rank": 0,
      "metadata": {"tool": "nsys"}
    }
  ],
  "metadata": {}
}
"""
"""The 004 seed's minimal example, verbatim."""


def write_json(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


def envelope(folder: Path, run_id: str, sessions: Sequence[str | dict[str, Any]] = (),
             attachments: Sequence[dict[str, Any]] = (), **extra: Any) -> Path:
    """``<folder>/stormlog_run.json`` naming ``sessions`` (ids or full objects)."""
    doc = {"schema_version": 1, "format": "stormlog.run_envelope", "run_id": run_id,
           "sessions": [s if isinstance(s, dict) else {"session_id": s, "metadata": {}} for s in sessions],
           "attachments": list(attachments), "metadata": {}, **extra}
    return write_json(folder / "stormlog_run.json", doc)


def traceml_session(folder: Path, session_id: str, *, job_id: str | None = None, rank: int | None = 0,
                    world_size: int = 1, status: str = "completed", started_at_ns: int = 1_000,
                    ended_at_ns: int | None = 2_000, final_summary: bool = True) -> Path:
    """A TraceML run folder as ``traceml run`` leaves it: run.json, metrics.jsonl, and aggregator/
    with manifest.json, telemetry.sqlite, export/ and final_summary.json."""
    agg = folder / "aggregator"
    (agg / "export").mkdir(parents=True, exist_ok=True)
    write_json(folder / "run.json", {"schema_version": 1, "id": folder.name, "status": "completed"})
    (folder / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n', encoding="utf-8")
    write_json(agg / "manifest.json", {
        "format": "traceml.session_manifest", "schema_version": 1, "session_id": session_id, "job_id": job_id,
        "run_id": folder.name, "mode": "run", "status": status, "started_at_ns": started_at_ns,
        "ended_at_ns": ended_at_ns, "world_size": world_size, "nnodes": 1, "nproc_per_node": world_size,
        "node_rank": 0, "rank": rank, "local_rank": rank, "hostname": "node-a", "command": ["python", "t.py"],
        "exit_code": 0})
    (agg / "telemetry.sqlite").write_bytes(b"")
    (agg / "export" / "step_time.jsonl").write_text('{"session_id": "not-a-stormlog-session"}\n', encoding="utf-8")
    if final_summary:
        write_json(agg / "final_summary.json", {"findings": []})
    return folder


def telemetry_jsonl(path: Path, session_id: str, *, job_id: str | None = None, rank: int | None = None,
                    world_size: int | None = None, ended: bool = True) -> Path:
    """A telemetry JSONL file of legacy records (as Stormlog reads them): a ``start`` event with the
    identity, a sample, and a ``stop`` event when ``ended`` (the session is then ``completed``)."""
    ident = {k: v for k, v in (("job_id", job_id), ("rank", rank), ("local_rank", rank),
                               ("world_size", world_size)) if v is not None}
    lines = [{"session_id": session_id, "timestamp_ns": 10, "event_type": "start", "host": "node-a", "pid": 7,
              "memory_allocated": 1024, **ident},
             {"session_id": session_id, "timestamp_ns": 20, "event_type": "sample", "memory_allocated": 2048, **ident}]
    if ended:
        lines.append({"session_id": session_id, "timestamp_ns": 30, "event_type": "stop", "memory_allocated": 0,
                      **ident})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def sidecar(folder: Path, attachments: list[dict[str, Any]], **extra: Any) -> Path:
    """``<folder>/stormlog_attachments.json``."""
    return write_json(folder / "stormlog_attachments.json",
                      {"schema_version": 1, "format": "stormlog.attachments", "attachments": attachments, **extra})
