"""Artifact roots made by real Stormlog 0.4.3 (the test extra pins it): its own writers
(``AppendOnlyTelemetrySink``, ``OOMFlightRecorder``) and its own CLI (``gpumemprof track``,
``gpumemprof diagnose``), and its ``stormlog query`` as the reference the catalog is compared with.

Import this module only through :func:`require_stormlog` (or ``pytest.importorskip``): without
Stormlog the differential tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent
SKIP_REASON = ("real Stormlog is not importable: `pip install stormlog==0.4.3` (it is in the test extra) to run "
               "the differential tests against it")


T0 = 1_796_000_000_000_000_000
"""A fixed wall-clock start (ns) for hand-made artifacts, so two runs of a test write the same bytes."""


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as indented JSON at ``path`` (folders made); NaN is written as NaN, as Python writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


def hand_envelope(folder: Path, run_id: str, session_ids: Sequence[str] = (), **extra: Any) -> None:
    """A ``stormlog_run.json`` written by hand (Stormlog's writer refuses the odd values some tests
    need): ``session_ids`` become bare session references, unless ``extra`` gives ``sessions``."""
    doc: dict[str, Any] = {"schema_version": 1, "format": "stormlog.run_envelope", "run_id": run_id,
                           "sessions": [{"session_id": s, "metadata": {}} for s in session_ids], "metadata": {}}
    write_json(folder / "stormlog_run.json", {**doc, **extra})


def require_stormlog() -> None:
    """Skip the calling test module when real Stormlog cannot be imported."""
    pytest.importorskip("stormlog.query", reason=SKIP_REASON)


def record(session_id: str, ts: int, *, event_type: str = "sample", job_id: str | None = None, rank: int = 0,
           local_rank: int = 0, world_size: int = 1, host: str = "node-a", pid: int = 4242) -> dict[str, Any]:
    """One telemetry event (schema v4), normalised and validated by Stormlog itself."""
    from stormlog.telemetry import telemetry_event_from_record, telemetry_event_to_dict

    raw = {"schema_version": 4, "session_id": session_id, "timestamp_ns": ts, "event_type": event_type,
           "collector": "stormlog.cpu_tracker", "sampling_interval_ms": 100, "pid": pid, "host": host,
           "job_id": job_id, "rank": rank, "local_rank": local_rank, "world_size": world_size, "device_id": -1,
           "allocator_allocated_bytes": 1 << 20, "allocator_reserved_bytes": 1 << 20,
           "allocator_active_bytes": None, "allocator_inactive_bytes": None, "allocator_change_bytes": 0,
           "device_used_bytes": 1 << 20, "device_free_bytes": None, "device_total_bytes": None, "context": None,
           "metadata": {}}
    out: dict[str, Any] = telemetry_event_to_dict(telemetry_event_from_record(raw))
    return out


def event(session_id: str, ts: int, event_type: str = "sample", **fields: Any) -> dict[str, Any]:
    """Like :func:`record` with any v4 field set (``context``, ``metadata``, counters, identity, ...)."""
    from stormlog.telemetry import telemetry_event_from_record, telemetry_event_to_dict

    ident = {k: fields.pop(k) for k in ("job_id", "rank", "local_rank", "world_size", "host", "pid") if k in fields}
    raw = {**record(session_id, ts, event_type=event_type, **ident), **fields}
    raw.get("metadata", {}).pop("memory_capabilities", None)
    out: dict[str, Any] = telemetry_event_to_dict(telemetry_event_from_record(raw))
    return out


def sink_events(sink_dir: Path, session_id: str, started_at_ns: int, events: list[dict[str, Any]], *,
                job_id: str | None = None, rank: int = 0, world_size: int = 1, status: str = "completed") -> None:
    """One session of ``events`` (from :func:`event`) written with ``AppendOnlyTelemetrySink``."""
    from stormlog.session import create_session_summary
    from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig

    sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir=sink_dir))
    sink.start_session(create_session_summary(source="stormlog.cpu_profiler", session_id=session_id,
                                              started_at_ns=started_at_ns, host="node-a", pid=4242, job_id=job_id,
                                              rank=rank, local_rank=rank, world_size=world_size))
    for e in events:
        sink.append(e)
    sink.close(session_status=status)


def sink_session(sink_dir: Path, session_id: str, started_at_ns: int, *, events: int = 3, job_id: str | None = None,
                 rank: int = 0, world_size: int = 1, status: str = "completed") -> None:
    """One session written into ``sink_dir`` with ``AppendOnlyTelemetrySink`` (a reused folder
    gets a second ledger entry and its own segment), closed with ``status``."""
    from stormlog.session import create_session_summary
    from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig

    sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir=sink_dir))
    sink.start_session(create_session_summary(source="stormlog.cpu_profiler", session_id=session_id,
                                              started_at_ns=started_at_ns, host="node-a", pid=4242, job_id=job_id,
                                              rank=rank, local_rank=rank, world_size=world_size))
    for i in range(events):
        sink.append(record(session_id, started_at_ns + i + 1, job_id=job_id, rank=rank, local_rank=rank,
                           world_size=world_size))
    sink.close(session_status=status)


def killed_sink_session(sink_dir: Path, session_id: str, started_at_ns: int) -> None:
    """A session whose process dies (``os._exit``) after a flush: its ledger entry stays ``running``."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.catalog.stormlog_real import record
        from stormlog.session import create_session_summary
        from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig
        sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir={str(sink_dir)!r}))
        sink.start_session(create_session_summary(source="stormlog.cpu_profiler", session_id={session_id!r},
                                                  started_at_ns={started_at_ns}, host="node-a", pid=4343))
        sink.append(record({session_id!r}, {started_at_ns + 1}))
        sink.flush(force=True)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def oom_bundle(dump_dir: Path, session_id: str, started_at_ns: int, *, job_id: str | None = None) -> Path:
    """An OOM bundle written by ``OOMFlightRecorder.dump`` for ``session_id``; returns its folder."""
    from stormlog.oom_flight_recorder import OOMFlightRecorder, OOMFlightRecorderConfig
    from stormlog.session import create_session_summary

    recorder = OOMFlightRecorder(OOMFlightRecorderConfig(enabled=True, dump_dir=str(dump_dir)),
                                 system_info_provider=lambda: {"platform": "test"})
    recorder.record_event(record(session_id, started_at_ns + 5, job_id=job_id))
    summary = create_session_summary(source="stormlog.cpu_profiler", session_id=session_id, status="interrupted",
                                     started_at_ns=started_at_ns, host="node-a", pid=4242, job_id=job_id)
    path = recorder.dump(reason="torch.cuda.OutOfMemoryError", exception=MemoryError("CUDA out of memory"),
                         context="step 12", backend="cpu", session_summary=summary)
    assert path is not None
    return Path(path)


def gpumemprof(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run real Stormlog's ``gpumemprof`` CLI (CPU here)."""
    if "--output" in args:  # the tracker does not create the folder of its output
        Path(args[args.index("--output") + 1]).parent.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **(env or {})}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if env is None or key not in env:
            full.pop(key, None)
    subprocess.run([str(BIN / "gpumemprof"), *args], env=full, cwd=cwd, check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stormlog_query(what: str, *paths: Path | str, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Real ``stormlog query <what> PATH... --json``: its rows."""
    out = subprocess.run([str(BIN / "stormlog"), "query", what, *map(str, paths), "--json", *extra],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def stormlog_warnings(*paths: Path | str) -> list[tuple[str, str]]:
    """``(path, message)`` of every warning real Stormlog's store records for runs, attachments and
    sessions (``store.catalog.warnings``; its CLI prints none)."""
    import stormlog.query

    store = stormlog.query.open([str(p) for p in paths])
    store.list_runs()
    store.list_run_attachments()
    store.list_sessions()
    return [(w.path, w.message) for w in store.catalog.warnings]


def traceml_query(what: str, *paths: Path | str, extra: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], str]:
    """``traceml query <what> PATH... --json --no-cache``: its rows and its stderr (the warnings)."""
    out = subprocess.run([str(BIN / "traceml"), "query", what, *map(str, paths), "--json", "--no-cache", *extra],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows, out.stderr


def same_rows(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Field by field: every row Stormlog gives, ours gives, in the same order, with every one of
    Stormlog's fields equal (ours may add fields of its own)."""
    assert len(ours) == len(theirs), (f"{len(ours)} rows, Stormlog {len(theirs)}:\n"
                                      f"ours   {[_key(r) for r in ours]}\ntheirs {[_key(r) for r in theirs]}")
    for mine, ref in zip(ours, theirs, strict=True):
        assert {k: mine.get(k, "<missing>") for k in ref} == ref


def _key(row: dict[str, Any]) -> Any:
    return row.get("run_id"), row.get("session_id"), row.get("kind")
