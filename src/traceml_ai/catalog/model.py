"""The rows the catalog answers with (004 seed, "Query API"; DESIGN §5): runs, sessions,
attachments, and the warnings that say what was rejected or could not be resolved.

Rows are frozen dataclasses of plain values; :meth:`to_dict` gives the JSON shape printed by
``traceml query ... --json``. Times are integer nanoseconds since the Unix epoch (None when
unknown); paths are absolute.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class CatalogWarning:
    """Something the catalog rejected, could not resolve, or found ambiguous. Never silent: the CLI
    prints each on stderr and ``store.warnings`` holds them all.

    Attributes:
        path: the file or folder concerned (absolute; as given for a missing path).
        field: the field in dotted form (``attachments[0].storage``), or None for the file as a whole.
        message: one line saying what happened and what follows from it.
        code: a stable short name: ``invalid_envelope``, ``invalid_sidecar``, ``invalid_sidecar_item``,
            ``duplicate_run_id``, ``missing_path``, ``unreadable``, ``outside_root``,
            ``session_not_found``, ``session_claimed_twice``, ``duplicate_session``,
            ``unresolved_attachment``, ``missing_attachment_file``, ``attachment_outside_root``,
            ``path_is_url``, ``invalid_session``, ``telemetry_not_loaded``, ``ambiguous_identity``,
            ``unattached_bundle``.
    """

    path: str
    field: str | None
    message: str
    code: str

    def __str__(self) -> str:
        where = f"{self.path}: {self.field}" if self.field else self.path
        return f"{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """``{"path", "field", "message", "code"}``."""
        return asdict(self)

    as_dict = to_dict


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One capture lifecycle (004 seed, "Run Envelopes"; DESIGN §5): the fields of Stormlog 0.4.3's
    session row, then TraceML's own. Each session is listed once, even when several artifacts name
    it (Stormlog lists it once per artifact; see docs/catalog.md, "Differences from Stormlog").

    Attributes:
        session_id: the session's identifier.
        status: ``running``, ``completed``, ``interrupted`` or ``incomplete`` (Stormlog's ledger or
            bundle, or inferred from the events: ``completed`` with a ``stop`` event, else
            ``incomplete``); None only for a TraceML session that records none.
        started_at_ns, ended_at_ns: lifecycle times (Unix epoch ns); end None while running.
        host, pid: where it ran (``unknown`` / -1 when not recorded).
        job_id, rank, local_rank, world_size: identity (Stormlog's defaults 0, rank, 1 when not
            recorded; a TraceML session of a whole job has rank None and world_size > 1).
        source: the writer (``stormlog.cpu_profiler``, ``gpumemprof diagnose``, ``artifact:<file>``,
            ``traceml.aggregator``).
        source_path: the sink or bundle folder, or the telemetry file; for a TraceML session its
            ``aggregator/manifest.json``.
        source_kind: ``sink``, ``diagnose_bundle``, ``telemetry_json``, ``telemetry_jsonl``,
            ``telemetry_csv``, or ``traceml_session``.
        source_count: segments (sink) or files the session was read from.
        warning_count: rows of its file that could not be read.
        event_count: events recorded (None for a bundle).
        oom_bundle_count: OOM bundles taken from this session.
        run_id: the run it belongs to (an explicit one when an envelope claims it).
        run_ids: every run it belongs to (a session claimed by two envelopes is in both).
        role: ``rank`` or ``job`` when recorded (TraceML sessions, envelopes).
        metadata: what the source recorded beyond the above (TraceML: run folder, mode, nodes).
    """

    session_id: str
    status: str | None
    started_at_ns: int | None
    ended_at_ns: int | None
    host: str
    pid: int
    job_id: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    source: str
    source_path: str
    source_kind: str
    source_count: int
    warning_count: int
    event_count: int | None
    oom_bundle_count: int
    run_id: str = ""
    run_ids: tuple[str, ...] = ()
    role: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    TRACEML_FIELDS: ClassVar[tuple[str, ...]] = ("run_id", "run_ids", "role", "metadata")
    """Fields of TraceML's own, after Stormlog's (left out of ``--csv``, which is Stormlog's)."""

    @property
    def kind(self) -> str:
        """The session's source kind (older name of :attr:`source_kind`)."""
        return self.source_kind

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (field names as above; tuples become lists)."""
        d = asdict(self)
        d["run_ids"] = list(d["run_ids"])
        return d

    as_dict = to_dict


@dataclass(frozen=True, slots=True)
class AttachmentRow:
    """One run attachment (004 seed, "Attachments"): the fields of Stormlog 0.4.3's attachment row,
    then ``declared_in``.

    Attributes:
        run_id: the run it belongs to.
        title: a human title.
        kind: Stormlog's kinds for its artifacts (``telemetry_sink``, ``telemetry_sink_segment``,
            ``telemetry_rollup``, ``diagnose_bundle``, ``oom_bundle``, ``telemetry_file``), TraceML's
            for a run folder's (``telemetry_database``, ``export``, ``final_summary``,
            ``finalization_warning``), or what an envelope or sidecar says (``profiler_trace``, ...).
        storage: ``reference`` (points elsewhere; no bytes copied) or ``copy`` (part of the local
            artifact set); local artifacts found on disk are ``copy``.
        attachment_id: as declared (None when not given, and for artifacts found on disk, except a
            TraceML run folder's: ``<session_id>/aggregator/<name>``).
        url: the remote address as written (recorded, never fetched), or None.
        path: absolute local path (relative paths resolved against the folder of the envelope or
            sidecar), or None for a URL-only attachment.
        session_id, job_id, rank, local_rank, world_size: what the attachment is about.
        start_ns, end_ns: the time it covers (Unix epoch ns), when known.
        source_path: the attachment itself: its url, else its path, else the declaring file.
        source_kind: where it came from: ``run_envelope_attachment``, ``attachment_sidecar``,
            ``sink``, ``sink_segment``, ``rollup``, ``diagnose_bundle``, ``oom_bundle``, a telemetry
            file's kind, or ``traceml_session``.
        source_namespace, source_ref: shallow navigation keys (e.g. ``nsys`` / ``rank0``;
            ``stormlog`` for Stormlog's local artifacts, ``traceml`` for a run folder's).
        metadata: integration-specific details.
        declared_in: the file that declared it (envelope, sidecar, manifest, telemetry file).
    """

    run_id: str | None
    title: str
    kind: str
    storage: str
    attachment_id: str | None
    url: str | None
    path: str | None
    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    source_path: str = ""
    source_kind: str = ""
    source_namespace: str | None = None
    source_ref: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    declared_in: str = ""

    TRACEML_FIELDS: ClassVar[tuple[str, ...]] = ("declared_in",)
    """Fields of TraceML's own, after Stormlog's (left out of ``--csv``, which is Stormlog's)."""

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (field names as above)."""
        return asdict(self)

    as_dict = to_dict


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run: explicit (an accepted ``stormlog_run.json``) or implicit (synthesized from sessions
    that no accepted envelope covers; 004 seed, "Discovery Rules"): the fields of Stormlog 0.4.3's
    run row, then ``status``.

    Attributes:
        run_id: the envelope's ``run_id``; for implicit runs ``job:<job_id>`` (sessions sharing a
            non-null job_id) or ``session:<session_id>`` (a session without job_id); ``implicit:``
            before it when an envelope already took that id.
        explicit: True for an envelope's run.
        title, description: from the envelope; an implicit run's title is ``Distributed job <id>``
            or ``Session <id>``.
        job_id: the envelope's, else the one job_id its sessions share.
        started_at_ns, ended_at_ns: the envelope's; else the earliest start and, once every session
            has ended, the latest end of its sessions (Unix epoch ns; None when unknown).
        source_path: the envelope file; for an implicit run the source of its first session.
        source_kind: ``run_envelope`` or ``implicit_run``.
        source_namespace, source_ref: the envelope's shallow navigation keys.
        session_count, attachment_count: how many sessions and attachments the run holds.
        sessions: the session ids, earliest first.
        ranks: the distinct ranks of its sessions, ascending.
        tags: the envelope's tags.
        metadata: the envelope's metadata ({} for implicit runs).
        status: ``running`` if any session runs, else ``interrupted``/``incomplete`` if any session
            is, else ``completed`` when all are; None without sessions (TraceML's, not Stormlog's).
    """

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
    session_count: int
    attachment_count: int
    sessions: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str | None = None

    TRACEML_FIELDS: ClassVar[tuple[str, ...]] = ("status",)
    """Fields of TraceML's own, after Stormlog's (left out of ``--csv``, which is Stormlog's)."""

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        for key in ("sessions", "ranks", "tags"):
            d[key] = list(d[key])
        return d

    as_dict = to_dict


@dataclass(frozen=True)
class RunFilter:
    """Stormlog's run filter (``stormlog.query.RunFilter``): None matches everything."""

    run_id: str | None = None
    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    source_namespace: str | None = None
    source_ref: str | None = None


@dataclass(frozen=True)
class RunAttachmentFilter:
    """Stormlog's attachment filter (``stormlog.query.RunAttachmentFilter``)."""

    run_id: str | None = None
    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    kind: str | None = None
    source_namespace: str | None = None
    source_ref: str | None = None


@dataclass(frozen=True)
class SessionFilter:
    """Stormlog's session filter (``stormlog.query.SessionFilter``)."""

    session_id: str | None = None
    status: str | None = None
    job_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    has_oom_bundle: bool | None = None
    source_kind: str | None = None


# -- events, OOM bundles, sidecar items, summaries, issues, correlation (Stormlog's other queries) --

@dataclass(frozen=True)
class EventFilter:
    """Stormlog's event filter (``stormlog.query.EventFilter``). ``time_start_ns``/``time_end_ns``
    bound ``timestamp_ns`` (inclusive); ``has_alert`` keeps events that are (not) alerts (event type
    warning/critical/error, or a warning/critical/error ``metadata.severity``); ``status`` is the
    session's status; ``collector_health_status`` and ``backend`` match ``metadata``; ``limit``
    keeps the first rows."""

    session_id: str | None = None
    event_type: str | None = None
    rank: int | None = None
    collector: str | None = None
    status: str | None = None
    time_start_ns: int | None = None
    time_end_ns: int | None = None
    has_alert: bool | None = None
    collector_health_status: str | None = None
    backend: str | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class EventRow:
    """One canonical telemetry event (Stormlog's ``EventRow``).

    Attributes:
        event: the event as Stormlog's ``telemetry_event_to_dict`` gives it (schema v4 fields:
            ``session_id``, ``timestamp_ns`` (Unix epoch ns), ``event_type``, ``collector``, identity,
            byte counters (None when not measured), ``context``, ``metadata``).
        source_path: the real path of the file the session's events came from (a sink's first segment).
        source_kind: ``sink``, ``telemetry_json``, ``telemetry_jsonl`` or ``telemetry_csv``.
        session_status: the status of the event's session.
    """

    event: dict[str, Any]
    source_path: str
    source_kind: str
    session_status: str

    def to_dict(self) -> dict[str, Any]:
        """The event's fields plus ``source_path``, ``source_kind``, ``session_status``."""
        return {**self.event, "metadata": dict(self.event["metadata"]), "source_path": self.source_path,
                "source_kind": self.source_kind, "session_status": self.session_status}

    as_dict = to_dict


@dataclass(frozen=True)
class OOMBundleFilter:
    """Stormlog's OOM bundle filter. ``created_after``/``created_before``: ISO-8601 times (UTC when
    no zone is given), inclusive; a bundle without a readable creation time matches neither."""

    session_id: str | None = None
    backend: str | None = None
    reason: str | None = None
    created_after: str | None = None
    created_before: str | None = None


@dataclass(frozen=True, slots=True)
class OOMBundleRow:
    """One OOM bundle (``oom_dump_*`` folder written by Stormlog's ``OOMFlightRecorder.dump``).

    Attributes:
        bundle_path, manifest_path: the folder and its ``manifest.json`` (absolute).
        created_at_utc: the manifest's creation time (ISO-8601 text as written), or None.
        backend, reason, event_count, exception_type, exception_module: as the manifest says.
        session_id: the session it was dumped for; session_status: the manifest's, else the status
            a sink ledger or diagnose bundle gives that session.
    """

    bundle_path: str
    created_at_utc: str | None
    backend: str | None
    reason: str | None
    event_count: int | None
    session_id: str | None
    session_status: str | None
    exception_type: str | None
    exception_module: str | None
    manifest_path: str = ""

    TRACEML_FIELDS: ClassVar[tuple[str, ...]] = ("manifest_path",)
    """Fields of TraceML's own, after Stormlog's (left out of ``--csv``, which is Stormlog's)."""

    def to_dict(self) -> dict[str, Any]:
        """Stormlog's fields plus ``manifest_path``."""
        return asdict(self)

    as_dict = to_dict


@dataclass(frozen=True)
class AttachmentFilter:
    """Stormlog's sidecar item filter (``stormlog.correlation.AttachmentFilter``)."""

    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class ExternalAttachment:
    """One item of a ``stormlog_attachments.json`` sidecar as read, before its run is resolved
    (Stormlog's ``ExternalAttachment``). ``path`` is absolute (resolved against the sidecar's
    folder); ``sidecar_path`` is the sidecar."""

    title: str
    kind: str
    attachment_id: str | None
    url: str | None
    path: str | None
    run_id: str | None
    session_id: str | None
    job_id: str | None
    rank: int | None
    start_ns: int | None
    end_ns: int | None
    created_at_utc: str | None
    updated_at_utc: str | None
    storage: str | None
    source_namespace: str | None
    source_ref: str | None
    metadata: dict[str, Any]
    sidecar_path: str

    def to_dict(self) -> dict[str, Any]:
        """The fields above, as Stormlog's ``as_dict``."""
        return asdict(self)

    as_dict = to_dict


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One row of a built-in summary (Stormlog's ``SummaryRow``).

    Attributes:
        metric: the summary asked for; group_by: ``session``, ``session-rank``, ``rank`` or ``status``.
        value: the count, or the byte figure (peak; last gap minus first gap).
        session_id, rank, status: the group (None where the grouping does not use it).
        details: more fields merged into the dict (``timestamp_ns`` of a peak; ``first_gap_bytes``,
            ``latest_gap_bytes``, ``peak_gap_bytes``, ``sample_count`` of a gap growth).
    """

    metric: str
    group_by: str
    value: int | float | str | None
    session_id: str | None = None
    rank: int | None = None
    status: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``metric, group_by, session_id, rank, status, value`` and the details."""
        return {"metric": self.metric, "group_by": self.group_by, "session_id": self.session_id, "rank": self.rank,
                "status": self.status, "value": self.value, **self.details}

    as_dict = to_dict


@dataclass(frozen=True)
class IssueFilter:
    """Stormlog's issue filter: ``kind`` one of ``oom``, ``collector_degradation``, ``alert``,
    ``hidden_memory_anomaly``; ``state`` one of ``open``, ``resolved``, ``ignored``, ``regressed``;
    ``session_id`` keeps issues that affected that session."""

    fingerprint_id: str | None = None
    kind: str | None = None
    state: str | None = None
    severity: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class IssueRow:
    """A recurring issue grouped by its fingerprint (Stormlog's ``StormlogIssue.as_dict()``).

    Attributes:
        fingerprint_id: ``issue:`` + 24 hex digits, stable across runs (the same id Stormlog gives).
        fingerprint: ``{"schema_version", "fingerprint_id", "kind", "dimensions"}``.
        kind, state, severity, title: what it is; ``state`` ``open`` unless overridden.
        hit_count: the evidence count; first_seen_ns, last_seen_ns: Unix epoch ns or None.
        affected_sessions: session ids, sorted.
        representative_evidence, evidence: links (``session_id``, ``timestamp_ns``, ``rank``,
            ``source_path``, ``source_kind``, ``event_type``, ``bundle_path``, ``metadata``).
        details: the dimensions as seen and what the last hit added.
    """

    fingerprint_id: str
    fingerprint: dict[str, Any]
    kind: str
    state: str
    severity: str
    title: str
    hit_count: int
    first_seen_ns: int | None
    last_seen_ns: int | None
    affected_sessions: list[str]
    representative_evidence: dict[str, Any]
    evidence: list[dict[str, Any]]
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The fields above."""
        return asdict(self)

    as_dict = to_dict
