"""The rows the catalog answers with (004 seed, "Query API"; DESIGN §5): runs, sessions,
attachments, and the warnings that say what was rejected or could not be resolved.

Rows are frozen dataclasses of plain values; :meth:`to_dict` gives the JSON shape printed by
``traceml query ... --json``. Times are integer nanoseconds since the Unix epoch (None when
unknown); paths are absolute.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
            ``session_not_found``, ``session_claimed_twice``, ``duplicate_session``, ``ambiguous_rank``,
            ``unresolved_attachment``, ``missing_attachment_file``, ``attachment_outside_root``,
            ``path_is_url``, ``duplicate_attachment_id``, ``invalid_session``.
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


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One capture lifecycle (004 seed, "Run Envelopes"; DESIGN §5), as it belongs to one run.

    A session claimed by two accepted envelopes appears once per run (with a warning).

    Attributes:
        session_id: the session's identifier.
        run_id: the run the session belongs to (explicit or implicit).
        kind: where it was found: ``traceml_session`` (a run folder with ``aggregator/manifest.json``),
            ``sink_session`` (an entry of a Stormlog sink ``manifest.json``), ``diagnose_bundle``,
            ``oom_bundle``, ``telemetry_jsonl``, or ``envelope_only`` (named by an envelope, not on disk).
        job_id, rank, local_rank, world_size: identity; None when not recorded. A TraceML session of
            several ranks has ``rank`` None and ``world_size`` > 1 (one aggregator collects them all).
        role: ``rank``, ``job`` or what the envelope says; None when unknown.
        status: ``running``, ``completed``, ``interrupted``, ``incomplete``, or None when not recorded.
        started_at_ns, ended_at_ns: lifecycle times (Unix epoch ns), None when unknown.
        on_disk: False for a session that an envelope names but discovery did not find.
        source_path: the file the identity was read from (manifest, ledger, bundle, JSONL, envelope).
        hostname: the machine the session ran on, when recorded.
        metadata: the envelope's metadata for the session, else what the source recorded.
    """

    session_id: str
    run_id: str
    kind: str
    job_id: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    role: str | None = None
    status: str | None = None
    started_at_ns: int | None = None
    ended_at_ns: int | None = None
    on_disk: bool = True
    source_path: str = ""
    hostname: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (field names as above)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AttachmentRow:
    """One run attachment (004 seed, "Attachments").

    Attributes:
        run_id: the run it belongs to; None for an attachment that resolves to no run (reported as
            an ``unresolved_attachment`` warning, still listed so nothing disappears).
        attachment_id: unique within its envelope or sidecar; local artifacts found by discovery get
            ``<session_id>/<kind>``.
        title: a human title, or None.
        kind: ``profiler_trace``, ``telemetry_database``, ``export``, ``final_summary``,
            ``finalization_warning``, ``sink``, ``sink_segment``, ``rollup``, ``diagnose_bundle``,
            ``oom_bundle``, ``telemetry_jsonl``, or whatever an envelope or sidecar says.
        storage: ``reference`` (points elsewhere; no bytes copied) or ``copy`` (part of the local
            artifact set), as given; local artifacts found by discovery are ``copy``.
        path: absolute local path (relative paths resolved against the folder of the envelope or
            sidecar), or None for a URL-only attachment.
        url: the remote address as written (recorded, never fetched), or None.
        session_id, job_id, rank: what the attachment is about, when given.
        source_namespace, source_ref: shallow navigation keys (e.g. ``nsys`` / ``rank0``).
        metadata: integration-specific details.
        source_path: the file that declared it (envelope, sidecar, manifest, ledger, bundle).
    """

    run_id: str | None
    attachment_id: str
    title: str | None
    kind: str
    storage: str
    path: str | None
    url: str | None
    session_id: str | None = None
    job_id: str | None = None
    rank: int | None = None
    source_namespace: str | None = None
    source_ref: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (field names as above)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run: explicit (an accepted ``stormlog_run.json``) or implicit (synthesized from sessions
    that no accepted envelope covers; 004 seed, "Discovery Rules").

    Attributes:
        run_id: the envelope's ``run_id``; for implicit runs ``job:<job_id>`` (sessions sharing a
            non-null job_id) or ``session:<session_id>`` (a session without job_id).
        explicit: True for an envelope's run.
        title, description: from the envelope; an implicit run of one TraceML session takes the run
            folder's name as title.
        job_id: the envelope's, or the shared job_id of an implicit run.
        started_at_ns, ended_at_ns: the envelope's; else the earliest start and, once every session
            has ended, the latest end of its sessions (Unix epoch ns; None when unknown).
        status: ``running`` if any session runs, else ``interrupted``/``incomplete`` if any session
            is, else ``completed`` when all are; None when no session records a status.
        source_path: the envelope file; for an implicit run the source of its first session.
        session_count, attachment_count: how many sessions and attachments the run holds.
        sessions: the session ids, in discovery order.
        ranks: the distinct non-null ranks of its sessions, ascending.
        tags: the envelope's tags.
        source_namespace, source_ref: the envelope's shallow navigation keys.
        metadata: the envelope's metadata ({} for implicit runs).
    """

    run_id: str
    explicit: bool
    title: str | None
    description: str | None
    job_id: str | None
    started_at_ns: int | None
    ended_at_ns: int | None
    status: str | None
    source_path: str
    session_count: int
    attachment_count: int
    sessions: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    source_namespace: str | None = None
    source_ref: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        for key in ("sessions", "ranks", "tags"):
            d[key] = list(d[key])
        return d
