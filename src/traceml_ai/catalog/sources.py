"""Reading one catalog file into plain facts (004 seed; DESIGN §5; what is read: docs/catalog.md).

Each reader takes one path and returns a :data:`Fact`: a dict of plain JSON values, so that the
parse cache (:mod:`traceml_ai.catalog.cache`) can keep it between runs. Readers never raise for a
bad file: a file that cannot be read or parsed becomes a fact with an ``error`` (later a warning).

Facts:

- ``{"type": "envelope", "doc", "problems", "error"}``: a ``stormlog_run.json``, validated.
- ``{"type": "sidecar", "doc", "items", "item_problems", "problems", "error"}``: a
  ``stormlog_attachments.json``; ``items`` holds ``[index, item]`` of the accepted items only.
- ``{"type": "sessions", "sessions", "problems", "error"}``: session identities read from a TraceML
  manifest, a Stormlog sink ledger, a diagnose/OOM bundle or a telemetry JSONL file.
- ``{"type": "none"}``: the file is not a catalog file (e.g. a ``manifest.json`` of something else).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any, Final

import orjson

from traceml_ai.catalog.schema import SESSION_STATUSES, envelope_problems, sidecar_problems
from traceml_ai.runs.layout import MAX_SMALL_FILE_BYTES
from traceml_ai.runs.safeio import open_regular

Fact = dict[str, Any]

TRACEML_MANIFEST_FORMAT: Final = "traceml.session_manifest"
SINK_MANIFEST_FORMAT: Final = "stormlog.sink_manifest"
BUNDLE_FORMATS: Final = {"stormlog.diagnose_bundle": "diagnose_bundle", "stormlog.oom_bundle": "oom_bundle"}
BUNDLE_FILE: Final = "bundle.json"
SINK_MANIFEST_FILE: Final = "manifest.json"

JSONL_PEEK_BYTES: Final = 64 * 1024
"""A telemetry JSONL file is read only at its head and tail: this many bytes of each."""

TRACEML_ARTIFACTS: Final = (
    ("telemetry.sqlite", "telemetry_database", "Telemetry database (SQLite)"),
    ("export", "export", "Exported telemetry records (JSONL)"),
    ("final_summary.json", "final_summary", "Final summary with diagnoses"),
    ("finalization_warning.json", "finalization_warning", "What was lost during capture"),
)
"""Files of ``<run>/aggregator/`` listed as ``copy`` attachments of a TraceML session (DESIGN §2.1)."""

IDENTITY_INTS: Final = ("rank", "local_rank", "world_size", "started_at_ns", "ended_at_ns")
IDENTITY_STRS: Final = ("job_id", "role", "hostname")


def _load_json(path: str) -> tuple[Any, str | None]:
    try:
        with open_regular(path) as f:
            data = f.read(MAX_SMALL_FILE_BYTES + 1)
        if len(data) > MAX_SMALL_FILE_BYTES:
            return None, f"is over the {MAX_SMALL_FILE_BYTES}-byte limit for a catalog file; not read"
        return orjson.loads(data), None
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None, "is not UTF-8 text (a binary file?); not read"
        return None, f"is not valid JSON: {exc}"


def read_envelope(path: str) -> Fact:
    """Parse and validate a ``stormlog_run.json`` (schema v1 plus the time-order and id checks)."""
    doc, error = _load_json(path)
    if error is not None:
        return {"type": "envelope", "doc": None, "problems": [], "error": error}
    problems = envelope_problems(doc)
    return {"type": "envelope", "doc": doc if not problems else None,
            "problems": [list(p) for p in problems], "error": None}


def read_sidecar(path: str) -> Fact:
    """Parse and validate a ``stormlog_attachments.json``; a bad item rejects only itself."""
    doc, error = _load_json(path)
    if error is not None:
        return {"type": "sidecar", "doc": None, "items": [], "item_problems": [], "problems": [], "error": error}
    file_problems, item_problems = sidecar_problems(doc)
    if file_problems or not isinstance(doc, dict):
        return {"type": "sidecar", "doc": None, "items": [], "item_problems": [],
                "problems": [list(p) for p in file_problems], "error": None}
    items = [[i, item] for i, item in enumerate(doc["attachments"]) if i not in item_problems]
    header = {k: v for k, v in doc.items() if k != "attachments"}
    flat = [[i, p.field, p.message] for i, ps in sorted(item_problems.items()) for p in ps]
    return {"type": "sidecar", "doc": header, "items": items, "item_problems": flat, "problems": [], "error": None}


def _identity(raw: Any, prefix: str, problems: list[list[str]]) -> dict[str, Any] | None:
    """The identity fields of one session record; None (with a problem) when it has no session_id.
    A field of the wrong type becomes None with a problem naming it."""
    if not isinstance(raw, dict):
        problems.append([prefix or "", "is not a JSON object"])
        return None
    sid = raw.get("session_id")
    if not isinstance(sid, str) or not sid:
        problems.append([_join(prefix, "session_id"), "is missing or not a non-empty string"])
        return None
    ident: dict[str, Any] = {"session_id": sid}
    for key in IDENTITY_INTS:
        value = raw.get(key)
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        if ok and key == "world_size" and value == 0:
            ok = False
        if not ok:
            problems.append([_join(prefix, key), f"has a bad value {_json(value)}; read as unknown"])
        ident[key] = value if ok else None
    for key in IDENTITY_STRS:
        value = raw.get(key)
        ok = value is None or (isinstance(value, str) and bool(value))
        if not ok:
            problems.append([_join(prefix, key), f"has a bad value {_json(value)}; read as unknown"])
        ident[key] = value if ok else None
    status = raw.get("status")
    if status is not None and status not in SESSION_STATUSES:
        problems.append([_join(prefix, "status"), f"{_json(status)} is not one of {', '.join(SESSION_STATUSES)}; "
                                                  "read as unknown"])
        status = None
    ident["status"] = status
    meta = raw.get("metadata")
    ident["metadata"] = meta if isinstance(meta, dict) else {}
    return ident


def _json(value: Any) -> str:
    """A value as messages show it: JSON (``null``, ``"zero"``), cut at 60 characters."""
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _sessions_fact(sessions: list[dict[str, Any]], problems: list[list[str]], error: str | None = None) -> Fact:
    return {"type": "sessions", "sessions": sessions, "problems": problems, "error": error}


def read_traceml_session(run_dir: str, present: Collection[str] | None = None) -> Fact:
    """A TraceML capture: ``<run_dir>/aggregator/manifest.json`` (written by the launcher, DESIGN §5)
    and the artifacts present beside it (telemetry database, export folder, final summary,
    finalization warning), listed as ``copy`` attachments. ``present``: the names in ``aggregator/``
    when the caller has listed it already (else each artifact is looked up)."""
    agg = os.path.join(run_dir, "aggregator")
    manifest = os.path.join(agg, "manifest.json")
    doc, error = _load_json(manifest)
    if error is not None:
        return _sessions_fact([], [], error)
    problems: list[list[str]] = []
    if isinstance(doc, dict) and doc.get("format") not in (None, TRACEML_MANIFEST_FORMAT):
        return {"type": "none"}
    ident = _identity(doc, "", problems)
    if ident is None or not isinstance(doc, dict):
        return _sessions_fact([], problems)
    if ident["role"] is None and (ident["rank"] is not None or doc.get("rank") is None):
        # no rank recorded: one aggregator for the whole job; a bad rank leaves the role unknown
        ident["role"] = "rank" if ident["rank"] is not None else "job"
    ident["metadata"] = {k: doc[k] for k in ("run_id", "mode", "node_rank", "nnodes", "nproc_per_node",
                                             "exit_code") if k in doc}
    ident["metadata"]["run_folder"] = os.path.basename(run_dir)
    artifacts: list[list[Any]] = []
    for name, kind, title in TRACEML_ARTIFACTS:
        p = os.path.join(agg, name)
        if name in present if present is not None else os.path.exists(p):
            artifacts.append([f"{ident['session_id']}/aggregator/{name}", kind, p, title])
    ident.update(kind="traceml_session", source_path=manifest, artifacts=artifacts, secondary=False)
    return _sessions_fact([ident], problems)


def read_sink_manifest(path: str) -> Fact:
    """A Stormlog sink folder's ``manifest.json``: a ledger with one entry per session written into
    that folder, each naming its ``segments`` and ``rollups`` (paths relative to the folder).
    Another kind of ``manifest.json`` (no ``sessions`` list, another ``format``) is not a catalog file."""
    doc, error = _load_json(path)
    if error is not None:
        return {"type": "none"}  # a manifest.json we cannot read may be anybody's; nothing to report
    if not isinstance(doc, dict) or not isinstance(doc.get("sessions"), list):
        return {"type": "none"}
    if doc.get("format") not in (None, SINK_MANIFEST_FORMAT):
        return {"type": "none"}
    folder = os.path.dirname(path)
    problems: list[list[str]] = []
    sessions = []
    for i, entry in enumerate(doc["sessions"]):
        ident = _identity(entry, f"sessions[{i}]", problems)
        if ident is None:
            continue
        sid = ident["session_id"]
        if ident["role"] is None and ident["rank"] is not None:
            ident["role"] = "rank"
        artifacts: list[list[Any]] = [[f"{sid}/sink", "sink", folder, "Sink folder"]]
        for key, kind in (("segments", "sink_segment"), ("rollups", "rollup")):
            for rel in entry.get(key) or []:
                if isinstance(rel, str) and rel:
                    artifacts.append([f"{sid}/{rel}", kind, os.path.normpath(os.path.join(folder, rel)), None])
                else:
                    problems.append([f"sessions[{i}].{key}", f"holds {_json(rel)}, not a relative path; skipped"])
        ident.update(kind="sink_session", source_path=path, artifacts=artifacts, secondary=False)
        sessions.append(ident)
    return _sessions_fact(sessions, problems)


def read_bundle(path: str) -> Fact:
    """A diagnose or OOM bundle folder's ``bundle.json``: ``format`` ``stormlog.diagnose_bundle`` or
    ``stormlog.oom_bundle`` and a ``session`` object with the identity of the session it was taken from.
    The bundle folder itself becomes a ``copy`` attachment of that session."""
    doc, error = _load_json(path)
    if error is not None or not isinstance(doc, dict) or doc.get("format") not in BUNDLE_FORMATS:
        return {"type": "none"}
    kind = BUNDLE_FORMATS[doc["format"]]
    problems: list[list[str]] = []
    ident = _identity(doc.get("session"), "session", problems)
    if ident is None:
        return _sessions_fact([], problems)
    folder = os.path.dirname(path)
    title = doc.get("title") if isinstance(doc.get("title"), str) else None
    ident.update(kind=kind, source_path=path, secondary=True,
                 artifacts=[[f"{ident['session_id']}/{os.path.basename(folder)}", kind, folder, title]])
    return _sessions_fact([ident], problems)


def read_telemetry_jsonl(path: str) -> Fact:
    """A Stormlog telemetry JSONL file: its first line is a JSON object with a string ``session_id``
    (and the identity fields, ``timestamp_ns`` = start); when its last line is
    ``{"event": "session_end", "status": ..., "timestamp_ns": ...}`` that gives status and end.
    Only the first and last :data:`JSONL_PEEK_BYTES` are read. A JSONL file whose first line has
    no ``session_id`` (e.g. a run's ``metrics.jsonl``) is not a catalog file."""
    try:
        with open_regular(path) as f:
            head = f.read(JSONL_PEEK_BYTES)
            size = f.seek(0, os.SEEK_END)
            if size > JSONL_PEEK_BYTES:
                f.seek(size - JSONL_PEEK_BYTES)
                tail = f.read(JSONL_PEEK_BYTES)
            else:
                tail = head
    except OSError as exc:
        return _sessions_fact([], [], f"cannot be read: {exc.strerror or exc}")
    first_line = head.split(b"\n", 1)[0]
    try:
        first = orjson.loads(first_line)
    except orjson.JSONDecodeError:
        return {"type": "none"}
    if not isinstance(first, dict) or not isinstance(first.get("session_id"), str):
        return {"type": "none"}
    problems: list[list[str]] = []
    raw = dict(first)
    raw.setdefault("started_at_ns", first.get("timestamp_ns"))
    raw.pop("status", None)
    raw.pop("ended_at_ns", None)
    last_line = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        last = orjson.loads(last_line)
    except orjson.JSONDecodeError:
        last = None  # a line being appended right now; status stays unknown
    if isinstance(last, dict) and last.get("event") == "session_end":
        raw["status"] = last.get("status", "completed")
        raw["ended_at_ns"] = last.get("timestamp_ns")
    raw["metadata"] = {}
    ident = _identity(raw, "line 1", problems)
    # status and end come from the last line, the start may come from line 1's timestamp_ns:
    # name the field where it was read
    renamed = {"line 1.status": "last line.status", "line 1.ended_at_ns": "last line.timestamp_ns"}
    if "started_at_ns" not in first:
        renamed["line 1.started_at_ns"] = "line 1.timestamp_ns"
    for problem in problems:
        problem[0] = renamed.get(problem[0], problem[0])
    if ident is None:
        return _sessions_fact([], problems)
    if ident["role"] is None and ident["rank"] is not None:
        ident["role"] = "rank"
    ident.update(kind="telemetry_jsonl", source_path=path, secondary=False,
                 artifacts=[[f"{ident['session_id']}/{os.path.basename(path)}", "telemetry_jsonl", path, None]])
    return _sessions_fact([ident], problems)
