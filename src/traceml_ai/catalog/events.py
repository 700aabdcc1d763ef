"""Telemetry events of the catalog's sources, read as real Stormlog 0.4.3's query store reads them
(004 seed, "Query API"; DESIGN §5; docs/catalog.md, "Events, OOM bundles, issues, summaries").

Every record is normalised to Stormlog's canonical event (schema v4): the v2/v3/v4 fields as
written (identity filled in: rank 0, local rank = rank, world size 1; ``metadata`` with the
``memory_capabilities`` Stormlog infers when they are absent), or a legacy tracker record
(``timestamp``, ``memory_allocated``, ``memory_mb``, ``type``, ``message``, ``metadata_*`` ...)
converted field by field as Stormlog converts it. A source holding one record Stormlog refuses
gives no events (Stormlog drops the whole source; here the catalog warns, naming it).

Events are read when asked for (``query_events``, ``summarize``, ``list_issues``,
``correlate``), never by ``runs``/``sessions``/``attachments``, and are not kept in the parse cache.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from traceml_ai.catalog.discovery import Source
from traceml_ai.catalog.sources import (
    _CSV_INTS,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    TELEMETRY_FILE_LIMIT,
    _Bad,
    _event,
    legacy_session_id,
    loads,
    summary_from_dict,
)
from traceml_ai.runs.discovery import inside
from traceml_ai.runs.safeio import open_regular

_LEGACY_COLLECTORS: Final = {"mps": "stormlog.mps_tracker", "rocm": "stormlog.rocm_tracker",
                             "cuda": "stormlog.cuda_tracker", "cpu": "stormlog.cpu_tracker"}
_IDENTITY_KEYS: Final = frozenset({"job_id", "rank", "local_rank", "world_size"})
_COUNTERS: Final = ("allocator_allocated_bytes", "allocator_reserved_bytes", "allocator_active_bytes",
                    "allocator_inactive_bytes", "allocator_change_bytes", "device_used_bytes", "device_free_bytes",
                    "device_total_bytes")
_ORDER: Final = ("schema_version", "session_id", "timestamp_ns", "event_type", "collector", "sampling_interval_ms",
                 "pid", "host", "job_id", "rank", "local_rank", "world_size", "device_id", *_COUNTERS, "context",
                 "metadata")
_STATUS_PRIORITY: Final = {"running": 0, "completed": 1, "interrupted": 2, "incomplete": 3}


@dataclass
class LoadedSession:
    """One session's events from one source (Stormlog's ``LoadedTelemetrySession``).

    Attributes:
        summary: the session summary (the sink ledger's or tracker's, else inferred from the events).
        events: canonical v4 event dicts (field order as Stormlog's), oldest first.
        sources_loaded: the real paths the events came from (sorted; the first is the rows' ``source_path``).
        warnings: the rows skipped (CSV).
    """

    summary: dict[str, Any]
    events: list[dict[str, Any]]
    sources_loaded: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _capabilities(meta: dict[str, Any], rec: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` with ``memory_capabilities`` inferred from the counters, as Stormlog infers them."""
    if "memory_capabilities" in meta:
        return meta
    collector = str(rec.get("collector", "legacy.unknown"))
    backend = meta.get("backend")
    if not isinstance(backend, str) or not backend.strip():
        backend = next((b for b in ("cuda", "rocm", "mps", "cpu", "tensorflow", "jax") if b in collector.lower()),
                       "unknown")

    def has(key: str) -> bool:
        return rec.get(key) is not None

    both = has("allocator_allocated_bytes") and has("allocator_reserved_bytes")
    return {**meta, "memory_capabilities": {
        "backend": str(backend), "telemetry_collector": collector,
        "sampling_source": str(meta.get("sampling_source", "legacy")),
        "supports_allocator_allocated": has("allocator_allocated_bytes"),
        "supports_allocator_reserved": has("allocator_reserved_bytes"),
        "supports_allocator_active": has("allocator_active_bytes"),
        "supports_allocator_inactive": has("allocator_inactive_bytes"),
        "supports_device_used": has("device_used_bytes"), "supports_device_free": has("device_free_bytes"),
        "supports_device_total": has("device_total_bytes"), "supports_native_allocator_history": False,
        "supports_fragmentation_analysis": both, "supports_allocator_attribution": both,
        "supports_bounded_profiling": False}}


def _legacy_device_id(rec: Mapping[str, Any]) -> int:
    if "device_id" in rec:
        return int(rec["device_id"])
    device = rec.get("device")
    if isinstance(device, str):
        low = device.lower()
        if "cpu" in low:
            return -1
        if ":" in device and device.rsplit(":", 1)[-1].isdigit():
            return int(device.rsplit(":", 1)[-1])
        if low.startswith("/gpu"):
            return 0
    return 0 if "memory_mb" in rec else -1


def _first(rec: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[bool, Any]:
    for k in keys:
        if k in rec:
            return True, rec[k]
    return False, None


def _legacy(rec: Mapping[str, Any], ident: Mapping[str, Any], default_collector: str) -> dict[str, Any]:
    meta: dict[str, Any] = dict(rec.get("metadata") or {})
    meta.update({k[9:]: v for k, v in rec.items() if isinstance(k, str) and k.startswith("metadata_")})
    device_id = _legacy_device_id(rec)
    found, allocated = _first(rec, ("allocator_allocated_bytes", "memory_allocated"))
    if not found:
        mb = rec.get("memory_mb")
        allocated = int(float(mb) * 1024 ** 2) if isinstance(mb, (int, float)) and not isinstance(mb, bool) \
            else rec.get("device_used_bytes", 0)
    found, reserved = _first(rec, ("allocator_reserved_bytes", "memory_reserved"))
    reserved = reserved if found else allocated
    found, change = _first(rec, ("allocator_change_bytes", "memory_change"))
    used = rec.get("device_used_bytes", allocated)
    found, total = _first(rec, ("device_total_bytes", "total_memory", "device_total", "total_bytes"))
    if not found:
        found, total = _first(meta, ("total_memory", "device_total", "total_bytes"))
    if "device_free_bytes" in rec:
        free = rec["device_free_bytes"]
    else:
        free = None if total is None else max(total - used, 0)
    collector = rec.get("collector")
    if not (isinstance(collector, str) and collector.strip()):
        backend = rec.get("backend", meta.get("backend"))
        if isinstance(backend, str) and backend.strip().lower() in _LEGACY_COLLECTORS:
            collector = _LEGACY_COLLECTORS[backend.strip().lower()]
        elif "memory_mb" in rec:
            collector = "stormlog.tensorflow.memory_tracker"
        elif "memory_allocated" in rec:
            collector = "stormlog.cpu_tracker" if device_id == -1 else "stormlog.cuda_tracker"
        else:
            collector = default_collector
    context = rec.get("context", rec.get("message"))
    if context is not None and not isinstance(context, str):
        raise _Bad("context must be a string")
    interval = rec.get("sampling_interval_ms", 0)
    if not isinstance(interval, int) or isinstance(interval, bool):
        raise _Bad("sampling_interval_ms must be an integer")
    meta = {k: v for k, v in meta.items() if k not in _IDENTITY_KEYS and k != "session_id"}
    counters = {"allocator_allocated_bytes": allocated, "allocator_reserved_bytes": reserved,
                "allocator_active_bytes": rec.get("allocator_active_bytes"),
                "allocator_inactive_bytes": rec.get("allocator_inactive_bytes"),
                "allocator_change_bytes": change if change is not None else 0, "device_used_bytes": used,
                "device_free_bytes": free, "device_total_bytes": total}
    meta = _capabilities(meta, {**rec, "collector": collector, **counters})
    event_type = rec.get("event_type", rec.get("type", "sample")) or "sample"
    return {"schema_version": 4, "session_id": ident["session_id"], "timestamp_ns": ident["timestamp_ns"],
            "event_type": event_type, "collector": collector, "sampling_interval_ms": interval,
            "pid": ident["pid"], "host": ident["host"], "job_id": ident["job_id"], "rank": ident["rank"],
            "local_rank": ident["local_rank"], "world_size": ident["world_size"], "device_id": device_id,
            **counters, "context": context, "metadata": meta}


def normalize_event(record: Any, default_session_id: str, default_collector: str = "legacy.unknown") -> dict[str, Any]:
    """One record as Stormlog's canonical v4 event dict (``telemetry_event_to_dict`` shape).

    Raises:
        _Bad: Stormlog's ``telemetry_event_from_record`` would refuse the record (the reason).
    """
    ident = _event(record, default_session_id)
    if "schema_version" not in record:
        return _legacy(record, ident, default_collector)
    out = {k: record.get(k) for k in _ORDER}
    out.update(schema_version=4, session_id=ident["session_id"], job_id=ident["job_id"], rank=ident["rank"],
               local_rank=ident["local_rank"], world_size=ident["world_size"],
               metadata=_capabilities(dict(record["metadata"]), record))
    return out


def _inferred(sid: str, events: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """Stormlog's ``infer_session_summary_from_events`` (events sorted oldest first)."""
    first = events[0]
    stops = [e["timestamp_ns"] for e in events if e["event_type"] == "stop"]
    return {"session_id": sid, "status": "completed" if stops else "incomplete",
            "started_at_ns": first["timestamp_ns"], "ended_at_ns": stops[-1] if stops else None,
            "host": first["host"], "pid": first["pid"], "job_id": first["job_id"], "rank": first["rank"],
            "local_rank": first["local_rank"], "world_size": max(1, first["world_size"]), "source": source}


def _assemble(grouped: dict[str, list[dict[str, Any]]], summaries: list[dict[str, Any]] | None,
              sources_by: dict[str, set[str]], default_path: str, source: str,
              warnings: list[str] | None = None) -> list[LoadedSession]:
    by_id = {s["session_id"]: s for s in summaries or ()}
    out = []
    for sid in {**grouped, **by_id}:
        evs = grouped.get(sid, [])
        summary = by_id.get(sid)
        if summary is None:
            if not evs:
                continue
            summary = _inferred(sid, evs, source)
        out.append(LoadedSession(summary, evs, sorted(sources_by.get(sid, {default_path})), list(warnings or ())))
    # Stormlog's session selection order: running first, then completed, ...; latest first
    out.sort(key=lambda s: (_STATUS_PRIORITY.get(s.summary["status"], 99),
                            -int(s.summary["ended_at_ns"] or s.summary["started_at_ns"]),
                            -s.summary["started_at_ns"], s.summary["session_id"]))
    return out


def _read(path: str) -> bytes:
    if os.path.getsize(path) > TELEMETRY_FILE_LIMIT:
        raise _Bad(f"is over the {TELEMETRY_FILE_LIMIT}-byte limit for a telemetry file; not read")
    with open_regular(path) as f:
        return f.read()


def _jsonl(path: str, default: str) -> list[dict[str, Any]]:
    lines = _read(path).decode("utf-8").splitlines(keepends=True)
    events = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = loads(line)
        except orjson.JSONDecodeError:
            if n == len(lines) and not line.endswith("\n"):
                break  # the last line, not ended yet: being written now
            raise _Bad(f"line {n} is not valid JSON") from None
        if not isinstance(record, dict):
            raise _Bad(f"line {n} is not a JSON object")
        events.append(normalize_event(record, default))
    return events


def _group(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        grouped.setdefault(e["session_id"], []).append(e)
    for evs in grouped.values():
        evs.sort(key=lambda e: e["timestamp_ns"])
    return grouped


def _sink(source: Source, roots: Sequence[str]) -> list[LoadedSession]:
    folder = os.path.realpath(source.path)
    sink = source.fact.get("sink") or {"sessions": [], "segments": []}
    hints = {g["filename"]: g["session_id"] for g in sink["segments"]}
    # the segments in the folder (a manifest's filename is only taken when the folder holds that
    # name: never a path out of it), and not a link leaving the roots
    names = {n for n in source.names if (n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)) or n in hints}
    names = {n for n in names if not roots or any(inside(os.path.realpath(os.path.join(folder, n)), r) for r in roots)}
    if not names:
        raise _Bad("the sink retained no segments")
    fallback = legacy_session_id(folder, "sink")
    grouped: dict[str, list[dict[str, Any]]] = {}
    sources_by: dict[str, set[str]] = {}
    for name in sorted(names):
        seg = os.path.join(folder, name)
        hint = hints.get(name) or fallback
        evs = _jsonl(seg, hint)
        for sid, some in _group(evs).items():
            grouped.setdefault(sid, []).extend(some)
            sources_by.setdefault(sid, set()).add(seg)
        if not evs:
            sources_by.setdefault(hint, set()).add(seg)
    for evs in grouped.values():
        evs.sort(key=lambda e: e["timestamp_ns"])
    return _assemble(grouped, sink["sessions"] or None, sources_by, folder, f"artifact:{os.path.basename(folder)}")


def _json_file(path: str) -> list[LoadedSession]:
    real = os.path.realpath(path)
    doc = loads(_read(path))
    summaries = None
    if isinstance(doc, list):
        if not doc:  # Stormlog skips it silently; a user wants to hear of it
            raise _Bad("is an empty list: holds no telemetry events")
        records = doc
    elif isinstance(doc, dict):
        if isinstance(doc.get("events"), list):
            records = doc["events"]
        elif isinstance(doc.get("telemetry_events"), list):
            records = doc["telemetry_events"]
            if isinstance(doc.get("session_summary"), Mapping):
                summary, why = summary_from_dict(doc["session_summary"])
                if summary is None:
                    raise _Bad(f"session_summary: {why}")
                summaries = [summary]
        elif any(k in doc for k in ("schema_version", "event_type", "type", "memory_allocated", "memory_mb",
                                    "timestamp", "timestamp_ns")):
            records = [doc]
        else:
            raise _Bad("holds no telemetry events")
    else:
        raise _Bad("is not a JSON object or list")
    if any(not isinstance(r, Mapping) for r in records):
        raise _Bad("an event is not an object")
    if summaries and any(r.get("session_id") != summaries[0]["session_id"] for r in records):
        raise _Bad("the session summary does not match the events' session_id")
    default = legacy_session_id(real, "json")
    grouped = _group([normalize_event(r, default) for r in records])
    return _assemble(grouped, summaries, {sid: {real} for sid in grouped}, real,
                     f"artifact:{os.path.basename(real)}")


def _csv(path: str) -> list[LoadedSession]:
    real = os.path.realpath(path)
    default = legacy_session_id(real, "csv")
    events, warnings = [], []
    with io.StringIO(_read(path).decode("utf-8"), newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            try:
                record: dict[str, Any] = {}
                for key, raw in row.items():
                    value: Any = raw.strip() if isinstance(raw, str) else raw
                    if value == "":
                        record[key] = None
                    elif key == "metadata" and isinstance(value, str):
                        try:
                            parsed = loads(value)
                        except orjson.JSONDecodeError:
                            parsed = {}
                        record[key] = parsed if isinstance(parsed, dict) else {}
                    elif key in _CSV_INTS:
                        try:
                            record[key] = int(str(value).strip())
                        except ValueError:
                            record[key] = int(float(str(value).strip()))
                    elif key == "timestamp":
                        record[key] = float(value)
                    else:
                        record[key] = value
                events.append(normalize_event(record, default, default_collector="legacy.csv"))
            except (_Bad, ValueError, TypeError, OverflowError) as exc:
                warnings.append(f"CSV parse error {real}:{n}: {exc}")
    grouped = _group(events)
    return _assemble(grouped, None, {sid: {real} for sid in grouped}, real, f"artifact:{os.path.basename(real)}",
                     warnings)


def load_source(source: Source, roots: Sequence[str] = ()) -> list[LoadedSession]:
    """The sessions and events of one source (a sink, or a ``.json``/``.jsonl``/``.csv`` telemetry
    file; bundles hold none), loaded as Stormlog's ``load_telemetry_sessions`` loads them.
    ``roots``: the real paths of the roots; a sink segment that is a link leaving them is not read.

    Raises:
        ValueError: Stormlog would fail to load the source (the reason); it then gives no events.
        OSError: the file cannot be read.
    """
    try:
        if source.kind == "sink":
            return _sink(source, roots)
        if source.kind == "telemetry_jsonl":
            real = os.path.realpath(source.path)
            grouped = _group(_jsonl(source.path, legacy_session_id(real, "sink")))
            return _assemble(grouped, None, {sid: {real} for sid in grouped}, real,
                             f"artifact:{os.path.basename(real)}")
        if source.kind == "telemetry_json":
            return _json_file(source.path)
        if source.kind == "telemetry_csv":
            return _csv(source.path)
    except _Bad as exc:
        raise ValueError(str(exc)) from None
    except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not valid JSON or text ({exc})") from None
    return []


_WINDOW_INTS: Final = ("index", "start_ns", "end_ns", "event_count", "sample_count", "rank_count", "alert_count",
                       "collector_transition_count", "oom_count")


def read_rollups(source: Source) -> dict[str, Any] | None:
    """A sink's ``rollups.json`` when it is current (as Stormlog's ``read_telemetry_rollups``):
    format ``stormlog.telemetry_rollups`` v1, made from the manifest's schema version, segments,
    event count and bytes as the manifest lists them now; else None (stale, absent or malformed
    rollups are not used). Only what correlation uses is checked: ``window_duration_ns`` and each
    session's ``session`` identity and ``windows``."""
    if source.kind != "sink":
        return None
    from traceml_ai.catalog.sources import MANIFEST_FILE, ROLLUP_FILE

    try:
        doc = loads(_read(os.path.join(source.path, ROLLUP_FILE)))
        manifest = loads(_read(source.manifest or os.path.join(source.path, MANIFEST_FILE)))
    except (OSError, ValueError, _Bad):
        return None
    if not isinstance(doc, dict) or doc.get("schema_version") != 1 or doc.get("format") != "stormlog.telemetry_rollups":
        return None
    if not isinstance(doc.get("window_duration_ns"), int) or not isinstance(doc.get("sessions"), list):
        return None
    segments = (source.fact.get("sink") or {}).get("segments", [])
    coverage = doc.get("coverage")
    if isinstance(manifest, dict) and manifest.get("format") == "stormlog.append_only_telemetry_sink":
        if not isinstance(coverage, dict) or (
                doc.get("source_manifest_schema_version") != manifest.get("schema_version")
                or coverage.get("retained_segment_filenames") != [g["filename"] for g in segments]
                or coverage.get("retained_event_count") != sum(g["event_count"] for g in segments)
                or coverage.get("retained_bytes") != sum(g["size_bytes"] for g in segments)):
            return None
    for s in doc["sessions"]:
        if not isinstance(s, dict) or not isinstance(s.get("session"), dict) or not isinstance(s.get("windows"), list):
            return None
        if not isinstance(s["session"].get("session_id"), str):
            return None
        for w in s["windows"]:
            if not isinstance(w, dict) or any(not isinstance(w.get(k), int) or isinstance(w.get(k), bool)
                                              for k in _WINDOW_INTS):
                return None
    return doc
