"""The query store: ``open(paths)`` → runs, attachments, sessions, warnings, and the telemetry
events, OOM bundles, sidecar items, summaries, issues and correlations (004 seed, "Query API";
DESIGN §5), with every method and row of real Stormlog's ``stormlog.query.open()``.

Filters are Stormlog's filter objects and/or keyword arguments; each keyword takes one value or a
list of values (any of them matches), and several filters must all match. A value of the wrong
type (``rank="0"``, ``run_id=42``) raises TypeError rather than matching nothing. Rows come back in
Stormlog's order: runs and sessions latest start first, attachments by run, session, rank, kind
and title."""

from __future__ import annotations

import dataclasses
import gc
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any, TypeVar

from traceml_ai.catalog.analysis import ISSUE_STATES, SUMMARY_GROUPS, SUMMARY_METRICS, IssueBuilder, summarize_events
from traceml_ai.catalog.analysis import event_matches as _event_matches
from traceml_ai.catalog.analysis import utc as _utc
from traceml_ai.catalog.build import Catalog, build
from traceml_ai.catalog.cache import FactCache
from traceml_ai.catalog.correlate import (
    CorrelationFilter,
    CorrelationResult,
    anchor_for,
    attachment_evidence,
    diagnose_evidence,
    event_evidence,
    marker_evidence,
    oom_evidence,
    ranked,
    rollup_evidence,
)
from traceml_ai.catalog.discovery import Source, discover
from traceml_ai.catalog.events import LoadedSession, load_source, read_rollups
from traceml_ai.catalog.model import (
    AttachmentFilter,
    AttachmentRow,
    CatalogWarning,
    EventFilter,
    EventRow,
    ExternalAttachment,
    IssueFilter,
    IssueRow,
    OOMBundleFilter,
    OOMBundleRow,
    RunAttachmentFilter,
    RunFilter,
    RunRow,
    SessionFilter,
    SessionRow,
    SummaryRow,
)
from traceml_ai.runs.discovery import inside

Text = str | Sequence[str] | None
Rank = int | Sequence[int] | None
Row = TypeVar("Row", RunRow, SessionRow, AttachmentRow)


class CacheFolderError(ValueError):
    """The cache folder would lie inside one of the roots (the catalog never writes inside a root)."""


def _wanted(value: Text | Rank) -> set[object] | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return {value}
    return set(value)


def _check_filters(rank: Rank, **text: Text) -> None:
    """Raise TypeError for a filter value of the wrong type: ``rank="0"`` would match nothing and
    say nothing (ranks are ints), ``run_id=42`` likewise (ids are strings)."""
    def ok(value: object, want: type) -> bool:
        if want is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, want)

    for name, value, want, words in (("rank", rank, int, "an int"),
                                     *((n, v, str, "a string") for n, v in text.items())):
        if value is None or ok(value, want):
            continue
        items = list(value) if isinstance(value, (list, tuple, set, frozenset)) else None
        if items is None or not all(ok(v, want) for v in items):
            raise TypeError(f"{name} must be {words} or a list of them, not {value!r}")


Check = tuple[Any, Callable[[Any], Any]]
"""(wanted value or values, getter of the row's value)."""


def _filter(rows: Iterable[Row], checks: Sequence[Check]) -> list[Row]:
    """Rows where every given filter matches: the getter's value is one of the wanted values (for a
    tuple or set value: shares one with them)."""
    active = [(w, get) for value, get in checks if (w := _wanted(value)) is not None]
    kept = []
    for row in rows:
        for wanted, get in active:
            v = get(row)
            hit = not wanted.isdisjoint(v) if isinstance(v, (tuple, set, frozenset)) else v in wanted
            if not hit:
                break
        else:
            kept.append(row)
    return kept


class CatalogStore:
    """Runs, sessions and attachments found under some paths, with the warnings of that discovery.

    Build one with :func:`open_catalog` (``traceml_ai.catalog.open``). The store is a snapshot: open
    it again to see files that changed.

    Attributes:
        warnings: every rejected envelope or sidecar item, unresolved attachment, ambiguous identity,
            missing path and symlink leaving a root (DESIGN §5: never silent).
        roots: the real paths of the folders searched (a file's parent for a file given).
        unread_paths: the paths given (as given) that could not be read at all (permission denied
            on the way to them, on listing the folder or reading the file); each is also a warning.
        cache_hits, cache_misses: files whose facts came from the parse cache / were read.
    """

    def __init__(self, catalog: Catalog, roots: list[str], cache_hits: int = 0, cache_misses: int = 0,
                 unread_paths: Sequence[str] = ()) -> None:
        self._catalog = catalog
        self.roots = roots
        self.unread_paths = list(unread_paths)
        self.warnings: list[CatalogWarning] = list(catalog.warnings)
        self.cache_hits = cache_hits
        self.cache_misses = cache_misses
        self._events: list[tuple[Source, list[LoadedSession]]] | None = None

    @property
    def catalog(self) -> CatalogStore:
        """The store itself, for code written against Stormlog (``store.catalog.warnings``)."""
        return self

    def list_runs(
        self, filters: RunFilter | None = None, *, run_id: Text = None, job_id: Text = None, session_id: Text = None,
        rank: Rank = None, kind: Text = None, source_namespace: Text = None, source_ref: Text = None,
    ) -> list[RunRow]:
        """Runs, explicit and implicit, latest start first (as Stormlog's ``list_runs``).

        Filters: a :class:`RunFilter` (Stormlog's) and/or keywords. ``run_id``, ``job_id``,
        ``source_namespace``, ``source_ref`` match the run's own values; ``session_id`` and ``rank``
        keep runs holding such a session / rank; ``kind`` keeps runs holding an attachment of that
        kind (e.g. ``profiler_trace``).

        Raises:
            TypeError: a filter value of the wrong type (``rank="0"``; ranks are ints, ids strings).
        """
        if filters is not None:
            run_id, session_id, job_id, rank, source_namespace, source_ref = _merge(
                filters, ("run_id", run_id), ("session_id", session_id), ("job_id", job_id), ("rank", rank),
                ("source_namespace", source_namespace), ("source_ref", source_ref))
        _check_filters(rank, run_id=run_id, job_id=job_id, session_id=session_id, kind=kind,
                       source_namespace=source_namespace, source_ref=source_ref)
        kinds: dict[str | None, set[str]] = {}
        if kind is not None:
            for a in self._catalog.attachments:
                kinds.setdefault(a.run_id, set()).add(a.kind)
        return _filter(self._catalog.runs, [
            (run_id, attrgetter("run_id")), (job_id, attrgetter("job_id")), (session_id, attrgetter("sessions")),
            (rank, attrgetter("ranks")), (kind, lambda r: frozenset(kinds.get(r.run_id, ()))),
            (source_namespace, attrgetter("source_namespace")), (source_ref, attrgetter("source_ref")),
        ])

    def list_run_attachments(
        self, filters: RunAttachmentFilter | None = None, *, run_id: Text = None, job_id: Text = None,
        session_id: Text = None, rank: Rank = None, kind: Text = None, source_namespace: Text = None,
        source_ref: Text = None,
    ) -> list[AttachmentRow]:
        """Attachments of every run, by run, session, rank, kind and title (as Stormlog's
        ``list_run_attachments``). Filters (a :class:`RunAttachmentFilter` and/or keywords) match
        the attachment's own fields.

        Raises:
            TypeError: as :meth:`list_runs`.
        """
        if filters is not None:
            run_id, session_id, job_id, rank, kind, source_namespace, source_ref = _merge(
                filters, ("run_id", run_id), ("session_id", session_id), ("job_id", job_id), ("rank", rank),
                ("kind", kind), ("source_namespace", source_namespace), ("source_ref", source_ref))
        _check_filters(rank, run_id=run_id, job_id=job_id, session_id=session_id, kind=kind,
                       source_namespace=source_namespace, source_ref=source_ref)
        return _filter(self._catalog.attachments, [
            (run_id, attrgetter("run_id")), (job_id, attrgetter("job_id")), (session_id, attrgetter("session_id")),
            (rank, attrgetter("rank")), (kind, attrgetter("kind")),
            (source_namespace, attrgetter("source_namespace")), (source_ref, attrgetter("source_ref")),
        ])

    def list_sessions(
        self, filters: SessionFilter | None = None, *, run_id: Text = None, job_id: Text = None,
        session_id: Text = None, rank: Rank = None, kind: Text = None, source_kind: Text = None,
        status: Text = None, world_size: Rank = None, has_oom_bundle: bool | None = None,
        source_namespace: Text = None, source_ref: Text = None,
    ) -> list[SessionRow]:
        """Sessions, latest start first, each once (as Stormlog's ``list_sessions``). Filters (a
        :class:`SessionFilter` and/or keywords): ``source_kind`` (or ``kind``) is the session's
        source kind (``sink``, ``traceml_session``, ...); ``run_id``, ``source_namespace`` and
        ``source_ref`` match the session's runs; ``has_oom_bundle`` True/False keeps sessions with /
        without an OOM bundle.

        Raises:
            TypeError: as :meth:`list_runs`.
        """
        if filters is not None:
            session_id, status, job_id, rank, world_size, source_kind = _merge(
                filters, ("session_id", session_id), ("status", status), ("job_id", job_id), ("rank", rank),
                ("world_size", world_size), ("source_kind", source_kind))
            if has_oom_bundle is None:
                has_oom_bundle = filters.has_oom_bundle
        _check_filters(rank, run_id=run_id, job_id=job_id, session_id=session_id, kind=kind, status=status,
                       source_kind=source_kind, source_namespace=source_namespace, source_ref=source_ref)
        _check_filters(world_size)
        runs = {r.run_id: r for r in self._catalog.runs}

        def of_runs(get: Callable[[RunRow], Any]) -> Callable[[SessionRow], frozenset[Any]]:
            return lambda s: frozenset(get(runs[r]) for r in s.run_ids if r in runs)

        rows = _filter(self._catalog.sessions, [
            (run_id, attrgetter("run_ids")), (job_id, attrgetter("job_id")), (session_id, attrgetter("session_id")),
            (rank, attrgetter("rank")), (kind, attrgetter("source_kind")), (source_kind, attrgetter("source_kind")),
            (status, attrgetter("status")), (world_size, attrgetter("world_size")),
            (source_namespace, of_runs(attrgetter("source_namespace"))),
            (source_ref, of_runs(attrgetter("source_ref"))),
        ])
        if has_oom_bundle is not None:
            rows = [s for s in rows if (s.oom_bundle_count > 0) == has_oom_bundle]
        return rows

    # -- events, OOM bundles, sidecar items, summaries (Stormlog's other query methods) ---------

    def _loaded(self) -> list[tuple[Source, list[LoadedSession]]]:
        """Every source's sessions and events, read on first use (a source Stormlog cannot load
        gives none and a ``telemetry_not_loaded`` warning, once). A session found in several
        artifacts gives its events once, from the artifact it is listed from (as ``list_sessions``)."""
        if self._events is not None:
            return self._events
        warned = {w.path for w in self.warnings if w.code == "telemetry_not_loaded"}
        best = {s.session_id: (s.source_path, s.source_kind) for s in self._catalog.sessions}
        out: list[tuple[Source, list[LoadedSession]]] = []
        for source in self._catalog.sources:
            if source.kind in ("diagnose_bundle", "oom_bundle"):
                continue
            try:
                loaded = load_source(source, self.roots)
            except (OSError, ValueError) as exc:
                if source.path not in warned:
                    why = getattr(exc, "strerror", None) or exc
                    self.warnings.append(CatalogWarning(source.path, None, f"events not loaded: {why}",
                                                        "telemetry_not_loaded"))
                loaded = []
            keep = [s for s in loaded
                    if best.get(s.summary["session_id"], (source.path, source.kind)) == (source.path, source.kind)]
            out.append((source, keep))
        self._events = out
        return out

    def query_events(self, filters: EventFilter | None = None, **fields: Any) -> list[EventRow]:
        """Telemetry events, oldest first (by time, then session id), as Stormlog's
        ``query_events``: a :class:`EventFilter` and/or its fields as keywords
        (``store.query_events(session_id="s1", has_alert=True, limit=10)``).

        Raises:
            TypeError: an unknown keyword.
        """
        f = replace(filters or EventFilter(), **fields)
        rows: list[EventRow] = []
        for source, sessions in self._loaded():
            for loaded in sessions:
                summary = loaded.summary
                if f.session_id is not None and summary["session_id"] != f.session_id:
                    continue
                if f.status is not None and summary["status"] != f.status:
                    continue
                path = loaded.sources_loaded[0] if loaded.sources_loaded else source.path
                rows.extend(EventRow(e, path, source.kind, summary["status"]) for e in loaded.events
                            if _event_matches(e, f))
        rows.sort(key=lambda r: (r.event["timestamp_ns"], r.event["session_id"]))
        return rows if f.limit is None else rows[: f.limit]

    def _ledger_statuses(self) -> dict[str, str]:
        statuses: dict[str, str] = {}
        for source in self._catalog.sources:
            if source.kind == "sink":
                for s in (source.fact.get("sink") or {}).get("sessions", []):
                    statuses.setdefault(s["session_id"], s["status"])
            elif source.kind == "diagnose_bundle":
                summary = (source.fact.get("diagnose") or {}).get("summary")
                if summary is not None:
                    statuses.setdefault(summary["session_id"], summary["status"])
        return statuses

    def list_oom_bundles(self, filters: OOMBundleFilter | None = None, **fields: Any) -> list[OOMBundleRow]:
        """The OOM bundles found, oldest first (by ``created_at_utc`` text, then path), as
        Stormlog's ``list_oom_bundles``: a :class:`OOMBundleFilter` and/or its fields as keywords.

        Raises:
            TypeError: an unknown keyword.
        """
        f = replace(filters or OOMBundleFilter(), **fields)
        statuses = self._ledger_statuses()
        after, before = _utc(f.created_after), _utc(f.created_before)
        rows = []
        for b in self._catalog.oom_bundles:
            status = b["session_status"] or (statuses.get(b["session_id"]) if b["session_id"] is not None else None)
            row = OOMBundleRow(b["bundle_path"], b["created_at_utc"], b["backend"], b["reason"], b["event_count"],
                               b["session_id"], status, b["exception_type"], b["exception_module"],
                               b["manifest_path"])
            if any(want is not None and got != want for want, got in (
                    (f.session_id, row.session_id), (f.backend, row.backend), (f.reason, row.reason))):
                continue
            created = _utc(row.created_at_utc)
            if after is not None and (created is None or created < after):
                continue
            if before is not None and (created is None or created > before):
                continue
            rows.append(row)
        rows.sort(key=lambda r: (r.created_at_utc or "", r.bundle_path))
        return rows

    def _attachment_items(self) -> list[ExternalAttachment]:
        """The sidecar items in discovery order."""
        names = [fl.name for fl in dataclasses.fields(ExternalAttachment)]
        rows = []
        for a in self._catalog.sidecar_items:
            values: dict[str, Any] = {n: a.get(n) for n in names}
            values["metadata"] = dict(a.get("metadata") or {})
            rows.append(ExternalAttachment(**values))
        return rows

    def list_attachments(self, filters: AttachmentFilter | None = None, **fields: Any) -> list[ExternalAttachment]:
        """Every item read from ``stormlog_attachments.json`` sidecars, before resolving its run
        (Stormlog's ``list_attachments``; ``path`` absolute, ``sidecar_path`` the file), by start
        time, title and sidecar; filtered by a :class:`AttachmentFilter` and/or its fields.

        Raises:
            TypeError: an unknown keyword.
        """
        f = replace(filters or AttachmentFilter(), **fields)
        rows = [a for a in self._attachment_items() if all(want is None or getattr(a, name) == want for name, want in (
            ("session_id", f.session_id), ("job_id", f.job_id), ("rank", f.rank), ("kind", f.kind)))]
        rows.sort(key=lambda a: (a.start_ns if a.start_ns is not None else -1, a.title, a.sidecar_path))
        return rows

    def summarize(self, metric: str, *, group_by: str | None = None) -> list[SummaryRow]:
        """One built-in summary, as Stormlog's ``summarize`` (metrics: :data:`SUMMARY_METRICS`;
        ``group_by``: ``session`` (default), ``session-rank``, ``rank`` or ``status``; the two
        session metrics ignore it). Rows are sorted by their group.

        - ``session_count_by_status``: sessions per status (each session once).
        - ``interrupted_sessions_with_oom_bundles``: interrupted sessions with an OOM bundle; the
          value is their bundle count.
        - ``peak_allocator_allocated_bytes``, ``peak_allocator_reserved_bytes``,
          ``peak_device_used_bytes``: the highest value per group and ``timestamp_ns`` of its first
          event (events that did not measure it are left out).
        - ``alert_count``, ``collector_degradation_transitions``: alert events (see
          :class:`EventFilter`) / ``collector_degraded`` and ``collector_recovered`` events per group.
        - ``hidden_memory_gap_growth``: over ``sample`` events measuring both, the device-used minus
          allocator-reserved gap: last minus first (with first, latest, peak and sample count).

        Raises:
            ValueError: an unknown metric or grouping.
        """
        if metric not in SUMMARY_METRICS:
            raise ValueError(f"unsupported summary metric: {metric} (one of {', '.join(SUMMARY_METRICS)})")
        if group_by is not None and group_by not in SUMMARY_GROUPS:
            raise ValueError(f"unsupported grouping: {group_by} (one of {', '.join(SUMMARY_GROUPS)})")
        sessions = self._catalog.sessions
        if metric == "session_count_by_status":
            counts: dict[str | None, int] = defaultdict(int)
            for s in sessions:
                counts[s.status] += 1
            return [SummaryRow(metric, "status", n, status=status)
                    for status, n in sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))]
        if metric == "interrupted_sessions_with_oom_bundles":
            return [SummaryRow(metric, "session", s.oom_bundle_count, session_id=s.session_id, status=s.status)
                    for s in sessions if s.status == "interrupted" and s.oom_bundle_count > 0]
        return summarize_events(self.query_events(), metric, group_by or "session")

    def correlate(self, filters: CorrelationFilter | None = None, **fields: Any) -> CorrelationResult:
        """The evidence around a moment or a telemetry record (Stormlog's ``correlate``; see
        :mod:`traceml_ai.catalog.correlate`): a :class:`CorrelationFilter` and/or its fields as
        keywords (``store.correlate(at_ns=t, scope="distributed", job_id="train-42")``).

        Raises:
            ValueError: no anchor, an unknown record id, a record whose time is not ``at_ns``, a bad
                scope, window or limit.
            TypeError: an unknown keyword.
        """
        f = replace(filters or CorrelationFilter(), **fields)
        rows = self.query_events()
        anchor = anchor_for(f, rows)
        evidence = event_evidence(rows)
        evidence += marker_evidence([(src, s) for src, sessions in self._loaded() for s in sessions])
        evidence += oom_evidence(self.list_oom_bundles(), {s.session_id: s for s in self._catalog.sessions})
        evidence += diagnose_evidence([(src.path, src.manifest, src.fact["diagnose"]["summary"])
                                       for src in self._catalog.sources if src.kind == "diagnose_bundle"
                                       and (src.fact.get("diagnose") or {}).get("summary") is not None])
        for src in self._catalog.sources:
            rollup = read_rollups(src)
            if rollup is not None:
                evidence += rollup_evidence(src.path, rollup)
        evidence += attachment_evidence(self._attachment_items())
        return CorrelationResult(anchor, ranked(evidence, anchor, f), [str(w) for w in self.warnings])

    def list_issues(self, filters: IssueFilter | None = None, *, state_overrides: Mapping[str, str] | None = None,
                    **fields: Any) -> list[IssueRow]:
        """Recurring issues grouped by fingerprint, worst severity first, then latest seen (as
        Stormlog's ``list_issues``): OOM bundles and OOM events (``oom``), collector degradation
        events, alert events, hidden-memory anomalies of each session's gaps. ``state_overrides``
        maps fingerprint ids to a state (default ``open``).

        Raises:
            ValueError: a state override that is not one of :data:`ISSUE_STATES`.
            TypeError: an unknown keyword.
        """
        f = replace(filters or IssueFilter(), **fields)
        states = {}
        for fid, state in (state_overrides or {}).items():
            norm = state.strip().lower()
            if norm not in ISSUE_STATES:
                raise ValueError(f"unsupported issue state: {state}")
            states[fid] = norm
        builder = IssueBuilder()
        for oom in self.list_oom_bundles():
            builder.oom_bundle(oom)
        for row in self.query_events():
            builder.event(row)
        for source, sessions in self._loaded():
            for loaded in sessions:
                path = loaded.sources_loaded[0] if loaded.sources_loaded else source.path
                builder.hidden_memory(loaded.events, path, source.kind)
        rows = [IssueRow(**r) for r in builder.rows(states)]
        return [r for r in rows if all(want is None or got == want for want, got in (
            (f.fingerprint_id, r.fingerprint_id), (f.kind, r.kind), (f.state, r.state), (f.severity, r.severity)))
            and (f.session_id is None or f.session_id in r.affected_sessions)]


def _merge(filters: Any, *pairs: tuple[str, Any]) -> list[Any]:
    """Each keyword's value, else the filter object's field of that name."""
    return [value if value is not None else getattr(filters, name, None) for name, value in pairs]


def default_cache_dir(paths: Sequence[str | os.PathLike[str]] = ()) -> str:
    """The user's cache folder for the catalog: ``$XDG_CACHE_HOME/traceml/catalog`` (default
    ``~/.cache/traceml/catalog``). Never beside the inputs: the catalog writes nothing next to the
    paths it reads (``paths`` is accepted for older callers and not used)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "traceml", "catalog")


def check_cache_dir(cache_dir: str | os.PathLike[str], roots: Iterable[str]) -> None:
    """Raise :class:`CacheFolderError` when ``cache_dir`` lies inside one of ``roots`` (real paths)."""
    real = os.path.realpath(os.fspath(cache_dir))
    for root in roots:
        if inside(real, root):
            raise CacheFolderError(f"cache folder {real} is inside {root}; the catalog never writes inside a "
                                   "root (pass another cache folder)")


def open_catalog(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CatalogStore:
    """Discover ``paths`` (files or folders) and build the store (DESIGN §5; 004 seed).

    Args:
        paths: folders to walk and files to read; one path may be given bare.
        cache_dir: a folder for the parse cache (``catalog-facts.msgpack``), or None (default) to
            read every file. Nothing is written anywhere else.

    Returns:
        A :class:`CatalogStore`. Bad input never raises: see :attr:`CatalogStore.warnings`.

    Raises:
        CacheFolderError: ``cache_dir`` lies inside one of the folders given, or inside the folder
            holding a file given.

    Example::

        store = traceml_ai.catalog.open(["./artifacts"])
        for run in store.list_runs(job_id="train-42"):
            print(run.run_id, run.session_count, run.ranks)
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if cache_dir is not None:
        roots = [os.path.realpath(os.path.expanduser(os.fspath(p))) for p in paths]
        # a file given: the folder holding it (the cache is never written beside a file read)
        check_cache_dir(cache_dir, [r if os.path.isdir(r) else os.path.dirname(r) for r in roots
                                    if os.path.exists(r)])
    # Loading the cache and discovery make ~100 objects per session and free none of them: the
    # cyclic collector would walk them again and again (a third of the time on 10,000 sessions).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        cache = FactCache(cache_dir)
        found = discover(paths, cache)
        catalog = build(found)
        cache.save()
    finally:
        if was_enabled:
            gc.enable()
    return CatalogStore(catalog, found.roots, cache.hits, cache.misses, found.unread)
