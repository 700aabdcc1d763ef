"""Correlation: the evidence around one moment or one telemetry record, with real Stormlog 0.4.3's
semantics (004 seed, "Query API"; docs/catalog.md, "Correlation").

The anchor is a time (``at_ns``, Unix epoch ns) or a telemetry record (``record_id``, the
``telemetry-`` + 32 hex digits id Stormlog gives each event: SHA-256 of its canonical JSON). The
candidates are every telemetry event, every alert event, the timeline markers of each session
(lifecycle, collector, alert and OOM events), each OOM bundle, each diagnose bundle, each window of
a sink's fresh ``rollups.json`` and each sidecar attachment. A candidate is kept when it overlaps
``at_ns ± window_ns`` (or has no time but shares the anchor's session, or its job with
``scope="distributed"``) and names no other session or job; its confidence is ``high`` (same
session or job, same rank or rank-agnostic), ``medium`` (another rank) or ``low`` (time only).
Clocks are taken as written: cross-host clocks are not rewritten.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from traceml_ai.catalog.analysis import is_alert, severity, utc_ns

DEFAULT_WINDOW_NS: Final = 60_000_000_000
"""Stormlog's default correlation window: 60 s either side of the anchor."""
EVIDENCE_KINDS: Final = ("telemetry_event", "timeline_marker", "alert", "oom_bundle", "diagnose_bundle",
                         "rollup_window", "attachment")
SCOPES: Final = ("session", "distributed")
_CLOCK: Final = {"clock_domain": "unix_epoch_ns", "clock_normalization": "producer_emitted_epoch_ns",
                 "clock_note": "correlation does not rewrite cross-host clocks"}
_POINT_MARKERS: Final = {
    "start": ("lifecycle", "info", "Tracking started"), "stop": ("lifecycle", "info", "Tracking stopped"),
    "collector_degraded": ("collector", "warning", "Collector degraded"),
    "collector_recovered": ("collector", "info", "Collector recovered"),
    "warning": ("alert", "warning", "Warning"), "critical": ("alert", "critical", "Critical alert"),
    "error": ("alert", "critical", "Error")}


@dataclass(frozen=True)
class CorrelationFilter:
    """Stormlog's correlation filter: the anchor (``at_ns`` or ``record_id``), the identity to
    keep (``session_id``, ``job_id``, ``rank``: evidence naming another one is left out; evidence
    without a rank is rank-agnostic), ``scope`` (``session``, or ``distributed`` to let the job
    match), ``window_ns`` (≥ 0) either side of the anchor, ``kinds`` (:data:`EVIDENCE_KINDS`; empty:
    all) and ``limit``.

    Raises:
        ValueError: a scope that is not one of :data:`SCOPES`, a negative window or limit.
    """

    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    scope: str = "session"
    at_ns: int | None = None
    record_id: str | None = None
    window_ns: int = DEFAULT_WINDOW_NS
    kinds: tuple[str, ...] = ()
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError("scope must be 'session' or 'distributed'")
        if self.window_ns < 0:
            raise ValueError("window_ns must be >= 0")
        if self.limit is not None and self.limit < 0:
            raise ValueError("limit must be >= 0")


@dataclass(frozen=True, slots=True)
class CorrelationEvidence:
    """One piece of evidence (Stormlog's ``CorrelationEvidence``): ``evidence_id`` (stable), ``kind``
    (:data:`EVIDENCE_KINDS`), ``title``, identity, ``start_ns``/``end_ns`` (Unix epoch ns or None),
    ``source_path``, ``source_kind``, ``metadata`` (the underlying row), ``confidence`` (``high``,
    ``medium``, ``low``) and the ``reasons`` for it."""

    evidence_id: str
    kind: str
    title: str
    session_id: str | None
    job_id: str | None
    rank: int | None
    world_size: int | None
    start_ns: int | None
    end_ns: int | None
    source_path: str
    source_kind: str
    metadata: dict[str, Any] = field(default_factory=dict)
    confidence: str = "low"
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields above (``reasons`` a list)."""
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d

    as_dict = to_dict


@dataclass(frozen=True, slots=True)
class CorrelationResult:
    """``anchor`` (the resolved anchor: time, record, identity, scope, window, clock notes),
    ``evidence`` (best first: confidence, then distance to the anchor, kind, title) and
    ``warnings`` (the catalog's warnings, as TraceML words them)."""

    anchor: dict[str, Any]
    evidence: list[CorrelationEvidence]
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        """``{"anchor", "evidence": [...], "warnings"}`` (Stormlog's ``CorrelationResult.as_dict``)."""
        return {"anchor": dict(self.anchor), "evidence": [e.to_dict() for e in self.evidence],
                "warnings": list(self.warnings)}

    as_dict = to_dict


def record_id(event: Mapping[str, Any]) -> str:
    """Stormlog's record id of a canonical event: ``telemetry-`` + the first 32 hex digits of the
    SHA-256 of its JSON (keys sorted; values that are not JSON as their text)."""
    canonical = json.loads(json.dumps(event, sort_keys=True, default=str))
    return "telemetry-" + hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:32]


def evidence_id(*parts: object) -> str:
    """``evidence-`` + 24 hex digits of SHA-256 over the parts as text (Stormlog's)."""
    payload = json.dumps([str(p) for p in parts], sort_keys=True)
    return "evidence-" + hashlib.sha256(payload.encode()).hexdigest()[:24]


def anchor_for(f: CorrelationFilter, rows: Sequence[Any]) -> dict[str, Any]:
    """The anchor: ``f.at_ns`` with ``f``'s identity, or the event whose record id is ``f.record_id``
    (its time, identity and source). ``rows``: the event rows (``EventRow``).

    Raises:
        ValueError: neither given; the record is not found; its time differs from ``at_ns``.
    """
    if f.record_id is None and f.at_ns is None:
        raise ValueError("correlation requires --at-ns or --record-id")
    if f.record_id is not None:
        for row in rows:
            e = row.event
            if record_id(e) != f.record_id:
                continue
            if f.at_ns is not None and f.at_ns != e["timestamp_ns"]:
                raise ValueError("record_id timestamp does not match at_ns")
            return {"at_ns": e["timestamp_ns"], "record_id": f.record_id, "session_id": e["session_id"],
                    "job_id": e["job_id"], "rank": e["rank"], "world_size": e["world_size"],
                    "source_path": row.source_path, "source_kind": row.source_kind, "event_type": e["event_type"],
                    "scope": f.scope, "window_ns": f.window_ns, **_CLOCK}
        raise ValueError(f"record_id not found: {f.record_id}")
    return {"at_ns": f.at_ns, "record_id": None, "session_id": f.session_id, "job_id": f.job_id, "rank": f.rank,
            "world_size": None, "source_path": None, "source_kind": None, "event_type": None, "scope": f.scope,
            "window_ns": f.window_ns, **_CLOCK}


# -- candidates ---------------------------------------------------------------------------------

def event_evidence(rows: Sequence[Any]) -> list[CorrelationEvidence]:
    """A ``telemetry_event`` for each event row, then an ``alert`` for each alert."""
    out = []
    for row in rows:
        e = row.event
        rid = record_id(e)
        out.append(CorrelationEvidence(
            f"event:{rid}", "telemetry_event", f"{e['event_type']} telemetry event", e["session_id"], e["job_id"],
            e["rank"], e["world_size"], e["timestamp_ns"], None, row.source_path, row.source_kind,
            {"record_id": rid, "observed_timestamp_ns": e["timestamp_ns"], "event_type": e["event_type"],
             "collector": e["collector"], "context": e["context"], "session_status": row.session_status,
             "metadata": e["metadata"]}))
    for row in rows:
        e = row.event
        if is_alert(e):
            out.append(CorrelationEvidence(
                evidence_id("alert", e["session_id"], e["timestamp_ns"], e["rank"], e["event_type"]), "alert",
                f"Alert: {e['event_type']}", e["session_id"], e["job_id"], e["rank"], e["world_size"],
                e["timestamp_ns"], None, row.source_path, row.source_kind,
                {"event_type": e["event_type"], "severity": severity(e), "collector": e["collector"],
                 "context": e["context"], "metadata": e["metadata"]}))
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _boundary(e: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``phase_enter``/``phase_exit`` event's ``metadata.phase_scope``, checked as Stormlog
    checks it (else None: not a boundary)."""
    scope = e["metadata"].get("phase_scope") if isinstance(e.get("metadata"), Mapping) else None
    if not isinstance(scope, Mapping):
        return None
    name, path = scope.get("name"), scope.get("path")
    if (not isinstance(scope.get("action"), str) or not isinstance(name, str) or not name.strip()
            or not isinstance(scope.get("scope_id"), str) or not isinstance(scope.get("thread_name"), str)
            or not isinstance(path, list)
            or scope["action"] != ("enter" if e["event_type"] == "phase_enter" else "exit")):
        return None
    parts = tuple(str(p) for p in path if isinstance(p, str) and p)
    parent = scope.get("parent_scope_id")
    if not parts or not isinstance(scope.get("sequence"), int) or not isinstance(scope.get("thread_id"), int) \
            or (parent is not None and not isinstance(parent, str)):
        return None
    return {"action": scope["action"], "path": parts, "scope_id": scope["scope_id"], "thread_id": scope["thread_id"],
            "thread_name": scope["thread_name"], "sequence": scope["sequence"], "timestamp_ns": e["timestamp_ns"]}


def phase_spans(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Phase spans replayed from boundary events (Stormlog's ``PhaseReplayIndex``): per session,
    rank and thread, an exit closes the innermost open scope when it is that scope; scopes still
    open end at the group's last event (``synthetic_end``)."""
    ends: dict[tuple[str, int], int] = {}
    bounds = []
    for e in events:
        sid, ts, rank = e.get("session_id"), e.get("timestamp_ns"), e.get("rank", 0)
        if not isinstance(sid, str) or not isinstance(ts, int) or not isinstance(rank, int) or isinstance(rank, bool):
            continue
        ends[(sid, rank)] = max(ends.get((sid, rank), ts), ts)
        if e.get("event_type") in ("phase_enter", "phase_exit") and (b := _boundary(e)) is not None:
            bounds.append((sid, rank, b))
    bounds.sort(key=lambda x: (x[0], x[1], x[2]["timestamp_ns"], x[2]["sequence"], x[2]["scope_id"]))
    stacks: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for sid, rank, b in bounds:
        key = (sid, rank, b["thread_id"])
        stack = stacks.setdefault(key, [])
        if b["action"] == "enter":
            stack.append(b)
            continue
        if not stack or stack[-1]["scope_id"] != b["scope_id"]:
            continue
        opened = stack.pop()
        if not stack:
            stacks.pop(key, None)
        groups.setdefault((sid, rank), []).append({
            "session_id": sid, "rank": rank, "thread_id": b["thread_id"], "thread_name": b["thread_name"],
            "scope_id": b["scope_id"], "path": opened["path"], "start_ns": opened["timestamp_ns"],
            "end_ns": b["timestamp_ns"], "sequence": opened["sequence"], "synthetic_end": False})
    for (sid, rank, _thread), stack in stacks.items():
        end = ends.get((sid, rank))
        if end is not None:
            groups.setdefault((sid, rank), []).extend({
                "session_id": sid, "rank": rank, "thread_id": b["thread_id"], "thread_name": b["thread_name"],
                "scope_id": b["scope_id"], "path": b["path"], "start_ns": b["timestamp_ns"], "end_ns": end,
                "sequence": b["sequence"], "synthetic_end": True} for b in stack)
    return [span for spans in groups.values() for span in sorted(spans, key=lambda x: (x["start_ns"], x["end_ns"]))]


def markers(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The timeline markers of one session's events (Stormlog's ``TimelineMarker`` dicts): a point
    marker per lifecycle, collector, alert and OOM event, a span per replayed phase; by start,
    end, rank, kind, label."""
    out = []
    for e in events:
        et = e.get("event_type")
        if not isinstance(et, str) or et.strip() not in _POINT_MARKERS:
            continue
        et = et.strip()
        if not isinstance(e.get("session_id"), str) or _int(e.get("timestamp_ns")) is None:
            continue
        meta = dict(e["metadata"]) if isinstance(e.get("metadata"), Mapping) else {}
        kind, sev, label = _POINT_MARKERS[et]
        if et == "error" and any(k in meta for k in ("oom_reason", "oom_dump_path")):
            kind = "oom"
            reason = meta.get("oom_reason")
            label = f"OOM detected: {reason.strip()}" if isinstance(reason, str) and reason.strip() else "OOM detected"
        ctx = e.get("context")
        out.append({"session_id": e["session_id"], "start_ns": e["timestamp_ns"], "end_ns": None, "kind": kind,
                    "source": "telemetry_event", "severity": sev,
                    "label": ctx.strip() if isinstance(ctx, str) and ctx.strip() else label,
                    "rank": _int(e.get("rank")), "local_rank": _int(e.get("local_rank")),
                    "world_size": _int(e.get("world_size")), "event_type": et, "metadata": meta})
    identity: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for e in events:
        if isinstance(e.get("session_id"), str) and _int(e.get("rank")) is not None:
            identity.setdefault((e["session_id"], e["rank"]), (_int(e.get("local_rank")), _int(e.get("world_size"))))
    for span in phase_spans(events):
        local, world = identity.get((span["session_id"], span["rank"]), (None, None))
        out.append({"session_id": span["session_id"], "start_ns": span["start_ns"], "end_ns": span["end_ns"],
                    "kind": "phase", "source": "phase_replay", "severity": "info",
                    "label": "Phase: " + " / ".join(p for p in span["path"] if p), "rank": span["rank"],
                    "local_rank": local, "world_size": world, "event_type": "phase",
                    "metadata": {"phase_path": list(span["path"]), "scope_id": span["scope_id"],
                                 "thread_id": span["thread_id"], "thread_name": span["thread_name"],
                                 "sequence": span["sequence"], "synthetic_end": span["synthetic_end"]}})
    out.sort(key=lambda m: (m["start_ns"], m["end_ns"] if m["end_ns"] is not None else m["start_ns"],
                            m["rank"] if m["rank"] is not None else -1, m["kind"], m["label"]))
    return out


def marker_evidence(loaded: Sequence[tuple[Any, Any]]) -> list[CorrelationEvidence]:
    """``timeline_marker`` evidence; ``loaded``: ``(source, LoadedSession)`` pairs."""
    out = []
    for source, session in loaded:
        path = session.sources_loaded[0] if session.sources_loaded else source.path
        for m in markers(session.events):
            out.append(CorrelationEvidence(
                evidence_id("marker", m["session_id"], m["kind"], m["start_ns"], m["rank"], m["label"]),
                "timeline_marker", m["label"], m["session_id"], session.summary["job_id"], m["rank"], m["world_size"],
                m["start_ns"], m["end_ns"], path, source.kind, m))
    return out


def oom_evidence(rows: Sequence[Any], sessions: Mapping[str, Any]) -> list[CorrelationEvidence]:
    """``oom_bundle`` evidence, at the bundle's creation time; identity from its session's row."""
    out = []
    for row in rows:
        s = sessions.get(row.session_id) if row.session_id is not None else None
        seen = utc_ns(row.created_at_utc)
        meta = row.to_dict()
        meta.pop("manifest_path", None)
        out.append(CorrelationEvidence(
            evidence_id("oom", row.bundle_path, row.session_id), "oom_bundle", "OOM bundle", row.session_id,
            s.job_id if s else None, s.rank if s else None, s.world_size if s else None, seen, seen,
            row.bundle_path, "oom_bundle", meta))
    return out


def diagnose_evidence(bundles: Sequence[tuple[str, str | None, Mapping[str, Any]]]) -> list[CorrelationEvidence]:
    """``diagnose_bundle`` evidence over the bundle session's lifetime; ``bundles``: ``(folder,
    manifest path, session summary)``."""
    return [CorrelationEvidence(
        evidence_id("diagnose", str(manifest), s["session_id"]), "diagnose_bundle", "Diagnose bundle",
        s["session_id"], s["job_id"], s["rank"], s["world_size"], s["started_at_ns"], s["ended_at_ns"], folder,
        "diagnose_bundle", {"manifest_path": manifest, "session_status": s["status"]})
        for folder, manifest, s in bundles]


def rollup_evidence(sink: str, rollup: Mapping[str, Any]) -> list[CorrelationEvidence]:
    """``rollup_window`` evidence of one sink's fresh rollups (see ``events.read_rollups``)."""
    out = []
    for s in rollup["sessions"]:
        who = s["session"]
        for w in s["windows"]:
            out.append(CorrelationEvidence(
                evidence_id("rollup", who["session_id"], w["index"], w["start_ns"]), "rollup_window",
                f"Rollup window {w['index']}", who["session_id"], who.get("job_id"), None, who.get("world_size"),
                w["start_ns"], w["end_ns"], sink, "rollup",
                {"event_count": w["event_count"], "sample_count": w["sample_count"], "rank_count": w["rank_count"],
                 "alert_count": w["alert_count"], "collector_transition_count": w["collector_transition_count"],
                 "oom_count": w["oom_count"], "window_duration_ns": rollup["window_duration_ns"]}))
    return out


def attachment_evidence(items: Sequence[Any]) -> list[CorrelationEvidence]:
    """``attachment`` evidence of sidecar items (``ExternalAttachment``): over ``start_ns``–``end_ns``,
    else at ``created_at_utc``; source the URL, else the path, else the sidecar."""
    out = []
    for a in items:
        start = a.start_ns if a.start_ns is not None else utc_ns(a.created_at_utc)
        end = a.end_ns if a.end_ns is not None else start
        out.append(CorrelationEvidence(
            evidence_id("attachment", a.attachment_id, a.sidecar_path, a.title, a.url, a.path), "attachment",
            a.title, a.session_id, a.job_id, a.rank, None, start, end, a.url or a.path or a.sidecar_path,
            "attachment", a.to_dict()))
    return out


# -- matching -----------------------------------------------------------------------------------

def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _differ(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a != b


def match(ev: CorrelationEvidence, anchor: Mapping[str, Any], f: CorrelationFilter) -> CorrelationEvidence | None:
    """``ev`` with its confidence and reasons when it belongs with the anchor, else None."""
    if f.kinds and ev.kind not in f.kinds:
        return None
    if ((f.session_id is not None and ev.session_id != f.session_id)
            or (f.job_id is not None and ev.job_id != f.job_id)
            or (f.rank is not None and ev.rank is not None and ev.rank != f.rank)):
        return None
    at = anchor.get("at_ns")
    if at is None:
        return None
    has_time = ev.start_ns is not None or ev.end_ns is not None
    in_window = False
    if has_time:
        start = ev.start_ns if ev.start_ns is not None else ev.end_ns
        end = ev.end_ns if ev.end_ns is not None else ev.start_ns
        in_window = start is not None and end is not None and start <= at + f.window_ns and end >= at - f.window_ns
    a_session, a_job = _text(anchor.get("session_id")), _text(anchor.get("job_id"))
    identity = None
    if a_session is not None and ev.session_id is not None and ev.session_id == a_session:
        identity = "session"
    elif f.scope == "distributed" and a_job is not None and ev.job_id is not None and ev.job_id == a_job:
        identity = "job"
    if (has_time and not in_window) or (identity is None and not in_window):
        return None
    same_job = a_job is not None and ev.job_id is not None and ev.job_id == a_job
    if _differ(a_session, ev.session_id) and not (f.scope == "distributed" and same_job):
        return None
    if _differ(a_job, ev.job_id) and ev.session_id != a_session:
        return None
    reasons = ["overlaps_anchor_window"] if in_window else [] if has_time else ["identifier_only_no_time"]
    a_rank = anchor.get("rank")
    a_rank = a_rank if isinstance(a_rank, int) and not isinstance(a_rank, bool) else None
    same_rank = a_rank is None or ev.rank is None or ev.rank == a_rank
    if identity is not None:
        reasons.append("same_session" if identity == "session" else "same_job_distributed")
        if same_rank:
            reasons.append("same_rank_or_rank_agnostic")
            confidence = "high"
        else:
            reasons.append("cross_rank_same_session" if identity == "session" else "cross_rank_same_job")
            confidence = "medium"
    else:
        reasons.append("time_only_missing_shared_identifier")
        confidence = "low"
    return replace(ev, confidence=confidence, reasons=tuple(reasons))


def ranked(evidence: Sequence[CorrelationEvidence], anchor: Mapping[str, Any],
           f: CorrelationFilter) -> list[CorrelationEvidence]:
    """The matching evidence, best first (confidence, distance to the anchor, kind, title), cut at ``f.limit``."""
    kept = [m for ev in evidence if (m := match(ev, anchor, f)) is not None]
    at = anchor.get("at_ns")

    def distance(ev: CorrelationEvidence) -> int:
        bounds = [v for v in (ev.start_ns, ev.end_ns) if v is not None]
        if at is None or not bounds:
            return 0
        lo, hi = min(bounds), max(bounds)
        return 0 if lo <= at <= hi else min(abs(lo - at), abs(hi - at))

    kept.sort(key=lambda ev: ({"high": 0, "medium": 1, "low": 2}.get(ev.confidence, 9), distance(ev), ev.kind,
                              ev.title))
    return kept if f.limit is None else kept[: f.limit]
