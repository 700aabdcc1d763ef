"""Reading one catalog file into plain facts (004 seed; DESIGN §5; what is read: docs/catalog.md).

The files are the ones real Stormlog 0.4.3 writes and reads, read the way its query store reads
them (its own code is the reference; the differential tests in ``tests/catalog`` compare), plus
TraceML's own run folders. Each reader takes one path and returns a :data:`Fact`: a dict of plain
JSON values, so that the parse cache (:mod:`traceml_ai.catalog.cache`) can keep it between runs.
Readers never raise for a bad file: a file that cannot be read or parsed becomes a fact with an
``error`` or ``problems`` (later warnings naming file, field and reason).

Facts:

- ``{"type": "envelope", "doc", "problems", "error"}``: a ``stormlog_run.json``, validated against
  the v1 schema (``doc`` None when rejected).
- ``{"type": "sidecar", "read", "items", "item_problems", "problems", "error"}``: a
  ``stormlog_attachments.json``; ``items`` holds ``[index, item]`` of the items read (each
  normalised as Stormlog reads it), ``item_problems`` ``[index, field, message, kept]``.
- ``{"type": "manifest", "oom", "diagnose", "sink", "error"}``: a ``manifest.json``; each of the
  three is None or what that kind of manifest says (a sink ledger, a diagnose bundle, an OOM bundle).
- ``{"type": "telemetry", "sessions", "error"}``: a tracker output or other telemetry file
  (``.json``, ``.jsonl``, ``.csv``), its events grouped into sessions.
- ``{"type": "sessions", "sessions", "problems", "error"}``: a TraceML run folder's
  ``aggregator/manifest.json``.

A session is a dict with Stormlog's session summary fields: ``session_id``, ``status``,
``started_at_ns``, ``ended_at_ns`` (Unix epoch ns), ``host``, ``pid``, ``job_id``, ``rank``,
``local_rank``, ``world_size``, ``source``; telemetry files add ``event_count``, ``warning_count``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import uuid
from collections.abc import Collection, Mapping
from typing import Any, Final

import orjson

from traceml_ai.catalog.schema import (
    SESSION_STATUSES,
    envelope_problems,
    sidecar_file_read,
    sidecar_item_read,
    sidecar_problems,
)
from traceml_ai.runs.layout import MAX_SMALL_FILE_BYTES
from traceml_ai.runs.safeio import open_regular

Fact = dict[str, Any]

TRACEML_MANIFEST_FORMAT: Final = "traceml.session_manifest"
SINK_MANIFEST_FORMAT: Final = "stormlog.append_only_telemetry_sink"
MANIFEST_FILE: Final = "manifest.json"
ROLLUP_FILE: Final = "rollups.json"
NO_EVENTS: Final = "holds no telemetry events"
"""The end of a telemetry fact's ``error`` for a file that is JSON but no telemetry."""
SEGMENT_PREFIX: Final = "segment-"
SEGMENT_SUFFIX: Final = ".jsonl"
TELEMETRY_NAME_PARTS: Final = ("event", "events", "track", "telemetry")
"""A ``.json`` or ``.csv`` file is read as telemetry only when its name holds one of these
(as Stormlog does); every ``.jsonl`` is."""

TRACEML_ARTIFACTS: Final = (
    ("telemetry.sqlite", "telemetry_database", "Telemetry database (SQLite)"),
    ("export", "export", "Exported telemetry records (JSONL)"),
    ("final_summary.json", "final_summary", "Final summary with diagnoses"),
    ("finalization_warning.json", "finalization_warning", "What was lost during capture"),
)
"""Files of ``<run>/aggregator/`` listed as ``copy`` attachments of a TraceML session (DESIGN §2.1)."""

TELEMETRY_FILE_LIMIT: Final = 512 * 1024 * 1024
"""A telemetry file over this size is not read (a warning says so)."""


_BIG_INT: Final = re.compile(rb"-\d{19}|\d{20}")
"""A number orjson may not hold exactly (beyond 64 bits), or a string holding 20 digits in a row."""


def loads(data: bytes | str) -> Any:
    """JSON as Stormlog's ``json.loads`` reads it, fast: orjson, except where orjson differs from the
    standard library, which then reads it: an integer beyond 64 bits (kept exact, never rounded to
    a float) and ``NaN`` / ``Infinity`` (accepted, as Python's reader accepts them).

    Raises:
        orjson.JSONDecodeError: not JSON for either reader (orjson's error, with its position), or
            JSON neither reads: nested too deeply, an integer of more than 4,300 digits.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if _BIG_INT.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            first: orjson.JSONDecodeError | None = exc
    else:
        first = None
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if first is not None:
            raise first from None
        if isinstance(exc, UnicodeDecodeError):
            raise orjson.JSONDecodeError(f"not UTF-8 ({exc.reason})", "", exc.start) from None
        raise orjson.JSONDecodeError(exc.msg, exc.doc, exc.pos) from None
    except RecursionError:  # nested deeper than Python's reader goes (orjson stops at 1,024 levels)
        doc, pos = (first.doc, first.pos) if first is not None else ("", 0)
        raise orjson.JSONDecodeError("nested too deeply to read", doc, pos) from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise orjson.JSONDecodeError(str(exc).split("\n")[0], "", 0) from None


def _load_json(path: str, limit: int = MAX_SMALL_FILE_BYTES) -> tuple[Any, str | None]:
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return None, f"is over the {limit}-byte limit for a catalog file; not read"
        return loads(data), None
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None, "is not UTF-8 text (a binary file?); not read"
        return None, f"is not valid JSON: {exc}"


def _json(value: Any) -> str:
    """A value as messages show it: JSON (``null``, ``"zero"``), cut at 60 characters; a NaN or
    infinity is ``NaN`` / ``Infinity``, as the file holds it (never ``null``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= 60 else text[:57] + "..."


# -- envelopes and sidecars ----------------------------------------------------------------------

def read_envelope(path: str) -> Fact:
    """Parse and validate a ``stormlog_run.json`` (v1 schema plus the time-order checks)."""
    doc, error = _load_json(path)
    if error is not None:
        return {"type": "envelope", "doc": None, "problems": [], "error": error}
    problems = envelope_problems(doc)
    return {"type": "envelope", "doc": doc if not problems else None,
            "problems": [list(p) for p in problems], "error": None}


def read_sidecar(path: str) -> Fact:
    """Parse a ``stormlog_attachments.json``: every v1-schema problem is named; an item Stormlog's
    reader still takes (e.g. without ``metadata``) is kept, one it drops is dropped."""
    doc, error = _load_json(path)
    fact: Fact = {"type": "sidecar", "read": False, "items": [], "item_problems": [], "problems": [],
                  "error": error}
    if error is not None:
        return fact
    file_problems, item_problems = sidecar_problems(doc)
    fact["problems"] = [list(p) for p in file_problems]
    if not sidecar_file_read(doc):
        return fact
    fact["read"] = True
    for i, item in enumerate(doc["attachments"]):
        read = sidecar_item_read(item)
        for p in item_problems.get(i, []):
            if p.field == f"attachments[{i}].metadata" and p.message == "is required":
                # Stormlog reads a missing metadata as {} without a word (its own example omits it),
                # so it is never why an item is dropped: naming it would give a false reason.
                continue
            fact["item_problems"].append([i, p.field, p.message, read is not None])
        if read is None:
            if i not in item_problems:
                fact["item_problems"].append([i, f"attachments[{i}]", "needs a non-empty title and kind and a url "
                                              "or path", False])
            continue
        fact["items"].append([i, read])
    return fact


# -- session summaries (Stormlog's session ledger entries) ---------------------------------------

def _int(value: Any, field: str) -> int:
    """``int(value)`` as Stormlog coerces ledger numbers (floats and numeric strings included).

    Raises:
        ValueError: not a number (the message names ``field`` and shows the value, ``NaN`` as NaN).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field}\0is {_json(value)}, not a number")
    try:
        return int(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{field}\0is {_json(value)}, not a whole number") from None


def summary_problem(raw: Any) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """Like :func:`summary_from_dict`, with the field apart: ``(summary, None, None)``, or
    ``(None, field, reason)`` (``field`` None when the entry is not an object at all)."""
    if not isinstance(raw, Mapping):
        return None, None, "is not a JSON object"
    sid = raw.get("session_id")
    if not isinstance(sid, str) or not sid.strip():
        return None, "session_id", f"is {_json(sid)}, not a non-empty string"
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        return None, "source", f"is {_json(source)}, not a non-empty string"
    status = raw.get("status")
    if not isinstance(status, str) or status.strip().lower() not in SESSION_STATUSES:
        return None, "status", f"is {_json(status)}, not one of {', '.join(SESSION_STATUSES)}"
    host = raw.get("host")
    try:
        if raw.get("started_at_ns") is None:
            return None, "started_at_ns", "is missing or null"
        started = _int(raw["started_at_ns"], "started_at_ns")
        ended = None if raw.get("ended_at_ns") is None else _int(raw["ended_at_ns"], "ended_at_ns")
        if not isinstance(host, str) or not host.strip():
            return None, "host", f"is {_json(host)}, not a non-empty string"
        summary = {
            "session_id": sid, "status": status.strip().lower(), "started_at_ns": started, "ended_at_ns": ended,
            "host": host, "pid": _int(raw.get("pid", -1), "pid"), "job_id": raw.get("job_id"),
            "rank": _int(raw.get("rank", 0), "rank"), "local_rank": _int(raw.get("local_rank", 0), "local_rank"),
            "world_size": max(1, _int(raw.get("world_size", 1), "world_size")), "source": source,
        }
    except ValueError as exc:
        field, _, reason = str(exc).partition("\0")
        return None, field, reason
    return summary, None, None


def summary_from_dict(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A session summary as Stormlog's ``session_summary_from_dict`` takes one: ``(summary, None)``,
    or ``(None, reason)`` when Stormlog would reject it (and skip the ledger entry); the reason
    names the field (``started_at_ns is NaN, not a whole number``)."""
    summary, field, reason = summary_problem(raw)
    if summary is not None:
        return summary, None
    return None, f"{field} {reason}" if field else reason


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _loose_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


# -- manifest.json: sink ledger, diagnose bundle, OOM bundle --------------------------------------

def read_manifest(path: str) -> Fact:
    """A ``manifest.json`` as Stormlog recognises it:

    - OOM bundle (``bundle_name``, ``reason``, ``backend``, ``event_count``), with
      ``exception_type``/``exception_module`` from ``metadata.json`` beside it;
    - diagnose bundle (``command_line``, ``files``, ``risk_detected``, ``session_id``), its session
      from ``session`` (else ``session_id`` + ``session_status``, started at 0);
    - sink ledger (``format`` ``stormlog.append_only_telemetry_sink`` or a ``segments`` key): the
      ``sessions`` ledger (schema version ≥ 2) and the ``segments`` list.

    Anything else (or unreadable) has all three None; ``error`` says why when it was not JSON, and
    ``unrecognized`` why an object is none of the three when it looks like a Stormlog manifest (empty,
    a ``stormlog.`` format, or some of the keys of one shape): a manifest of another program is
    neither.
    """
    doc, error = _load_json(path)
    fact: Fact = {"type": "manifest", "oom": None, "diagnose": None, "sink": None, "problems": [], "error": None,
                  "unrecognized": None}
    if error is not None or not isinstance(doc, dict):
        fact["error"] = error or f"is {_json_kind(doc)}, not a JSON object"
        return fact
    if all(k in doc for k in ("bundle_name", "reason", "backend", "event_count")):
        meta, _ = _load_json(os.path.join(os.path.dirname(path), "metadata.json"))
        meta = meta if isinstance(meta, dict) else {}
        fact["oom"] = {
            "created_at_utc": _text(doc.get("created_at_utc")), "backend": _text(doc.get("backend")),
            "reason": _text(doc.get("reason")), "event_count": _loose_int(doc.get("event_count")),
            "session_id": _text(doc.get("session_id")), "session_status": _text(doc.get("session_status")),
            "exception_type": _text(meta.get("exception_type")),
            "exception_module": _text(meta.get("exception_module")),
        }
    if all(k in doc for k in ("command_line", "files", "risk_detected", "session_id")):
        summary, why = summary_from_dict(doc.get("session")) if isinstance(doc.get("session"), Mapping) else (None, "")
        if summary is None:
            if why:
                fact["problems"].append(["session", f"{why}; the session is read from session_id"])
            sid = _text(doc.get("session_id"))
            status = doc.get("session_status", "incomplete")
            if sid is not None and isinstance(status, str) and status.strip().lower() in SESSION_STATUSES:
                summary = {"session_id": sid, "status": status.strip().lower(), "started_at_ns": 0,
                           "ended_at_ns": None, "host": "unknown", "pid": -1, "job_id": None, "rank": 0,
                           "local_rank": 0, "world_size": 1, "source": "stormlog.diagnose"}
            elif sid is None:
                fact["problems"].append(["session_id", "is missing or not a non-empty string; the bundle "
                                         "has no session"])
        files = doc.get("files")
        fact["diagnose"] = {"summary": summary,
                            "files": [f for f in files if isinstance(f, str)] if isinstance(files, list) else []}
    if doc.get("format") == SINK_MANIFEST_FORMAT or "segments" in doc:
        fact["sink"] = _sink(doc, fact["problems"])
    if fact["oom"] is None and fact["diagnose"] is None and fact["sink"] is None:
        fact["unrecognized"] = _unrecognized(doc)
    return fact


_OOM_KEYS: Final = ("bundle_name", "reason", "backend", "event_count")
_DIAGNOSE_KEYS: Final = ("command_line", "files", "risk_detected", "session_id")


def _json_kind(doc: Any) -> str:
    if isinstance(doc, list):
        return "an empty list" if not doc else "a list"
    return "null" if doc is None else f"a {type(doc).__name__}"


def _unrecognized(doc: dict[str, Any]) -> str | None:
    """Why ``doc`` (none of the three shapes) is reported, or None for another program's manifest."""
    fmt = doc.get("format")
    if not doc:
        return "is an empty JSON object"
    if isinstance(fmt, str) and fmt.startswith("stormlog."):
        return f"has format {fmt!r}, which is not {SINK_MANIFEST_FORMAT!r}"
    for shape, keys in (("an OOM bundle", _OOM_KEYS), ("a diagnose bundle", _DIAGNOSE_KEYS)):
        missing = [k for k in keys if k not in doc]
        if len(missing) <= len(keys) - 2:  # two keys of a shape: meant as one (one alone is too common a name)
            return f"has {', '.join(k for k in keys if k in doc)} but lacks {', '.join(missing)} of {shape} manifest"
    return None


def _sink(doc: dict[str, Any], problems: list[list[str]]) -> dict[str, Any]:
    try:
        version = _int(doc.get("schema_version", 1), "schema_version")
    except ValueError:
        version = 1
    sessions: list[dict[str, Any]] = []
    raw_sessions = doc.get("sessions", [])
    if version < 2 and raw_sessions:
        problems.append(["schema_version", f"is {_json(doc.get('schema_version', 1))}: a ledger before version 2 "
                         "is not read (as Stormlog); the sessions are read from the segments' events"])
    elif not isinstance(raw_sessions, list):
        problems.append(["sessions", f"must be a list, not {_json(raw_sessions)}; the sessions are read from "
                         "the segments' events"])
    if version >= 2 and isinstance(raw_sessions, list):
        for i, entry in enumerate(raw_sessions):
            summary, fld, why = summary_problem(entry)
            if summary is None:
                where = f"sessions[{i}].{fld}" if fld else f"sessions[{i}]"
                problems.append([where, f"{why}; this ledger entry is skipped (as Stormlog)"])
            else:
                sessions.append(summary)
    segments: list[dict[str, Any]] = []
    raw_segments = doc.get("segments", [])
    if not isinstance(raw_segments, list):
        problems.append(["segments", f"must be a list, not {_json(raw_segments)}; the folder's segment-*.jsonl "
                         "files are read"])
    for i, seg in enumerate(raw_segments if isinstance(raw_segments, list) else []):
        if not isinstance(seg, Mapping) or not isinstance(seg.get("filename"), str):
            problems.append([f"segments[{i}]", "has no filename; skipped"])
            continue

        def count(key: str, seg: Mapping[str, Any] = seg) -> int:
            n = _loose_int(seg.get(key, 0))
            return n if n is not None and n >= 0 else 0

        sid = seg.get("session_id")
        segments.append({"filename": seg["filename"], "event_count": count("event_count"),
                         "size_bytes": count("size_bytes"), "closed": bool(seg.get("closed", False)),
                         "session_id": sid if isinstance(sid, str) else None})
    return {"sessions": sessions, "segments": segments}


# -- telemetry files (tracker outputs, JSONL event files) ------------------------------------------

class _Bad(ValueError):
    """A telemetry file Stormlog cannot load (the whole file is dropped: a warning)."""


def legacy_session_id(*parts: object) -> str:
    """Stormlog's deterministic id for a session whose events carry none."""
    return "legacy-" + str(uuid.uuid5(uuid.NAMESPACE_URL, "::".join(str(p) for p in parts if p is not None)))


def _identity(job_id: Any, rank: Any, local_rank: Any, world_size: Any) -> tuple[Any, int, int, int]:
    """Distributed identity normalised as Stormlog's (missing rank 0, local rank = rank, world 1).

    Raises:
        _Bad: an impossible identity (rank ≥ world size, a negative rank, ...).
    """
    world = 1 if world_size is None else world_size
    r = 0 if rank is None else rank
    lr = r if local_rank is None else local_rank
    if any(not isinstance(v, int) or isinstance(v, bool) for v in (world, r, lr)):
        raise _Bad("rank, local_rank and world_size must be integers")
    if job_id is not None and not (isinstance(job_id, str) and job_id.strip()):
        raise _Bad("job_id must be a non-empty string")
    if r < 0 or lr < 0 or world < 1:
        raise _Bad("rank and local_rank must be >= 0 and world_size >= 1")
    if r >= world or lr >= world:
        raise _Bad("rank and local_rank must be < world_size")
    return job_id, r, lr, world


_V3_REQUIRED: Final = ("schema_version", "session_id", "timestamp_ns", "event_type", "collector",
                       "sampling_interval_ms", "pid", "host", "device_id", "allocator_allocated_bytes",
                       "allocator_reserved_bytes", "allocator_active_bytes", "allocator_inactive_bytes",
                       "allocator_change_bytes", "device_used_bytes", "device_free_bytes", "device_total_bytes",
                       "context", "metadata")
_IDENTITY_FIELDS: Final = ("job_id", "rank", "local_rank", "world_size")
_CAPABILITY_STRINGS: Final = ("backend", "telemetry_collector", "sampling_source")
_CAPABILITY_FLAGS: Final = ("supports_allocator_allocated", "supports_allocator_reserved",
                            "supports_allocator_active", "supports_allocator_inactive", "supports_device_used",
                            "supports_device_free", "supports_device_total", "supports_native_allocator_history",
                            "supports_fragmentation_analysis", "supports_allocator_attribution",
                            "supports_bounded_profiling")
_COUNTER_FLAGS: Final = (("allocator_allocated_bytes", "supports_allocator_allocated"),
                         ("allocator_reserved_bytes", "supports_allocator_reserved"),
                         ("allocator_active_bytes", "supports_allocator_active"),
                         ("allocator_inactive_bytes", "supports_allocator_inactive"),
                         ("device_used_bytes", "supports_device_used"),
                         ("device_free_bytes", "supports_device_free"),
                         ("device_total_bytes", "supports_device_total"))


def _strict_int(record: Mapping[str, Any], key: str, *, nullable: bool = False, minimum: int | None = None) -> None:
    value = record[key]
    if value is None and nullable:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{key} must be an integer")
    if minimum is not None and value < minimum:
        raise _Bad(f"{key} must be >= {minimum}")


def _text_field(record: Mapping[str, Any], key: str) -> None:
    value = record[key]
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{key} must be a non-empty string")


_REQUIRED_SET: Final = frozenset(k for k in _V3_REQUIRED if k != "session_id")
_KNOWN_SET: Final = frozenset((*_V3_REQUIRED, *_IDENTITY_FIELDS))
_CAPABILITY_SET: Final = frozenset((*_CAPABILITY_STRINGS, *_CAPABILITY_FLAGS))
_INT_RULES: Final = (  # (field, may be null in v2/v3, may be null in v4, minimum)
    ("timestamp_ns", False, False, 0), ("sampling_interval_ms", False, False, 0), ("pid", False, False, -1),
    ("device_id", False, False, None), ("allocator_allocated_bytes", False, True, 0),
    ("allocator_reserved_bytes", False, True, 0), ("device_used_bytes", False, True, 0),
    ("allocator_change_bytes", False, True, None), ("allocator_active_bytes", True, True, 0),
    ("allocator_inactive_bytes", True, True, 0), ("device_free_bytes", True, True, 0),
    ("device_total_bytes", True, True, 0))


def _versioned_ok(r: Mapping[str, Any], version: int) -> bool:
    """True only when :func:`_check_versioned` surely passes ``r`` (the quick test of a well-formed
    record; anything doubtful is left to the full check, which names the reason)."""
    keys = r.keys()
    if not (_REQUIRED_SET <= keys and keys <= _KNOWN_SET) or (version == 2 and "session_id" in keys):
        return False
    v4 = version == 4
    for key, null23, null4, lo in _INT_RULES:
        v = r[key]
        if v is None:
            if not (null4 if v4 else null23):
                return False
        elif type(v) is not int or (lo is not None and v < lo):
            return False
    for key in ("event_type", "collector", "host"):
        v = r[key]
        if type(v) is not str or not v.strip():
            return False
    total = r["device_total_bytes"]
    if total is not None and any(r[k] is not None and r[k] > total for k in ("device_used_bytes", "device_free_bytes")):
        return False
    if r["context"] is not None and type(r["context"]) is not str:
        return False
    for key, lo in (("rank", 0), ("local_rank", 0), ("world_size", 1)):
        if key in r and (type(r[key]) is not int or r[key] < lo):
            return False
    if not v4:
        return True
    meta = r["metadata"]
    if "memory_capabilities" not in meta:
        return True
    caps = meta["memory_capabilities"]
    if type(caps) is not dict or caps.keys() != _CAPABILITY_SET:
        return False
    if any(type(caps[n]) is not str or not caps[n].strip() for n in _CAPABILITY_STRINGS):
        return False
    if any(type(caps[n]) is not bool for n in _CAPABILITY_FLAGS):
        return False
    return all(r[c] is None or caps[f] for c, f in (*_COUNTER_FLAGS, ("allocator_change_bytes",
                                                                     "supports_allocator_allocated")))


def _check_versioned(record: Mapping[str, Any], version: int) -> None:
    """The checks Stormlog's reader makes of a v2/v3/v4 record (the whole file is refused when one
    fails): every required field present and no unknown one, integers that are integers (counters
    ≥ 0; v4 counters may be null), non-empty strings, a consistent identity, and for v4 memory
    capabilities (inferred when absent) that agree with the counters.

    Raises:
        _Bad: the record fails one of them (its reason).
    """
    if _versioned_ok(record, version):
        return
    # session_id is not checked: a missing or bad one is replaced by the file's default (as Stormlog);
    # in a v2 record it is an unknown field
    required = tuple(k for k in _V3_REQUIRED if k != "session_id")
    missing = [k for k in required if k not in record]
    if missing:
        raise _Bad(f"missing required telemetry fields: {', '.join(missing)}")
    known = {*_V3_REQUIRED, *_IDENTITY_FIELDS}
    if version == 2:  # session_id came with v3: Stormlog's v2 field set does not hold it
        known.discard("session_id")
    unknown = sorted(str(k) for k in record if k not in known)
    if unknown:
        raise _Bad(f"unknown telemetry fields: {', '.join(unknown)}")
    _strict_int(record, "timestamp_ns", minimum=0)
    _text_field(record, "event_type")
    _text_field(record, "collector")
    _strict_int(record, "sampling_interval_ms", minimum=0)
    _strict_int(record, "pid", minimum=-1)
    _text_field(record, "host")
    _strict_int(record, "device_id")
    nullable = version == 4
    for key in ("allocator_allocated_bytes", "allocator_reserved_bytes", "device_used_bytes"):
        _strict_int(record, key, nullable=nullable, minimum=0)
    _strict_int(record, "allocator_change_bytes", nullable=nullable)
    for key in ("allocator_active_bytes", "allocator_inactive_bytes", "device_free_bytes", "device_total_bytes"):
        _strict_int(record, key, nullable=True, minimum=0)
    total = record["device_total_bytes"]
    if total is not None:
        for key in ("device_used_bytes", "device_free_bytes"):
            if record[key] is not None and record[key] > total:
                raise _Bad(f"{key} cannot exceed device_total_bytes")
    if record["context"] is not None and not isinstance(record["context"], str):
        raise _Bad("context must be a string")
    for key, minimum in (("rank", 0), ("local_rank", 0), ("world_size", 1)):
        if key in record:  # present means an integer (null is refused too)
            _strict_int(record, key, minimum=minimum)
    if version == 4:
        caps = record["metadata"].get("memory_capabilities")
        if caps is None and "memory_capabilities" not in record["metadata"]:
            return  # inferred from the counters: consistent by construction
        if not isinstance(caps, Mapping):
            raise _Bad("metadata.memory_capabilities must be an object")
        names = (*_CAPABILITY_STRINGS, *_CAPABILITY_FLAGS)
        if any(n not in caps for n in names) or any(n not in names for n in caps):
            raise _Bad("metadata.memory_capabilities has missing or unknown fields")
        if any(not isinstance(caps[n], str) or not caps[n].strip() for n in _CAPABILITY_STRINGS):
            raise _Bad("metadata.memory_capabilities strings must be non-empty")
        if any(not isinstance(caps[n], bool) for n in _CAPABILITY_FLAGS):
            raise _Bad("metadata.memory_capabilities flags must be booleans")
        for counter, flag in (*_COUNTER_FLAGS, ("allocator_change_bytes", "supports_allocator_allocated")):
            if record[counter] is not None and not caps[flag]:
                raise _Bad(f"{counter} must be null when metadata.memory_capabilities.{flag} is false")


def _check_legacy(record: Mapping[str, Any], meta: Mapping[str, Any], ts: int) -> None:
    """The checks Stormlog's reader makes of a legacy record's counters (each an integer when
    given) and time (not before the epoch).

    Raises:
        _Bad: one fails.
    """
    values: dict[str, int | None] = {}

    def strict(key: str, value: Any, nullable: bool = False, counter: str | None = None) -> None:
        if value is None and nullable:
            values[counter or key] = None
            return
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Bad(f"{key} must be an integer")
        if counter is not None and counter != "allocator_change_bytes" and value < 0:
            raise _Bad(f"{key} must be >= 0")
        values[counter or key] = value

    if ts < 0:
        raise _Bad("timestamp_ns must be >= 0")
    for keys in (("device_id",), ("allocator_allocated_bytes", "memory_allocated"),
                 ("allocator_reserved_bytes", "memory_reserved"), ("allocator_change_bytes", "memory_change"),
                 ("device_used_bytes",)):
        key = next((k for k in keys if k in record), None)
        if key is not None:
            strict(key, record[key], counter=None if key == "device_id" else keys[0])
    for key in ("allocator_active_bytes", "allocator_inactive_bytes", "device_free_bytes"):
        strict(key, record.get(key), nullable=True, counter=key)
    for where in (record, meta):
        key = next((k for k in ("device_total_bytes", "total_memory", "device_total", "total_bytes") if k in where),
                   None)
        if key is not None:
            strict(key, where[key], nullable=True, counter="device_total_bytes")
            break
    total = values.get("device_total_bytes")
    used = values.get("device_used_bytes", values.get("allocator_allocated_bytes", 0))
    if total is not None:
        for name, v in (("device_used_bytes", used), ("device_free_bytes", values.get("device_free_bytes"))):
            if v is not None and v > total:
                raise _Bad(f"{name} cannot exceed device_total_bytes")


def _event(record: Any, default_session_id: str) -> dict[str, Any]:
    """The identity and time of one telemetry record (what a session summary needs).

    Raises:
        _Bad: Stormlog would refuse the record (and with it the file).
    """
    if not isinstance(record, Mapping):
        raise _Bad("a record is not an object")
    meta_raw = record.get("metadata")
    if "schema_version" in record:
        try:
            version = _int(record["schema_version"], "schema_version")
        except ValueError:
            raise _Bad("schema_version is not a number") from None
        if version not in (2, 3, 4):
            raise _Bad(f"unsupported schema_version {version}")
        if not isinstance(meta_raw, dict):
            raise _Bad("metadata must be an object")
        _check_versioned(record, version)
        meta: Mapping[str, Any] = meta_raw
        job, rank, local, world = _identity(record.get("job_id"), record.get("rank"), record.get("local_rank"),
                                            record.get("world_size"))
        host = record["host"]
        if not isinstance(host, str) or not host:
            raise _Bad("host must be a non-empty string")
        try:
            ts, pid = _int(record["timestamp_ns"], "timestamp_ns"), _int(record["pid"], "pid")
        except ValueError as exc:
            raise _Bad(str(exc).replace("\0", " ")) from None
        event_type = record["event_type"]
        if not isinstance(event_type, str) or not event_type:
            raise _Bad("event_type must be a non-empty string")
    else:
        if meta_raw is not None and not isinstance(meta_raw, Mapping):
            raise _Bad("metadata must be an object when provided")
        meta = {**(meta_raw or {}), **{k[9:]: v for k, v in record.items()
                                         if isinstance(k, str) and k.startswith("metadata_")}}
        if "timestamp_ns" in record:
            ts = record["timestamp_ns"]
            if not isinstance(ts, int) or isinstance(ts, bool):
                raise _Bad("timestamp_ns must be an integer")
        elif isinstance(record.get("timestamp"), (int, float)) and not isinstance(record.get("timestamp"), bool):
            ts = int(float(record["timestamp"]) * 1_000_000_000)
        else:
            raise _Bad("a legacy record has no valid timestamp")

        _check_legacy(record, meta, ts)

        def ident(key: str) -> Any:
            v = record.get(key)
            return meta.get(key) if v is None else v

        job, rank, local, world = _identity(ident("job_id"), ident("rank"), ident("local_rank"), ident("world_size"))
        host_v = record["host"] if "host" in record else meta.get("host")
        if ("host" in record or "host" in meta) and not (isinstance(host_v, str) and host_v.strip()):
            raise _Bad("host must be a non-empty string")
        host = host_v if isinstance(host_v, str) else "unknown"
        pid_v = record["pid"] if "pid" in record else meta.get("pid", -1)
        if not isinstance(pid_v, int) or isinstance(pid_v, bool):
            raise _Bad("pid must be an integer")
        pid = pid_v
        event_type = record.get("event_type", record.get("type", "sample"))
        if not isinstance(event_type, str) or not event_type.strip():
            raise _Bad("event_type must be a non-empty string")
    sid = record.get("session_id")
    if sid is None:
        sid = meta.get("session_id")
    if not (isinstance(sid, str) and sid.strip()):
        sid = default_session_id
    return {"session_id": sid, "timestamp_ns": ts, "event_type": event_type, "host": host, "pid": pid,
            "job_id": job, "rank": rank, "local_rank": local, "world_size": world}


def _sessions_from_events(events: list[dict[str, Any]], source: str,
                          summaries: dict[str, dict[str, Any]] | None = None,
                          warning_count: int = 0) -> list[dict[str, Any]]:
    """Group events by session; each session's summary is the ledger's when given, else inferred
    as Stormlog does: identity of the earliest event, started at its time, ``completed`` (ended at
    the last ``stop``) when a ``stop`` event exists, else ``incomplete``."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        grouped.setdefault(e["session_id"], []).append(e)
    out = []
    for sid in {**grouped, **(summaries or {})}:
        evs = sorted(grouped.get(sid, []), key=lambda e: e["timestamp_ns"])
        summary = (summaries or {}).get(sid)
        if summary is None:
            if not evs:
                continue
            first = evs[0]
            stops = [e["timestamp_ns"] for e in evs if e["event_type"] == "stop"]
            summary = {"session_id": sid, "status": "completed" if stops else "incomplete",
                       "started_at_ns": first["timestamp_ns"], "ended_at_ns": stops[-1] if stops else None,
                       "host": first["host"], "pid": first["pid"], "job_id": first["job_id"], "rank": first["rank"],
                       "local_rank": first["local_rank"], "world_size": max(1, first["world_size"]), "source": source}
        out.append({**summary, "event_count": len(evs), "warning_count": warning_count})
    return out


def read_telemetry(path: str, kind: str) -> Fact:
    """A telemetry file (``kind``: ``telemetry_json``, ``telemetry_jsonl`` or ``telemetry_csv``),
    loaded as Stormlog loads it: a JSON list of events, or an object with ``events`` or
    ``telemetry_events`` (with an optional ``session_summary``, as ``gpumemprof track`` writes), or
    one event; JSONL one event per line (a half-written last line is skipped); CSV one event per row
    (a bad row is a warning, counted in ``warning_count``). A file Stormlog refuses (not telemetry,
    or a bad record) has ``error`` and no sessions."""
    real = os.path.abspath(path)
    source = f"artifact:{os.path.basename(real)}"
    fact: Fact = {"type": "telemetry", "sessions": [], "error": None, "row_problems": []}
    try:
        if os.path.getsize(path) > TELEMETRY_FILE_LIMIT:
            fact["error"] = f"is over the {TELEMETRY_FILE_LIMIT}-byte limit for a telemetry file; not read"
            return fact
        if kind == "telemetry_csv":
            return _read_csv(path, real, source, fact)
        with open_regular(path) as f:
            data = f.read()
        if kind == "telemetry_jsonl":
            default = legacy_session_id(real, "sink")
            lines = data.split(b"\n")
            events = []
            for n, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = loads(line)
                except orjson.JSONDecodeError:
                    if n == len(lines):  # the last line, not ended yet: being written now
                        break
                    raise _Bad(f"line {n} is not valid JSON") from None
                if not isinstance(record, dict):
                    raise _Bad(f"line {n} is not a JSON object")
                events.append(_event(record, default))
            fact["sessions"] = _sessions_from_events(events, source)
            return fact
        doc = loads(data)
        summaries = None
        if isinstance(doc, list):
            if not doc:  # Stormlog skips it silently; a user wants to hear of it
                raise _Bad(f"is an empty list: {NO_EVENTS}")
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
                    if any(not isinstance(r, Mapping) or r.get("session_id") != summary["session_id"]
                           for r in records):
                        raise _Bad("the session summary does not match the events' session_id")
                    summaries = {summary["session_id"]: summary}
            elif any(k in doc for k in ("schema_version", "event_type", "type", "memory_allocated", "memory_mb",
                                        "timestamp", "timestamp_ns")):
                records = [doc]
            else:
                raise _Bad(NO_EVENTS)
        else:
            raise _Bad("is not a JSON object or list")
        default = legacy_session_id(real, "json")
        fact["sessions"] = _sessions_from_events([_event(r, default) for r in records], source, summaries)
    except _Bad as exc:
        fact["error"] = f"not loaded as telemetry: {exc}"
    except orjson.JSONDecodeError as exc:
        fact["error"] = f"not loaded as telemetry: not valid JSON ({exc})"
    except (OSError, UnicodeDecodeError) as exc:
        fact["error"] = f"cannot be read: {getattr(exc, 'strerror', None) or exc}"
    return fact


_CSV_INTS: Final = frozenset({"schema_version", "timestamp_ns", "sampling_interval_ms", "pid", "rank", "local_rank",
                              "world_size", "device_id", "allocator_allocated_bytes", "allocator_reserved_bytes",
                              "allocator_active_bytes", "allocator_inactive_bytes", "allocator_change_bytes",
                              "device_used_bytes", "device_free_bytes", "device_total_bytes", "memory_allocated",
                              "memory_reserved", "memory_change", "total_memory"})
"""CSV columns read as integers (as Stormlog's CSV reader does)."""


def _read_csv(path: str, real: str, source: str, fact: Fact) -> Fact:
    default = legacy_session_id(real, "csv")
    events = []
    problems: list[list[Any]] = []
    with open_regular(path) as raw_file, io.TextIOWrapper(raw_file, encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            record: dict[str, Any] = {}
            try:
                for key, raw in row.items():
                    if key is None:
                        continue
                    value: Any = raw.strip() if isinstance(raw, str) else raw
                    if value == "" or value is None:
                        record[key] = None
                    elif key == "metadata":
                        try:
                            parsed = loads(value)
                        except orjson.JSONDecodeError:
                            parsed = {}
                        record[key] = parsed if isinstance(parsed, dict) else {}
                    elif key in _CSV_INTS:
                        try:
                            record[key] = int(value)
                        except ValueError:
                            record[key] = int(float(value))
                    elif key == "timestamp":
                        record[key] = float(value)
                    else:
                        record[key] = value
                events.append(_event(record, default))
            except (ValueError, OverflowError) as exc:
                problems.append([f"line {n}", f"{exc}; row skipped"])
    fact["row_problems"] = problems
    fact["sessions"] = _sessions_from_events(events, source, warning_count=len(problems))
    return fact


# -- TraceML run folders ------------------------------------------------------------------------

def read_traceml_session(run_dir: str, present: Collection[str] | None = None) -> Fact:
    """A TraceML capture: ``<run_dir>/aggregator/manifest.json`` (written by the launcher, DESIGN §5)
    and the artifacts present beside it (telemetry database, export folder, final summary,
    finalization warning), listed as ``copy`` attachments. ``present``: the names in ``aggregator/``
    when the caller has listed it already (else each artifact is looked up)."""
    agg = os.path.join(run_dir, "aggregator")
    manifest = os.path.join(agg, MANIFEST_FILE)
    doc, error = _load_json(manifest)
    if error is not None:
        return {"type": "sessions", "sessions": [], "problems": [], "error": error}
    if not isinstance(doc, dict) or doc.get("format") != TRACEML_MANIFEST_FORMAT:
        return {"type": "none"}
    problems: list[list[str]] = []
    sid = doc.get("session_id")
    if not isinstance(sid, str) or not sid:
        problems.append(["session_id", "is missing or not a non-empty string"])
        return {"type": "sessions", "sessions": [], "problems": problems, "error": None}

    def num(key: str, minimum: int) -> int | None:
        v = doc.get(key)
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool) and v >= minimum:
            return v
        problems.append([key, f"has a bad value {_json(v)}; read as unknown"])
        return None

    rank = num("rank", 0)
    status = doc.get("status")
    if status is not None and status not in SESSION_STATUSES:
        problems.append(["status", f"{_json(status)} is not one of {', '.join(SESSION_STATUSES)}; read as unknown"])
        status = None
    job = doc.get("job_id")
    host = doc.get("hostname")
    artifacts: list[list[Any]] = []
    for name, kind, title in TRACEML_ARTIFACTS:
        p = os.path.join(agg, name)
        if name in present if present is not None else os.path.exists(p):
            artifacts.append([f"{sid}/aggregator/{name}", kind, p, title])
    session = {
        "session_id": sid, "status": status, "started_at_ns": num("started_at_ns", 0),
        "ended_at_ns": num("ended_at_ns", 0), "host": host if isinstance(host, str) and host else "unknown",
        "pid": -1, "job_id": job if isinstance(job, str) and job else None, "rank": rank,
        "local_rank": num("local_rank", 0), "world_size": num("world_size", 1), "source": "traceml.aggregator",
        "role": doc["role"] if isinstance(doc.get("role"), str) else (
            None if doc.get("rank") is not None and rank is None  # a bad rank: the role is unknown
            else "rank" if rank is not None else "job"),
        "metadata": {**{k: doc[k] for k in ("run_id", "mode", "node_rank", "nnodes", "nproc_per_node", "exit_code")
                        if k in doc}, "run_folder": os.path.basename(run_dir)},
        "artifacts": artifacts,
    }
    return {"type": "sessions", "sessions": [session], "problems": problems, "error": None}
