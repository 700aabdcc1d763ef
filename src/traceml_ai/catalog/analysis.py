"""What the catalog derives from telemetry events, with real Stormlog 0.4.3's semantics (004 seed,
"Query API"; docs/catalog.md, "Events, OOM bundles, issues, summaries"): event filters, alert and
collector classification, the built-in summaries and grouped recurring issues with their stable
fingerprints (``issue:`` + 24 hex digits of a SHA-256 over the kind and normalised dimensions, the
same ids Stormlog gives, so state kept by id carries over).

Pure functions over event dicts (:class:`~traceml_ai.catalog.model.EventRow`); no file access.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Final

from traceml_ai.catalog.model import EventFilter, EventRow, OOMBundleRow, SummaryRow

SUMMARY_METRICS: Final = ("session_count_by_status", "peak_allocator_allocated_bytes",
                          "peak_allocator_reserved_bytes", "peak_device_used_bytes", "alert_count",
                          "collector_degradation_transitions", "interrupted_sessions_with_oom_bundles",
                          "hidden_memory_gap_growth")
"""The summaries ``summarize`` runs (Stormlog's ``SummaryMetric``)."""
SUMMARY_GROUPS: Final = ("session", "session-rank", "rank", "status")
ISSUE_KINDS: Final = ("oom", "collector_degradation", "alert", "hidden_memory_anomaly")
ISSUE_STATES: Final = ("open", "resolved", "ignored", "regressed")
ALERT_TYPES: Final = frozenset({"warning", "critical", "error"})
TRANSITION_TYPES: Final = frozenset({"collector_degraded", "collector_recovered"})
_SEVERITY_RANK: Final = {"critical": 0, "error": 0, "warning": 1, "info": 2}
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<!\w)\d+(?:\.\d+)?%?(?!\w)")
_SPACE = re.compile(r"\s+")


def utc(text: str | None) -> datetime | None:
    """An ISO-8601 time as an aware UTC datetime (no zone: UTC; ``Z`` accepted), or None when
    empty or not a time."""
    if not text:
        return None
    t = text.strip()
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        return None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def utc_ns(text: str | None) -> int | None:
    """:func:`utc` as Unix epoch ns (float seconds × 1e9, truncated, as Stormlog)."""
    when = utc(text)
    return None if when is None else int(when.timestamp() * 1_000_000_000)


def token(value: object, default: str = "unknown") -> str:
    """A low-cardinality text token: lower case, hex and numbers replaced by ``<hex>``/``<num>``,
    runs of whitespace made one space (Stormlog's ``normalize_text_dimension``)."""
    if value is None:
        return default
    text = str(value).strip().lower()
    if not text:
        return default
    return _SPACE.sub(" ", _NUMBER.sub("<num>", _HEX.sub("<hex>", text)))


def is_alert(event: Mapping[str, Any]) -> bool:
    """An alert: event type warning/critical/error, or such a ``metadata.severity``."""
    return event["event_type"] in ALERT_TYPES or token(event["metadata"].get("severity")) in ALERT_TYPES


def severity(event: Mapping[str, Any]) -> str:
    sev = event["metadata"].get("severity")
    if isinstance(sev, str) and sev.strip():
        return token(sev)
    if event["event_type"] in ("critical", "error"):
        return "critical"
    return "warning" if event["event_type"] == "warning" else "info"


def is_oom(event: Mapping[str, Any]) -> bool:
    return event["event_type"] == "error" and any(k in event["metadata"] for k in ("oom_reason", "oom_dump_path"))


def is_degradation(event: Mapping[str, Any]) -> bool:
    return (event["event_type"] == "collector_degraded"
            or token(event["metadata"].get("collector_health_status")) in ("degraded", "unhealthy"))


def backend(event: Mapping[str, Any]) -> str:
    return token(event["metadata"].get("backend"))


def event_matches(event: Mapping[str, Any], f: EventFilter) -> bool:
    """The event-level part of :class:`EventFilter` (session and status are matched per session)."""
    meta = event["metadata"]
    ts = event["timestamp_ns"]
    return not (
        (f.event_type is not None and event["event_type"] != f.event_type)
        or (f.rank is not None and event["rank"] != f.rank)
        or (f.collector is not None and event["collector"] != f.collector)
        or (f.time_start_ns is not None and ts < f.time_start_ns)
        or (f.time_end_ns is not None and ts > f.time_end_ns)
        or (f.has_alert is not None and is_alert(event) != f.has_alert)
        or (f.collector_health_status is not None and meta.get("collector_health_status") != f.collector_health_status)
        or (f.backend is not None and meta.get("backend") != f.backend))


# -- summaries ---------------------------------------------------------------------------------

Group = tuple[str | None, int | None, str | None]


def _group(row: EventRow, group_by: str) -> Group:
    if group_by == "rank":
        return None, row.event["rank"], None
    if group_by == "session-rank":
        return row.event["session_id"], row.event["rank"], None
    if group_by == "status":
        return None, None, row.session_status
    return row.event["session_id"], None, None


_PEAKS: Final = {"peak_allocator_allocated_bytes": "allocator_allocated_bytes",
                 "peak_allocator_reserved_bytes": "allocator_reserved_bytes",
                 "peak_device_used_bytes": "device_used_bytes"}


def summarize_events(rows: Sequence[EventRow], metric: str, group_by: str) -> list[SummaryRow]:
    """The event-based summaries (see ``CatalogStore.summarize``), rows sorted by group (as
    Stormlog sorts them: by the text of the ``(session_id, rank, status)`` key).

    Raises:
        ValueError: a metric that is not event-based.
    """
    if metric in _PEAKS:
        name = _PEAKS[metric]
        best: dict[Group, tuple[int, int]] = {}
        for r in rows:
            v = r.event[name]
            if v is None:
                continue
            key = _group(r, group_by)
            if key not in best or v > best[key][0]:
                best[key] = (v, r.event["timestamp_ns"])
        return [SummaryRow(metric, group_by, v, key[0], key[1], key[2], {"timestamp_ns": ts})
                for key, (v, ts) in sorted(best.items(), key=lambda kv: str(kv[0]))]
    if metric in ("alert_count", "collector_degradation_transitions"):
        counts: dict[Group, int] = defaultdict(int)
        for r in rows:
            if (is_alert(r.event) if metric == "alert_count" else r.event["event_type"] in TRANSITION_TYPES):
                counts[_group(r, group_by)] += 1
        return [SummaryRow(metric, group_by, n, key[0], key[1], key[2])
                for key, n in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    if metric == "hidden_memory_gap_growth":
        grouped: dict[Group, list[EventRow]] = defaultdict(list)
        for r in rows:
            if r.event["event_type"] == "sample":
                grouped[_group(r, group_by)].append(r)
        out = []
        for key, some in sorted(grouped.items(), key=lambda kv: str(kv[0])):
            some.sort(key=lambda r: r.event["timestamp_ns"])
            gaps = [r.event["device_used_bytes"] - r.event["allocator_reserved_bytes"] for r in some
                    if r.event["device_used_bytes"] is not None and r.event["allocator_reserved_bytes"] is not None]
            if gaps:
                out.append(SummaryRow(metric, group_by, gaps[-1] - gaps[0], key[0], key[1], key[2], {
                    "first_gap_bytes": gaps[0], "latest_gap_bytes": gaps[-1], "peak_gap_bytes": max(gaps),
                    "sample_count": len(gaps)}))
        return out
    raise ValueError(f"unsupported summary metric: {metric}")


# -- issues ------------------------------------------------------------------------------------

def _dimension(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, (list, tuple, set, frozenset)):
        return sorted((_dimension(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, Mapping):
        return _dimensions(value)
    return token(value)


def _dimensions(dims: Mapping[str, Any]) -> dict[str, Any]:
    for key in dims:
        if not isinstance(key, str) or not key.strip():
            raise ValueError("fingerprint dimension keys must be non-empty strings")
    return {k: _dimension(dims[k]) for k in sorted(dims)}


def fingerprint(kind: str, dims: Mapping[str, Any]) -> dict[str, Any]:
    """``{"schema_version": 1, "fingerprint_id", "kind", "dimensions"}``: the dimensions
    normalised (text as :func:`token`, floats to 6 places, lists sorted), the id
    ``issue:`` + the first 24 hex digits of SHA-256 over their canonical JSON (Stormlog's)."""
    norm = _dimensions(dims)
    payload = json.dumps({"schema_version": 1, "kind": kind, "dimensions": norm}, sort_keys=True,
                         separators=(",", ":"))
    return {"schema_version": 1, "fingerprint_id": "issue:" + hashlib.sha256(payload.encode()).hexdigest()[:24],
            "kind": kind, "dimensions": norm}


def _stem(error: object) -> str:
    text = token(error)
    if text == "unknown":
        return text
    for sep in (":", "\n"):
        if sep in text:
            text = text.split(sep, 1)[0].strip()
    return text[:120] or "unknown"


def _category(context: object) -> str:
    text = token(context)
    if "fragmentation" in text:
        return "high_fragmentation"
    if "oom" in text or "out of memory" in text:
        return "oom_alert"
    return "generic_alert" if text == "unknown" else text


def _link(session_id: str | None = None, timestamp_ns: int | None = None, rank: int | None = None,
          source_path: str | None = None, source_kind: str | None = None, event_type: str | None = None,
          bundle_path: str | None = None, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"session_id": session_id, "timestamp_ns": timestamp_ns, "rank": rank, "source_path": source_path,
            "source_kind": source_kind, "event_type": event_type, "bundle_path": bundle_path,
            "metadata": dict(metadata or {})}


class IssueBuilder:
    """Groups evidence into issues by fingerprint (first hit: title, representative evidence;
    every hit: severity raised to the worst, seen times widened, details updated)."""

    def __init__(self) -> None:
        self.issues: dict[str, dict[str, Any]] = {}

    def add(self, kind: str, dims: Mapping[str, Any], title: str, sev: str, link: dict[str, Any],
            seen_ns: int | None, session_id: str | None, details: Mapping[str, Any]) -> None:
        fp = fingerprint(kind, dims)
        issue = self.issues.get(fp["fingerprint_id"])
        if issue is None:
            issue = self.issues[fp["fingerprint_id"]] = {
                "fingerprint": fp, "title": title, "severity": sev, "details": dict(details), "evidence": [],
                "sessions": set(), "first": None, "last": None}
        issue["evidence"].append(link)
        if session_id is not None:
            issue["sessions"].add(session_id)
        if seen_ns is not None:
            issue["first"] = seen_ns if issue["first"] is None else min(issue["first"], seen_ns)
            issue["last"] = seen_ns if issue["last"] is None else max(issue["last"], seen_ns)
        if _SEVERITY_RANK.get(sev, 9) < _SEVERITY_RANK.get(issue["severity"], 9):
            issue["severity"] = sev
        issue["details"].update(details)

    def oom_bundle(self, row: OOMBundleRow) -> None:
        seen = utc_ns(row.created_at_utc)
        self.add("oom", {"backend": row.backend, "reason": row.reason}, "OOM captured by flight recorder", "critical",
                 _link(row.session_id, seen, source_path=row.bundle_path, source_kind="oom_bundle",
                       bundle_path=row.bundle_path,
                       metadata={"created_at_utc": row.created_at_utc, "event_count": row.event_count,
                                 "session_status": row.session_status}),
                 seen, row.session_id, {"backend": row.backend, "reason": row.reason,
                                        "exception_type": row.exception_type,
                                        "exception_module": row.exception_module})

    def event(self, row: EventRow) -> None:
        e, meta = row.event, row.event["metadata"]

        def link(metadata: Mapping[str, Any], bundle: str | None = None) -> dict[str, Any]:
            return _link(e["session_id"], e["timestamp_ns"], e["rank"], row.source_path, row.source_kind,
                         e["event_type"], bundle, metadata)

        ctx = {"context": e["context"], "session_status": row.session_status}
        if is_oom(e):
            reason = meta.get("oom_reason")
            dump = meta.get("oom_dump_path")
            self.add("oom", {"backend": backend(e), "reason": reason}, "OOM telemetry event", "critical",
                     link(ctx, dump if isinstance(dump, str) and dump else None), e["timestamp_ns"], e["session_id"],
                     {"backend": backend(e), "reason": reason, "collector": e["collector"],
                      "device_id": e["device_id"]})
        elif is_degradation(e):
            health = token(meta.get("collector_health_status"), default="degraded")
            partial = meta.get("collector_partial_fields")
            if not isinstance(partial, Sequence) or isinstance(partial, str):
                partial = ()
            dims = {"collector": e["collector"], "backend": backend(e), "health_status": health,
                    "partial_fields": list(partial), "error_stem": _stem(meta.get("collector_last_error"))}
            self.add("collector_degradation", dims, "Collector degradation",
                     "critical" if health == "unhealthy" else "warning",
                     link({"collector_consecutive_failures": meta.get("collector_consecutive_failures"),
                           "collector_next_retry_epoch_s": meta.get("collector_next_retry_epoch_s"),
                           "session_status": row.session_status}),
                     e["timestamp_ns"], e["session_id"], dims)
        elif is_alert(e):
            category = _category(e["context"])
            dims = {"event_type": e["event_type"], "severity": severity(e), "collector": e["collector"],
                    "backend": backend(e), "category": category}
            self.add("alert", dims, f"Alert: {category.replace('_', ' ')}", severity(e), link(ctx),
                     e["timestamp_ns"], e["session_id"],
                     {k: dims[k] for k in ("event_type", "collector", "backend", "category")})

    def hidden_memory(self, events: Sequence[Mapping[str, Any]], source_path: str, source_kind: str) -> None:
        """``hidden_memory_anomaly`` issues of one session's events (oldest first; at least three),
        by classification, severity, phase, collector and backend (see :mod:`traceml_ai.catalog.gaps`)."""
        if len(events) < 3:
            return
        from traceml_ai.catalog.gaps import findings

        for f in findings(events):
            ts = f["evidence_timestamp_ns"]
            at = next((e for e in events if e["timestamp_ns"] == ts), None) if ts is not None else None
            phase = f["phase"]
            label = phase["label"] if phase else None
            payload = {k: v for k, v in phase.items() if k != "label"} if phase else None
            sid = events[0]["session_id"]
            self.add("hidden_memory_anomaly",
                     {"classification": f["classification"], "severity": f["severity"], "phase": label,
                      "collector": at["collector"] if at else "unknown", "backend": backend(at) if at else "unknown"},
                     f"Hidden-memory anomaly: {f['classification']}", f["severity"],
                     _link(sid, ts, at["rank"] if at else None, source_path, source_kind,
                           at["event_type"] if at else "sample",
                           metadata={"classification": f["classification"], "confidence": f["confidence"],
                                     "phase_attribution": payload}),
                     ts, sid, {"classification": f["classification"], "description": f["description"],
                               "confidence": f["confidence"], "evidence": dict(f["evidence"]), "phase": label})

    def rows(self, states: Mapping[str, str]) -> list[dict[str, Any]]:
        """The issues as Stormlog's ``StormlogIssue.as_dict()``, worst first, then latest seen."""
        out = []
        for fid, i in self.issues.items():
            out.append({
                "fingerprint_id": fid, "fingerprint": i["fingerprint"], "kind": i["fingerprint"]["kind"],
                "state": states.get(fid, "open"), "severity": i["severity"], "title": i["title"],
                "hit_count": len(i["evidence"]), "first_seen_ns": i["first"], "last_seen_ns": i["last"],
                "affected_sessions": sorted(s for s in i["sessions"] if s),
                "representative_evidence": i["evidence"][0], "evidence": list(i["evidence"]),
                "details": dict(i["details"])})
        out.sort(key=lambda r: (_SEVERITY_RANK.get(r["severity"], 9),
                                -(r["last_seen_ns"] if r["last_seen_ns"] is not None else -1), r["fingerprint_id"]))
        return out
