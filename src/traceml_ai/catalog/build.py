"""Runs from discovered facts: explicit, implicit, and their attachments (004 seed, "Discovery
Rules" and "Attachments"; DESIGN §5). Pure: reads no file beyond an ``exists`` check for ``copy``
attachments.

Rules, in order:

1. Sessions: one record per session found. Bundles (diagnose, OOM) join the session of the same
   ``session_id`` as attachments; telemetry JSONL files of one session with the same identity are
   one session (rotated files). Any other two sources naming one ``session_id`` stay two sessions
   and are reported (``duplicate_session``).
2. Envelopes: a schema-invalid envelope is rejected (one warning per problem, naming the field).
   Every ``run_id`` must be unique: envelopes sharing one are all rejected (``duplicate_run_id``),
   their sessions fall back to implicit runs and their attachments are not indexed.
3. Explicit runs: each accepted envelope is a run of the sessions it names. A named session that was
   not found on disk is still listed (``on_disk`` False) and reported (``session_not_found``); a
   session named by two envelopes is listed in both runs and reported (``session_claimed_twice``).
   The run's attachments: the envelope's (relative paths against its folder; URLs recorded, never
   fetched; ``storage`` as given), then the local artifacts of its sessions as ``copy``. A local
   path outside every root (``../``, absolute) is reported (``attachment_outside_root``), as is a
   ``copy`` whose file does not exist (``missing_attachment_file``; also for a sink ledger's
   segments and rollups) and a ``path`` that looks like a URL (``path_is_url``).
4. Implicit runs for sessions no accepted envelope covers: sessions sharing a non-null ``job_id`` are
   one run ``job:<job_id>`` (two of them with the same rank are reported: ``ambiguous_rank``); a
   session without ``job_id`` is its own run ``session:<session_id>``. A sink folder holding several
   sessions never merges them by itself.
5. Sidecar items go to the run named by their ``run_id`` (or the sidecar's), else the run(s) holding
   their ``session_id``, else the one run of their ``job_id``, else the run of the nearest envelope
   or TraceML session folder at or above the sidecar. An item that resolves to no run is listed
   with ``run_id`` None and reported (``unresolved_attachment``). An item whose ``attachment_id``
   its run already has (from the envelope or an earlier sidecar item) is reported and not indexed
   (``duplicate_attachment_id``).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from traceml_ai.catalog.discovery import Found
from traceml_ai.catalog.model import AttachmentRow, CatalogWarning, RunRow, SessionRow
from traceml_ai.catalog.schema import field_name
from traceml_ai.runs.discovery import inside

IDENTITY = ("job_id", "rank", "local_rank", "world_size")


_Local = tuple[str, dict[str, Any], list[Any]]
"""A local artifact not yet made a row: (run_id, session record, [attachment_id, kind, path, title,
source_path]); source_path is the file that named it (a bundle's ``bundle.json``, not the ledger of
the session it joined)."""

URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A ``path`` that starts like this is a URL written in the wrong field."""


def _local_row(local: _Local) -> AttachmentRow:
    run_id, rec, (attachment_id, kind, path, title, source) = local
    return AttachmentRow(run_id=run_id, attachment_id=attachment_id, title=title, kind=kind, storage="copy",
                         path=path, url=None, session_id=rec["session_id"], job_id=rec["job_id"], rank=rec["rank"],
                         source_path=source)


@dataclass
class Catalog:
    """Everything the store answers from (rows in discovery order). The rows of local artifacts
    (three or more per session) are made on first use of :attr:`attachments`: listing runs alone
    does not pay for them."""

    runs: list[RunRow] = field(default_factory=list)
    sessions: list[SessionRow] = field(default_factory=list)
    warnings: list[CatalogWarning] = field(default_factory=list)
    pending: list[AttachmentRow | _Local] = field(default_factory=list)
    _attachments: list[AttachmentRow] | None = None

    @property
    def attachments(self) -> list[AttachmentRow]:
        if self._attachments is None:
            self._attachments = [a if isinstance(a, AttachmentRow) else _local_row(a) for a in self.pending]
            self.pending = []
        return self._attachments


@dataclass
class _Run:
    run_id: str
    explicit: bool
    source_path: str
    doc: dict[str, Any] = field(default_factory=dict)
    sessions: list[SessionRow] = field(default_factory=list)
    attachments: list[AttachmentRow | _Local] = field(default_factory=list)


class _Builder:
    def __init__(self, found: Found) -> None:
        self.found = found
        self.warnings: list[CatalogWarning] = list(found.warnings)
        self.records: list[dict[str, Any]] = []
        self.by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.runs: dict[str, _Run] = {}
        self.runs_of_session: dict[str, list[str]] = defaultdict(list)
        self.orphans: list[AttachmentRow] = []

    def warn(self, path: str, fld: str | None, message: str, code: str) -> None:
        self.warnings.append(CatalogWarning(path=path, field=fld or None, message=message, code=code))

    # -- 1. sessions ---------------------------------------------------------------------------

    def collect_sessions(self) -> None:
        secondary: list[dict[str, Any]] = []
        for path, fact in self.found.sessions:
            if fact.get("error"):
                self.warn(path, None, fact["error"], "unreadable")
            for fld, message in fact.get("problems", []):
                self.warn(path, fld, message, "invalid_session")
            for rec in fact["sessions"]:
                rec = {**rec, "artifacts": [[*a, path] for a in rec["artifacts"]]}
                if rec["kind"] == "sink_session":
                    self._check_ledger_paths(rec)
                (secondary if rec["secondary"] else self.records).append(rec)
        primaries = self.records
        self.records = []
        for rec in primaries:
            self._add_primary(rec)
        for rec in secondary:
            same = self.by_session.get(rec["session_id"])
            if same:
                same[0]["artifacts"].extend(rec["artifacts"])
            else:
                self._append(rec)

    def _check_ledger_paths(self, rec: dict[str, Any]) -> None:
        """A sink ledger names its segments and rollups; they are listed as ``copy``, so one that
        does not exist, or lies outside the roots (``../../x``, an absolute path), is reported."""
        for _id, kind, path, _title, source in rec["artifacts"]:
            if kind not in ("sink_segment", "rollup"):
                continue
            what = f"{kind.replace('_', ' ')} {path} of session {rec['session_id']!r}"
            if not self._inside_roots(path):
                self.warn(source, None, f"{what} lies outside the paths searched; listed, but not confined "
                                              "to them (the viewer will not open it)", "attachment_outside_root")
            elif not os.path.exists(path):
                self.warn(source, None, f"{what} does not exist (storage is copy)", "missing_attachment_file")

    def _inside_roots(self, path: str) -> bool:
        """Whether absolute, normalised ``path`` lies under a root (by name: symlinks are resolved
        when the viewer opens it)."""
        return any(inside(path, root) for root in self.found.roots)

    def _append(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        self.by_session[rec["session_id"]].append(rec)

    def _add_primary(self, rec: dict[str, Any]) -> None:
        same = self.by_session.get(rec["session_id"])
        if not same:
            self._append(rec)
            return
        first = same[0]
        consistent = all(first[k] is None or rec[k] is None or first[k] == rec[k] for k in IDENTITY)
        if first["kind"] == rec["kind"] == "telemetry_jsonl" and consistent:
            first["artifacts"].extend(rec["artifacts"])
            starts = [t for t in (first["started_at_ns"], rec["started_at_ns"]) if t is not None]
            first["started_at_ns"] = min(starts) if starts else None
            if rec["ended_at_ns"] is not None and (first["ended_at_ns"] is None
                                                   or rec["ended_at_ns"] > first["ended_at_ns"]):
                first["ended_at_ns"], first["status"] = rec["ended_at_ns"], rec["status"]
            for k in IDENTITY:
                if first[k] is None:
                    first[k] = rec[k]
            return
        self.warn(rec["source_path"], "session_id",
                  f"session {rec['session_id']!r} was also found in {first['source_path']}; "
                  "both are listed as separate sessions", "duplicate_session")
        self._append(rec)

    # -- 2, 3. envelopes and explicit runs ------------------------------------------------------

    def explicit_runs(self) -> dict[str, str]:
        """Build the explicit runs; return envelope folder → run_id for sidecar resolution."""
        valid: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for path, fact in self.found.envelopes:
            if fact.get("error"):
                self.warn(path, None, f"{fact['error']}; envelope rejected", "unreadable")
                continue
            if fact["problems"]:
                for fld, message in fact["problems"]:
                    self.warn(path, fld or None, f"{message}; envelope rejected, its sessions fall back to "
                                                 "implicit runs", "invalid_envelope")
                continue
            valid[fact["doc"]["run_id"]].append((path, fact["doc"]))
        folders: dict[str, str] = {}
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
            path, doc = group[0]
            self._explicit(path, doc)
            folders[os.path.dirname(path)] = run_id
        return folders

    def _explicit(self, path: str, doc: dict[str, Any]) -> None:
        run = _Run(run_id=doc["run_id"], explicit=True, source_path=path, doc=doc)
        self.runs[run.run_id] = run
        for i, entry in enumerate(doc.get("sessions") or []):
            sid = entry["session_id"]
            for other in self.runs_of_session.get(sid, []):
                if other == run.run_id:
                    continue
                self.warn(path, f"sessions[{i}].session_id",
                          f"session {sid!r} is also claimed by run {other!r} ({self.runs[other].source_path}); "
                          "it is listed in both runs", "session_claimed_twice")
            if run.run_id in self.runs_of_session[sid]:
                continue  # named twice in one envelope: once is enough
            self.runs_of_session[sid].append(run.run_id)
            recs = self.by_session.get(sid)
            if not recs:
                self.warn(path, f"sessions[{i}].session_id",
                          f"session {sid!r} is named by the envelope but was not found on disk", "session_not_found")
                run.sessions.append(_row_from_entry(entry, run.run_id, path))
                continue
            for rec in recs:
                run.sessions.append(_row(rec, run.run_id, entry))
        folder = os.path.dirname(path)
        for i, item in enumerate(doc.get("attachments") or []):
            run.attachments.append(self._attachment(item, folder, run.run_id, path, f"attachments[{i}]"))

    def _attachment(self, item: dict[str, Any], folder: str, run_id: str | None, source: str,
                    prefix: str) -> AttachmentRow:
        rel = item.get("path")
        local = os.path.normpath(os.path.join(folder, os.path.expanduser(rel))) if rel else None
        storage = item["storage"]
        if rel and URL_RE.match(rel):
            self.warn(source, f"{prefix}.path", f"{json.dumps(rel)} looks like a URL; put it in url (recorded, "
                                                "never fetched): as a path it is read as a local file", "path_is_url")
        if local is not None and not self._inside_roots(local):
            self.warn(source, f"{prefix}.path", f"{local} lies outside the paths searched; listed, but the viewer "
                                                "will not open it", "attachment_outside_root")
        elif local is not None and storage == "copy" and not os.path.exists(local):
            self.warn(source, f"{prefix}.path", f"{local} does not exist (storage is copy)", "missing_attachment_file")
        return AttachmentRow(
            run_id=run_id, attachment_id=item["attachment_id"], title=item.get("title"), kind=item["kind"],
            storage=storage, path=local, url=item.get("url"), session_id=item.get("session_id"),
            job_id=item.get("job_id"), rank=item.get("rank"), source_namespace=item.get("source_namespace"),
            source_ref=item.get("source_ref"), metadata=dict(item.get("metadata") or {}), source_path=source,
        )

    # -- 4. implicit runs -----------------------------------------------------------------------

    def implicit_runs(self) -> None:
        groups: dict[str, list[dict[str, Any]]] = {}
        for rec in self.records:
            if rec["session_id"] in self.runs_of_session:
                continue
            base = f"job:{rec['job_id']}" if rec["job_id"] is not None else f"session:{rec['session_id']}"
            key, n = base, 1
            # a duplicate_session without job_id, or an envelope that already took the id: number it
            while key in self.runs or (rec["job_id"] is None and key in groups):
                n += 1
                key = f"{base}#{n}"
            groups.setdefault(key, []).append(rec)
        for run_id, recs in groups.items():
            first = recs[0]
            run = _Run(run_id=run_id, explicit=False, source_path=first["source_path"])
            run.doc = {"title": first["metadata"].get("run_folder"), "job_id": first["job_id"]}
            by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for rec in recs:
                run.sessions.append(_row(rec, run_id, None))
                self.runs_of_session[rec["session_id"]].append(run_id)
                if rec["rank"] is not None:
                    by_rank[rec["rank"]].append(rec)
            for rank, same in sorted(by_rank.items()):
                if len(same) > 1:
                    sids = ", ".join(repr(r["session_id"]) for r in same)
                    sources = ", ".join(dict.fromkeys(r["source_path"] for r in same))  # each file once
                    self.warn(same[0]["source_path"], "rank",
                              f"job {first['job_id']!r} has {len(same)} sessions with rank {rank} ({sids}; in "
                              f"{sources}); all are listed in run {run_id!r}", "ambiguous_rank")
            self.runs[run_id] = run

    def local_artifacts(self) -> None:
        for run in self.runs.values():
            declared = {a.path for a in run.attachments if isinstance(a, AttachmentRow) and a.path is not None}
            done: set[int] = set()
            for s in run.sessions:
                recs = self.by_session.get(s.session_id, [])
                if len(recs) > 1 and not run.explicit:
                    # One session id from several sources (a copied run folder): each implicit run
                    # lists the artifacts of its own source only, never the copy's.
                    recs = [r for r in recs if r["source_path"] == s.source_path] or recs
                for rec in recs:
                    if id(rec) in done:
                        continue
                    done.add(id(rec))
                    for artifact in rec["artifacts"]:
                        if artifact[2] not in declared:  # else the envelope lists it, in its own words
                            run.attachments.append((run.run_id, rec, artifact))

    # -- 5. sidecars ----------------------------------------------------------------------------

    def sidecars(self, envelope_folders: dict[str, str]) -> None:
        by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for rec in self.records:
            by_source[rec["source_path"]].append(rec)
        session_folders: dict[str, str] = {}
        for folder, manifest in self.found.session_dirs.items():
            for rec in by_source.get(manifest, []):
                runs = self.runs_of_session.get(rec["session_id"])
                if runs:
                    session_folders.setdefault(folder, runs[0])
        declared_ids: dict[str, dict[str, str]] = {}  # run → attachment_id → the file that declared it
        for path, fact in self.found.sidecars:
            if fact.get("error"):
                self.warn(path, None, f"{fact['error']}; sidecar ignored", "unreadable")
                continue
            for fld, message in fact["problems"]:
                self.warn(path, fld or None, f"{message}; sidecar rejected", "invalid_sidecar")
            for index, fld, message in fact["item_problems"]:
                self.warn(path, fld, f"{message}; attachment {index} rejected", "invalid_sidecar_item")
            if fact["doc"] is None:
                continue
            header = fact["doc"]
            folder = os.path.dirname(path)
            for index, item in fact["items"]:
                targets, why = self._targets(item, header, folder, envelope_folders, session_folders)
                prefix = field_name(["attachments", index])
                if not targets:
                    self.warn(path, prefix, f"attachment {item['attachment_id']!r} resolves to no run ({why}); "
                                            "listed with no run", "unresolved_attachment")
                    self.orphans.append(self._attachment(item, folder, None, path, prefix))
                for run_id in targets:
                    run = self.runs[run_id]
                    taken = declared_ids.setdefault(run_id, {
                        a.attachment_id: a.source_path for a in run.attachments if isinstance(a, AttachmentRow)})
                    aid = item["attachment_id"]
                    if aid in taken:
                        self.warn(path, f"{prefix}.attachment_id",
                                  f"{json.dumps(aid)} is already an attachment of run {run_id!r} (from {taken[aid]}); "
                                  "this one is not indexed", "duplicate_attachment_id")
                        continue
                    taken[aid] = path
                    run.attachments.append(self._attachment(item, folder, run_id, path, prefix))

    def _targets(self, item: dict[str, Any], header: dict[str, Any], folder: str,
                 envelope_folders: dict[str, str], session_folders: dict[str, str]) -> tuple[list[str], str]:
        run_id = item.get("run_id") or header.get("run_id")
        if run_id:
            return ([run_id], "") if run_id in self.runs else ([], f"no run {run_id!r} was found")
        session_id = item.get("session_id") or header.get("session_id")
        if session_id:
            runs = self.runs_of_session.get(session_id, [])
            return (list(runs), "") if runs else ([], f"no session {session_id!r} was found")
        job_id = item.get("job_id") or header.get("job_id")
        if job_id:
            of_job = [r for r in self.runs.values() if r.doc.get("job_id") == job_id]
            explicit = [r for r in of_job if r.explicit]
            chosen = of_job if len(of_job) == 1 else explicit if len(explicit) == 1 else []
            if chosen:
                return [chosen[0].run_id], ""
            return [], f"{len(of_job)} runs have job_id {job_id!r}" if of_job else f"no run has job_id {job_id!r}"
        roots = [r for r in self.found.roots if inside(folder, r)]
        current = folder
        while True:
            if current in envelope_folders:
                return [envelope_folders[current]], ""
            if current in session_folders:
                return [session_folders[current]], ""
            parent = os.path.dirname(current)
            if parent == current or not any(inside(parent, r) for r in roots):
                break
            current = parent
        return [], "it names no run_id, session_id or job_id, and no envelope or TraceML session is above it"

    # -- rows -----------------------------------------------------------------------------------

    def catalog(self) -> Catalog:
        out = Catalog(warnings=self.warnings)
        for run in self.runs.values():
            out.runs.append(_run_row(run))
            out.sessions.extend(run.sessions)
            out.pending.extend(run.attachments)
        out.pending.extend(self.orphans)
        return out


def _row(rec: dict[str, Any], run_id: str, entry: dict[str, Any] | None) -> SessionRow:
    entry = entry or {}

    def pick(key: str) -> Any:
        return rec[key] if rec.get(key) is not None else entry.get(key)

    return SessionRow(
        session_id=rec["session_id"], run_id=run_id, kind=rec["kind"], job_id=pick("job_id"), rank=pick("rank"),
        local_rank=pick("local_rank"), world_size=pick("world_size"),
        role=entry.get("role") if entry.get("role") is not None else rec.get("role"),
        status=rec.get("status"), started_at_ns=pick("started_at_ns"), ended_at_ns=pick("ended_at_ns"),
        on_disk=True, source_path=rec["source_path"], hostname=rec.get("hostname"),
        metadata=dict(entry.get("metadata") or rec.get("metadata") or {}),
    )


def _row_from_entry(entry: dict[str, Any], run_id: str, source: str) -> SessionRow:
    return SessionRow(
        session_id=entry["session_id"], run_id=run_id, kind="envelope_only", job_id=entry.get("job_id"),
        rank=entry.get("rank"), local_rank=entry.get("local_rank"), world_size=entry.get("world_size"),
        role=entry.get("role"), status=entry.get("status"), started_at_ns=entry.get("started_at_ns"),
        ended_at_ns=entry.get("ended_at_ns"), on_disk=False, source_path=source,
        metadata=dict(entry.get("metadata") or {}),
    )


def _status(sessions: list[SessionRow]) -> str | None:
    statuses = {s.status for s in sessions if s.status is not None}
    for status in ("running", "interrupted", "incomplete", "completed"):
        if status in statuses:
            return status
    return None


def _run_row(run: _Run) -> RunRow:
    doc = run.doc
    starts = [s.started_at_ns for s in run.sessions if s.started_at_ns is not None]
    ends = [s.ended_at_ns for s in run.sessions]
    started = doc.get("started_at_ns")
    ended = doc.get("ended_at_ns")
    if started is None and starts:
        started = min(starts)
    if ended is None and ends and all(e is not None for e in ends):
        ended = max(e for e in ends if e is not None)
    job_id = doc.get("job_id")
    if job_id is None:
        jobs = {s.job_id for s in run.sessions}
        job_id = jobs.pop() if len(jobs) == 1 else None
    session_ids = tuple(dict.fromkeys(s.session_id for s in run.sessions))
    return RunRow(
        run_id=run.run_id, explicit=run.explicit, title=doc.get("title"), description=doc.get("description"),
        job_id=job_id, started_at_ns=started, ended_at_ns=ended, status=_status(run.sessions),
        source_path=run.source_path, session_count=len(session_ids), attachment_count=len(run.attachments),
        sessions=session_ids, ranks=tuple(sorted({s.rank for s in run.sessions if s.rank is not None})),
        tags=tuple(doc.get("tags") or ()), source_namespace=doc.get("source_namespace"),
        source_ref=doc.get("source_ref"), metadata=dict(doc.get("metadata") or {}),
    )


def build(found: Found) -> Catalog:
    """Turn discovered facts into runs, sessions and attachments by the rules of this module.

    Never raises for bad input: every rejection, unresolved attachment and ambiguity is a
    :class:`~traceml_ai.catalog.model.CatalogWarning` in the result.
    """
    b = _Builder(found)
    b.collect_sessions()
    envelope_folders = b.explicit_runs()
    b.implicit_runs()
    b.local_artifacts()
    b.sidecars(envelope_folders)
    return b.catalog()
