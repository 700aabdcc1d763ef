"""Runs from discovered facts: sessions, explicit and implicit runs, and their attachments, by
real Stormlog 0.4.3's rules (004 seed, "Discovery Rules" and "Attachments"; DESIGN §5). Pure:
reads no file.

1. Sessions: a sink's ledger entries (identity and lifecycle from the ledger), a diagnose bundle's
   session (unless its own sink lists it), each session of a telemetry file, and TraceML run
   folders. Several artifacts naming one ``session_id`` are one session (the first, latest start
   first, of the artifact holding its lifecycle: :func:`_lifecycle_rank`), reported as
   ``duplicate_session`` (Stormlog lists it once per artifact).
2. Envelopes: a schema-invalid envelope is rejected (one warning per problem, naming the field).
   Every ``run_id`` must be unique: envelopes sharing one are all rejected (``duplicate_run_id``);
   their sessions fall back to implicit runs and their attachments are not indexed.
3. Explicit runs: each accepted envelope is a run of the sessions it names that exist (a named
   session not found is reported, ``session_not_found``); when none of them exists and the
   envelope has a ``job_id``, of every session of that job. A session named by two envelopes is in
   both runs (``session_claimed_twice``).
4. Implicit runs, for sessions no accepted envelope covers: sessions sharing a non-null ``job_id``
   are one run ``job:<job_id>``; a session without one is its own run ``session:<session_id>``.
5. Attachments: an envelope's own (run = its ``run_id`` or the envelope's; relative paths against
   the envelope's folder; URLs recorded, never fetched); sidecar items (run = their ``run_id``, else
   the one run of their ``source_namespace``/``source_ref``, of their ``session_id``, of their
   ``job_id``; an item that resolves to none is reported, ``unresolved_attachment``, and not
   indexed); the local artifacts of each session (sink folder, segments, rollups, diagnose and OOM
   bundles, telemetry files, a TraceML run folder's files), all ``copy``. An identity that maps to
   several runs is not used for resolving (``ambiguous_identity``).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any

from traceml_ai.catalog.discovery import Found, Source
from traceml_ai.catalog.model import AttachmentRow, CatalogWarning, RunRow, SessionRow
from traceml_ai.catalog.sources import NO_EVENTS, ROLLUP_FILE
from traceml_ai.runs.discovery import inside

URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A ``path`` that starts like this is a URL written in the wrong field."""


@dataclass
class Catalog:
    """Everything the store answers from: rows in Stormlog's order (runs latest first, sessions
    latest first, attachments by run, session, rank, kind, title)."""

    runs: list[RunRow] = field(default_factory=list)
    sessions: list[SessionRow] = field(default_factory=list)
    warnings: list[CatalogWarning] = field(default_factory=list)
    oom_bundles: list[dict[str, Any]] = field(default_factory=list)
    sidecar_items: list[dict[str, Any]] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    """The session sources in discovery order (events are read from them on demand)."""
    pending: list[AttachmentRow | partial[AttachmentRow]] = field(default_factory=list)
    _attachments: list[AttachmentRow] | None = None

    @property
    def attachments(self) -> list[AttachmentRow]:
        """The attachment rows, made on first use: listing runs needs only their counts, and a
        sink session has three or more local artifacts."""
        if self._attachments is None:
            rows = [r if isinstance(r, AttachmentRow) else r() for r in self.pending]
            rows.sort(key=lambda r: (r.run_id or "", r.session_id or "", r.rank if r.rank is not None else -1,
                                     r.kind, r.title, r.source_path))
            self._attachments = rows
            self.pending = []
        return self._attachments


@dataclass
class _Ctx:
    run_id: str
    explicit: bool
    title: str | None
    description: str | None
    job_id: str | None
    started_at_ns: int | None
    ended_at_ns: int | None
    source_path: str
    source_kind: str
    source_namespace: str | None
    source_ref: str | None
    sessions: list[dict[str, Any]]
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


def _resolve(raw: str, folder: str) -> str:
    """A declared path made absolute against ``folder`` and resolved (as Stormlog: symlinks too;
    ``~`` is a folder name there, never the home folder, as in Stormlog)."""
    path = raw
    if not os.path.isabs(path):
        path = os.path.join(folder, path)
    return os.path.realpath(path)


def _iso_ns(text: str | None) -> int | None:
    if not text:
        return None
    t = text.strip()
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    try:
        d = datetime.fromisoformat(t)
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return int(d.timestamp() * 1_000_000_000)


_PRIORITY = {"sink": 0, "diagnose_bundle": 1, "traceml_session": 2}
"""Which artifact's row a session listed by several is read from (lowest first; telemetry files last)."""


def _lifecycle_rank(rec: dict[str, Any]) -> tuple[int, bool]:
    """Which of several rows of one session is listed (lowest first): by :data:`_PRIORITY`, then a
    row whose lifecycle a writer recorded before one rebuilt from events (``source`` ``artifact:...``:
    a sink whose ledger entry for it was skipped)."""
    return _PRIORITY.get(rec["source_kind"], 9), str(rec.get("source") or "").startswith("artifact:")


def _start_key(s: dict[str, Any]) -> tuple[int, str]:
    started = s["started_at_ns"]
    return (started if started is not None else -1, s["session_id"])


_COUNTS = ("event_count", "source_count", "warning_count")


def _with_ledger(sessions: list[dict[str, Any]], ledger: dict[str, Any], base: dict[str, Any],
                 path: str) -> list[dict[str, Any]]:
    """The sessions of a JSONL file beside a sink ledger (a segment given alone), as Stormlog's
    loader reads them: a session the ledger records takes its lifecycle and identity from its
    ledger entry (status, start, end, source, ...), its counts from the file; a session the
    ledger's ``segments`` list assigns to this file but without events in it is listed with 0
    events. Stormlog also lists every other session of the ledger from this file (0 events); TraceML
    lists only the sessions the file holds (docs/catalog.md, "Differences from Stormlog")."""
    entries = {e["session_id"]: e for e in ledger["sessions"]}
    out = []
    for s in sessions:
        entry = entries.get(s["session_id"])
        out.append(s if entry is None else {**s, **entry, **{k: s[k] for k in _COUNTS if k in s}})
    have = {s["session_id"] for s in out}
    name = os.path.basename(path)
    for seg in ledger["segments"]:
        sid = seg["session_id"]
        if seg["filename"] == name and sid in entries and sid not in have:
            have.add(sid)
            out.append({**base, **entries[sid], "source_count": 1, "warning_count": 0, "event_count": 0})
    return out


class _Builder:
    def __init__(self, found: Found) -> None:
        self.found = found
        self.warnings: list[CatalogWarning] = list(found.warnings)
        self.sessions: list[dict[str, Any]] = []
        self.by_id: dict[str, dict[str, Any]] = {}
        self.envelopes: list[tuple[str, dict[str, Any]]] = []
        self.contexts: dict[str, _Ctx] = {}
        self.bundle_timelines: set[str] = set()
        """Files a diagnose bundle lists that hold no events (its ``telemetry_timeline.json``): not
        sources of sessions or events, and not reported (Stormlog records ``load failed``)."""

    def warn(self, path: str, fld: str | None, message: str, code: str) -> None:
        self.warnings.append(CatalogWarning(path=path, field=fld or None, message=message, code=code))

    # -- 1. sessions ---------------------------------------------------------------------------

    def collect_sessions(self) -> None:
        for path, fact in self.found.manifest_problems:
            for fld, message in fact["problems"]:
                self.warn(path, fld, message, "invalid_session")
        oom_counts: dict[str, int] = defaultdict(int)
        for _folder, _manifest, oom in self.found.oom_bundles:
            if oom["session_id"] is not None:
                oom_counts[oom["session_id"]] += 1
        rows: list[dict[str, Any]] = []
        seen: set[tuple[str, str, str]] = set()
        for source in self.found.sources:
            for rec in self._source_sessions(source):
                key = (rec["session_id"], rec["source_path"], rec["source_kind"])
                if key not in seen:
                    seen.add(key)
                    rows.append(rec)
        for manifest, fact in self.found.traceml:
            if fact.get("error"):
                self.warn(manifest, None, fact["error"], "unreadable")
            for fld, message in fact.get("problems", []):
                self.warn(manifest, fld, message, "invalid_session")
            for s in fact["sessions"]:
                rows.append({**s, "source_path": manifest, "source_kind": "traceml_session", "source_count": 1,
                             "warning_count": 0, "event_count": None})
        rows.sort(key=_start_key, reverse=True)
        groups: dict[str, list[dict[str, Any]]] = {}
        for rec in rows:
            rec["oom_bundle_count"] = oom_counts.get(rec["session_id"], 0)
            groups.setdefault(rec["session_id"], []).append(rec)
        for sid, same in groups.items():
            # the artifact holding the lifecycle wins: a sink ledger, a bundle, a run folder, then files
            # (among sinks, one whose ledger entry was read before one rebuilt from its events)
            best = min(same, key=_lifecycle_rank)
            for rec in same:
                if rec is not best:
                    self.warn(rec["source_path"], "session_id",
                              f"session {sid!r} is also in {best['source_path']}; listed once, from there "
                              "(Stormlog lists it once per artifact)", "duplicate_session")
            best["also"] = [r for r in same if r is not best]
            self.by_id[sid] = best
            self.sessions.append(best)
        self.sessions.sort(key=_start_key, reverse=True)

    def _source_sessions(self, source: Source) -> list[dict[str, Any]]:
        fact = source.fact
        base: dict[str, Any] = {"source_path": source.path, "source_kind": source.kind, "source": None, "role": None,
                "metadata": {}, "artifacts": []}
        if source.kind == "sink":
            sink = fact["sink"]
            if sink["sessions"]:
                out = []
                for s in sink["sessions"]:
                    segs = [g for g in sink["segments"] if g["session_id"] == s["session_id"]]
                    out.append({**base, **s, "source_count": len(segs), "warning_count": 0,
                                "event_count": sum(g["event_count"] for g in segs)})
                return out
            merged: dict[str, dict[str, Any]] = {}
            for seg_path, seg in source.segment_facts:
                if seg["error"]:
                    self.warn(seg_path, None, seg["error"], "telemetry_not_loaded")
                    return []
                for s in seg["sessions"]:
                    have = merged.get(s["session_id"])
                    if have is None:  # as Stormlog's loader names a sink's session without a ledger entry
                        merged[s["session_id"]] = {**base, **s, "source": f"artifact:{os.path.basename(source.path)}",
                                                   "source_count": 1}
                    else:
                        have["event_count"] += s["event_count"]
                        have["source_count"] += 1
            return list(merged.values())
        if source.kind == "diagnose_bundle":
            summary = fact["diagnose"]["summary"]
            if summary is None or summary["session_id"] in self._sink_sessions_inside(source.path):
                return []
            return [{**base, **summary, "source_count": 1, "warning_count": 0, "event_count": None}]
        if fact["error"]:
            if fact["error"].endswith(NO_EVENTS) and source.path in self.found.bundle_files:
                self.bundle_timelines.add(source.path)
            else:
                self.warn(source.path, None, f"{fact['error']}; no session read from it", "telemetry_not_loaded")
            return []
        for fld, message in fact.get("row_problems", []):
            self.warn(source.path, fld, message, "invalid_session")
        sessions = [{**base, **s, "source_count": 1} for s in fact["sessions"]]
        return sessions if source.ledger is None else _with_ledger(sessions, source.ledger, base, source.path)

    def _sink_sessions_inside(self, folder: str) -> set[str]:
        prefix = folder.rstrip(os.sep) + os.sep
        return {s["session_id"] for src in self.found.sources
                if src.kind == "sink" and src.path.startswith(prefix) for s in src.fact["sink"]["sessions"]}

    # -- 2, 3. envelopes and explicit runs ------------------------------------------------------

    def explicit_runs(self) -> None:
        valid: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for path, fact in self.found.envelopes:
            if fact.get("error"):
                self.warn(path, None, f"{fact['error']}; envelope rejected", "unreadable")
                continue
            if fact["problems"]:
                for fld, message in fact["problems"]:
                    self.warn(path, fld or None, f"{_v1(message)}; envelope rejected, its sessions fall back to "
                                                 "implicit runs", "invalid_envelope")
                continue
            valid[fact["doc"]["run_id"]].append((path, fact["doc"]))
        for run_id, group in valid.items():
            if len(group) > 1:
                paths = [p for p, _ in group]
                for path in paths:
                    others = ", ".join(p for p in paths if p != path)
                    self.warn(path, "run_id", f"run_id {run_id!r} is also declared by {others}; all "
                                              f"{len(paths)} envelopes are rejected: their sessions fall back to "
                                              "implicit runs and their attachments are not indexed",
                              "duplicate_run_id")
                continue
            self.envelopes.append(group[0])
        claimed: dict[str, str] = {}
        for path, doc in self.envelopes:
            members: list[dict[str, Any]] = []
            for i, entry in enumerate(doc.get("sessions") or []):
                sid = entry["session_id"]
                rec = self.by_id.get(sid)
                if rec is None:
                    self.warn(path, f"sessions[{i}].session_id", f"session {sid!r} is named by the envelope but "
                                                                 "was not found", "session_not_found")
                elif rec not in members:
                    members.append(rec)
                    other = claimed.setdefault(sid, doc["run_id"])
                    if other != doc["run_id"]:
                        self.warn(path, f"sessions[{i}].session_id",
                                  f"session {sid!r} is also claimed by run {other!r}; it is listed in both runs",
                                  "session_claimed_twice")
            if not members and doc.get("job_id") is not None:
                members = [s for s in self.sessions if s["job_id"] == doc["job_id"]]
            members.sort(key=_start_key)
            jobs = {s["job_id"] for s in members if s["job_id"] is not None}
            ends = [s["ended_at_ns"] for s in members]
            starts = [s["started_at_ns"] for s in members if s["started_at_ns"] is not None]
            self.contexts[doc["run_id"]] = _Ctx(
                run_id=doc["run_id"], explicit=True, title=doc.get("title"), description=doc.get("description"),
                job_id=doc.get("job_id") or (next(iter(jobs)) if len(jobs) == 1 else None),
                started_at_ns=doc.get("started_at_ns") if doc.get("started_at_ns") is not None else (
                    min(starts) if starts else None),
                ended_at_ns=doc.get("ended_at_ns") if doc.get("ended_at_ns") is not None else (
                    max(e for e in ends if e is not None) if ends and None not in ends else None),
                source_path=path, source_kind="run_envelope", source_namespace=doc.get("source_namespace"),
                source_ref=doc.get("source_ref"), sessions=members, tags=tuple(doc.get("tags") or ()),
                metadata=dict(doc["metadata"]),
            )

    # -- 4. implicit runs -----------------------------------------------------------------------

    def implicit_runs(self) -> None:
        covered = {id(s) for c in self.contexts.values() for s in c.sessions}
        grouped: dict[str, list[dict[str, Any]]] = {}
        for s in self.sessions:
            if id(s) in covered:
                continue
            key = f"job:{s['job_id']}" if s["job_id"] is not None else f"session:{s['session_id']}"
            grouped.setdefault(key, []).append(s)
        used = set(self.contexts)
        for base, members in grouped.items():
            run_id = base
            if run_id in used:
                run_id = f"implicit:{base}"
                n = 2
                while run_id in used:
                    run_id = f"implicit:{base}:{n}"
                    n += 1
            used.add(run_id)
            members.sort(key=_start_key)
            jobs = {s["job_id"] for s in members if s["job_id"] is not None}
            job = next(iter(jobs)) if len(jobs) == 1 else None
            ends = [s["ended_at_ns"] for s in members]
            starts = [s["started_at_ns"] for s in members if s["started_at_ns"] is not None]
            self.contexts[run_id] = _Ctx(
                run_id=run_id, explicit=False,
                title=f"Distributed job {job}" if job is not None else f"Session {members[0]['session_id']}",
                description=None, job_id=job, started_at_ns=min(starts) if starts else None,
                ended_at_ns=max(e for e in ends if e is not None) if None not in ends else None,
                source_path=members[0]["source_path"], source_kind="implicit_run", source_namespace=None,
                source_ref=None, sessions=members,
            )

    # -- 5. attachments -------------------------------------------------------------------------

    def identity_index(self) -> tuple[dict[str, str], dict[str, str], dict[tuple[str, str], str]]:
        sess: dict[str, set[str]] = defaultdict(set)
        jobs: dict[str, set[str]] = defaultdict(set)
        refs: dict[tuple[str, str], set[str]] = defaultdict(set)
        for c in self.contexts.values():
            if c.job_id is not None:
                jobs[c.job_id].add(c.run_id)
            if c.source_namespace is not None and c.source_ref is not None:
                refs[(c.source_namespace, c.source_ref)].add(c.run_id)
            for s in c.sessions:
                sess[s["session_id"]].add(c.run_id)
                if s["job_id"] is not None:
                    jobs[s["job_id"]].add(c.run_id)

        def unique(kind: str, cands: dict[Any, set[str]]) -> dict[Any, str]:
            out = {}
            for value, runs in cands.items():
                if len(runs) == 1:
                    out[value] = next(iter(runs))
                else:
                    shown = f"{value[0]}:{value[1]}" if isinstance(value, tuple) else value
                    self.warn("<run-catalog>", kind, f"ambiguous run {kind} {shown!r}: {', '.join(sorted(runs))}; "
                                                     "not used to place attachments", "ambiguous_identity")
            return out

        return unique("session_id", sess), unique("job_id", jobs), unique("source_ref", refs)

    def attachments(self) -> list[AttachmentRow | partial[AttachmentRow]]:
        """Every attachment row (or, for local artifacts, the call that makes it), unsorted."""
        by_session, by_job, by_ref = self.identity_index()

        def run_for(run_id: str | None, session_id: str | None, job_id: str | None, ns: str | None = None,
                    ref: str | None = None) -> str | None:
            if run_id is not None:
                return run_id
            if ns is not None and ref is not None and (ns, ref) in by_ref:
                return by_ref[(ns, ref)]
            if session_id is not None and session_id in by_session:
                return by_session[session_id]
            return by_job.get(job_id) if job_id is not None else None

        rows: list[AttachmentRow | partial[AttachmentRow]] = []
        for path, doc in self.envelopes:
            folder = os.path.dirname(path)
            for i, item in enumerate(doc.get("attachments") or []):
                local = _resolve(item["path"], folder) if item.get("path") else None
                self._check_declared(path, f"attachments[{i}]", item, local, item["storage"])
                url = item.get("url")
                rows.append(AttachmentRow(
                    run_id=item.get("run_id") or doc["run_id"], title=item["title"], kind=item["kind"],
                    storage=item["storage"], attachment_id=item.get("attachment_id"), url=url, path=local,
                    session_id=item.get("session_id"), job_id=item.get("job_id") or doc.get("job_id"),
                    rank=item.get("rank"), local_rank=item.get("local_rank"), world_size=item.get("world_size"),
                    start_ns=item.get("start_ns"), end_ns=item.get("end_ns"), source_path=url or local or path,
                    source_kind="run_envelope_attachment",
                    source_namespace=item.get("source_namespace") or doc.get("source_namespace"),
                    source_ref=item.get("source_ref") or doc.get("source_ref"),
                    metadata=dict(item["metadata"]), declared_in=path,
                ))
        for path, fact in self.found.sidecars:
            folder = os.path.dirname(path)
            for i, item in fact["items"]:
                run_id = run_for(item["run_id"], item["session_id"], item["job_id"], item["source_namespace"],
                                 item["source_ref"])
                prefix = f"attachments[{i}]"
                if run_id is None:
                    self.warn(path, prefix, f"attachment {item['title']!r} resolves to no run (no run_id, and no "
                                            "one run has its source_ref, session_id or job_id); not indexed",
                              "unresolved_attachment")
                    continue
                local = _resolve(item["path"], folder) if item["path"] else None
                self._check_declared(path, prefix, item, local, item["storage"])
                rows.append(AttachmentRow(
                    run_id=run_id, title=item["title"], kind=item["kind"], storage=item["storage"],
                    attachment_id=item["attachment_id"], url=item["url"], path=local,
                    session_id=item["session_id"], job_id=item["job_id"], rank=item["rank"],
                    start_ns=item["start_ns"], end_ns=item["end_ns"], source_path=item["url"] or local or path,
                    source_kind="attachment_sidecar", source_namespace=item["source_namespace"],
                    source_ref=item["source_ref"], metadata=item["metadata"], declared_in=path,
                ))

        def mk(run_id: str, title: str, kind: str, path: str, s: dict[str, Any] | None, source_kind: str,
                  metadata: dict[str, Any], declared_in: str, session_id: str | None = None,
                  start_ns: int | None = None, end_ns: int | None = None, use_times: bool = True,
                  namespace: str = "stormlog", attachment_id: str | None = None) -> AttachmentRow:
            return AttachmentRow(
                run_id=run_id, title=title, kind=kind, storage="copy", attachment_id=attachment_id, url=None,
                path=path, session_id=session_id if session_id is not None else (s["session_id"] if s else None),
                job_id=s["job_id"] if s else None, rank=s["rank"] if s else None,
                local_rank=s["local_rank"] if s else None, world_size=s["world_size"] if s else None,
                start_ns=(s["started_at_ns"] if s else None) if use_times else start_ns,
                end_ns=(s["ended_at_ns"] if s else None) if use_times else end_ns, source_path=path,
                source_kind=source_kind, source_namespace=namespace, source_ref=None, metadata=metadata,
                declared_in=declared_in,
            )

        members = [s for c in self.contexts.values() for s in c.sessions]
        for source in self.found.sources:
            manifest = source.manifest or source.path
            if source.kind == "sink":
                sink = source.fact["sink"]
                ledger = {s["session_id"]: s for s in sink["sessions"]}
                for s in sink["sessions"]:
                    run_id = run_for(None, s["session_id"], s["job_id"])
                    if run_id is not None:
                        rows.append(partial(mk, run_id, "Telemetry sink", "telemetry_sink", source.path, s, "sink",
                                          {"manifest_path": source.manifest}, manifest))
                prefix = source.path.rstrip(os.sep) + os.sep
                for g in sink["segments"]:
                    if g["session_id"] is None:
                        continue
                    s = ledger.get(g["session_id"])
                    run_id = run_for(None, g["session_id"], s["job_id"] if s else None)
                    if run_id is None:
                        continue
                    if g["filename"] not in source.names:
                        self.warn(manifest, "segments", f"segment {g['filename']} of session {g['session_id']!r} "
                                                        "does not exist (storage is copy)", "missing_attachment_file")
                    rows.append(partial(mk, run_id, g["filename"], "telemetry_sink_segment", prefix + g["filename"], s,
                                      "sink_segment", {"event_count": g["event_count"], "size_bytes": g["size_bytes"],
                                                       "closed": g["closed"]}, manifest, session_id=g["session_id"]))
                if ROLLUP_FILE in source.names:
                    for s in sink["sessions"]:
                        run_id = run_for(None, s["session_id"], s["job_id"])
                        if run_id is not None:
                            counts = {"manifest_session_count": len(sink["sessions"]),
                                      "manifest_segment_count": len(sink["segments"])}
                            rows.append(partial(mk, run_id, "Telemetry rollups", "telemetry_rollup",
                                                prefix + ROLLUP_FILE, s, "rollup", counts, manifest))
            elif source.kind == "diagnose_bundle":
                s = source.fact["diagnose"]["summary"]
                if s is None:
                    continue
                run_id = run_for(None, s["session_id"], s["job_id"])
                if run_id is not None:
                    meta = {"manifest_path": source.manifest, "session_status": s["status"]}
                    rows.append(partial(mk, run_id, "Diagnose bundle", "diagnose_bundle", source.path, s,
                                        "diagnose_bundle", meta, manifest))
            else:
                for s in members:
                    if s["source_path"] != source.path:
                        s = next((r for r in s.get("also", ()) if r["source_path"] == source.path), None)
                        if s is None:
                            continue
                    run_id = run_for(None, s["session_id"], s["job_id"])
                    if run_id is not None:
                        title = os.path.basename(source.path) or "Telemetry file"
                        rows.append(partial(mk, run_id, title, "telemetry_file", source.path, s, source.kind,
                                            {"event_count": s["event_count"]}, source.path))
        for folder, manifest, oom in self.found.oom_bundles:
            sid = oom["session_id"]
            if sid is None:  # Stormlog lists it under `query ooms` only, without a word
                self.warn(manifest, "session_id", "the OOM bundle names no session: it is listed by `query ooms` "
                                                  "but is an attachment of no run", "unattached_bundle")
                continue
            s = self.by_id.get(sid)
            run_id = run_for(None, sid, s["job_id"] if s else None)
            if run_id is None:
                continue
            seen = _iso_ns(oom["created_at_utc"])
            rows.append(partial(mk, run_id, "OOM bundle", "oom_bundle", folder, s, "oom_bundle",
                              {"bundle_path": folder, "manifest_path": manifest, **oom}, manifest, session_id=sid,
                              start_ns=seen, end_ns=seen, use_times=False))
        declared = {(r.run_id, r.path) for r in rows
                    if isinstance(r, AttachmentRow) and r.source_kind == "run_envelope_attachment"}
        for c in self.contexts.values():
            for s in c.sessions:
                for aid, kind, path, title in s.get("artifacts", ()):
                    if (c.run_id, path) in declared:
                        continue  # the envelope lists it, in its own words
                    rows.append(partial(mk, c.run_id, title, kind, path, s, "traceml_session", {}, s["source_path"],
                                      namespace="traceml", attachment_id=aid))
        return rows

    def _inside_roots(self, path: str) -> bool:
        return any(inside(path, root) for root in self.found.roots)

    def _check_declared(self, source: str, prefix: str, item: dict[str, Any], local: str | None,
                        storage: str) -> None:
        rel = item.get("path")
        if rel and URL_RE.match(rel):
            self.warn(source, f"{prefix}.path", f"{rel!r} looks like a URL; put it in url (recorded, never "
                                                "fetched): as a path it is read as a local file", "path_is_url")
        if local is None:
            return
        if not self._inside_roots(local):
            self.warn(source, f"{prefix}.path", f"{local} lies outside the paths searched; listed, but the viewer "
                                                "will not open it", "attachment_outside_root")
        elif storage == "copy" and not os.path.exists(local):
            self.warn(source, f"{prefix}.path", f"{local} does not exist (storage is copy)", "missing_attachment_file")

    def sidecar_warnings(self) -> None:
        for path, fact in self.found.sidecars:
            if fact.get("error"):
                self.warn(path, None, f"{fact['error']}; sidecar ignored", "unreadable")
                continue
            for fld, message in fact["problems"]:
                tail = "" if fact["read"] else "; sidecar not read"
                self.warn(path, fld or None, f"{_v1(message)}{tail}", "invalid_sidecar")
            for _i, fld, message, kept in fact["item_problems"]:
                tail = "; kept, as Stormlog reads it anyway" if kept else "; attachment rejected"
                self.warn(path, fld, f"{_v1(message)}{tail}", "invalid_sidecar_item")

    # -- rows -----------------------------------------------------------------------------------

    def catalog(self) -> Catalog:
        runs_of: dict[str, list[str]] = defaultdict(list)
        for c in sorted(self.contexts.values(), key=lambda c: not c.explicit):
            for s in c.sessions:
                if c.run_id not in runs_of[s["session_id"]]:
                    runs_of[s["session_id"]].append(c.run_id)
        out = Catalog(warnings=self.warnings,
                      sources=[s for s in self.found.sources if s.path not in self.bundle_timelines])
        out.sessions = [_session_row(s, runs_of.get(s["session_id"], [])) for s in self.sessions]
        out.oom_bundles = [{"bundle_path": f, "manifest_path": m, **o} for f, m, o in self.found.oom_bundles]
        for path, fact in self.found.sidecars:
            folder = os.path.dirname(path)
            for _i, item in fact["items"]:
                out.sidecar_items.append({**item, "path": _resolve(item["path"], folder) if item["path"] else None,
                                          "sidecar_path": path})
        self.sidecar_warnings()
        attachments = self.attachments()
        counts: dict[str, int] = defaultdict(int)
        for a in attachments:
            counts[(a.run_id if isinstance(a, AttachmentRow) else a.args[0]) or ""] += 1
        out.runs = [_run_row(c, counts.get(c.run_id, 0)) for c in self.contexts.values()]
        out.runs.sort(key=lambda r: (r.started_at_ns if r.started_at_ns is not None else -1, r.run_id), reverse=True)
        out.pending = attachments
        return out


def _status(sessions: Iterable[dict[str, Any]]) -> str | None:
    statuses = {s["status"] for s in sessions if s["status"] is not None}
    for status in ("running", "interrupted", "incomplete", "completed"):
        if status in statuses:
            return status
    return None


def _run_row(c: _Ctx, attachment_count: int) -> RunRow:
    return RunRow(
        run_id=c.run_id, explicit=c.explicit, title=c.title, description=c.description, job_id=c.job_id,
        started_at_ns=c.started_at_ns, ended_at_ns=c.ended_at_ns, source_path=c.source_path,
        source_kind=c.source_kind, source_namespace=c.source_namespace, source_ref=c.source_ref,
        session_count=len(c.sessions), attachment_count=attachment_count,
        sessions=tuple(s["session_id"] for s in c.sessions),
        ranks=tuple(sorted({s["rank"] for s in c.sessions if s["rank"] is not None})), tags=c.tags,
        metadata=c.metadata, status=_status(c.sessions),
    )


def _session_row(s: dict[str, Any], runs: list[str]) -> SessionRow:
    return SessionRow(
        session_id=s["session_id"], status=s["status"], started_at_ns=s["started_at_ns"],
        ended_at_ns=s["ended_at_ns"], host=s["host"], pid=s["pid"], job_id=s["job_id"], rank=s["rank"],
        local_rank=s["local_rank"], world_size=s["world_size"], source=s["source"], source_path=s["source_path"],
        source_kind=s["source_kind"], source_count=s["source_count"], warning_count=s["warning_count"],
        event_count=s["event_count"], oom_bundle_count=s["oom_bundle_count"], run_id=runs[0] if runs else "",
        run_ids=tuple(runs), role=s.get("role"), metadata=dict(s.get("metadata") or {}),
    )


def build(found: Found) -> Catalog:
    """Turn discovered facts into runs, sessions and attachments by the rules of this module.

    Never raises for bad input: every rejection, unresolved attachment and ambiguity is a
    :class:`~traceml_ai.catalog.model.CatalogWarning` in the result.
    """
    b = _Builder(found)
    b.collect_sessions()
    b.explicit_runs()
    b.implicit_runs()
    return b.catalog()


def _v1(message: str) -> str:
    """An envelope or sidecar problem with its source said once: ``(v1 schema)`` unless the message
    names it (or names Stormlog's reader, for a check beyond the schema)."""
    return message if "v1 schema" in message or "Stormlog's reader" in message else f"{message} (v1 schema)"
