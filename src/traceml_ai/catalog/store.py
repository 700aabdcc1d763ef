"""The query store: ``open(paths)`` → runs, attachments, sessions, warnings (004 seed, "Query API";
DESIGN §5), with the methods and rows of real Stormlog's ``stormlog.query.open()``.

Filters are Stormlog's filter objects and/or keyword arguments; each keyword takes one value or a
list of values (any of them matches), and several filters must all match. A value of the wrong
type (``rank="0"``, ``run_id=42``) raises TypeError rather than matching nothing. Rows come back in
Stormlog's order: runs and sessions latest start first, attachments by run, session, rank, kind
and title."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from traceml_ai.catalog.build import Catalog, build
from traceml_ai.catalog.cache import FactCache
from traceml_ai.catalog.discovery import discover
from traceml_ai.catalog.model import (
    AttachmentRow,
    CatalogWarning,
    RunAttachmentFilter,
    RunFilter,
    RunRow,
    SessionFilter,
    SessionRow,
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

    def list_oom_bundles(self) -> list[dict[str, Any]]:
        """The OOM bundles found (Stormlog's ``list_oom_bundles`` fields: ``bundle_path``,
        ``manifest_path``, ``created_at_utc``, ``backend``, ``reason``, ``event_count``,
        ``session_id``, ``session_status``, ``exception_type``, ``exception_module``), oldest first."""
        rows = [dict(b) for b in self._catalog.oom_bundles]
        rows.sort(key=lambda b: (b["created_at_utc"] or "", b["bundle_path"]))
        return rows

    def list_attachments(self) -> list[dict[str, Any]]:
        """Every item read from ``stormlog_attachments.json`` sidecars, before resolving its run
        (Stormlog's ``list_attachments``; ``path`` absolute, ``sidecar_path`` the file)."""
        rows = [dict(a) for a in self._catalog.sidecar_items]
        rows.sort(key=lambda a: (a["start_ns"] if a["start_ns"] is not None else -1, a["title"], a["sidecar_path"]))
        return rows


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
        CacheFolderError: ``cache_dir`` lies inside one of the paths.

    Example::

        store = traceml_ai.catalog.open(["./artifacts"])
        for run in store.list_runs(job_id="train-42"):
            print(run.run_id, run.session_count, run.ranks)
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if cache_dir is not None:
        roots = [os.path.realpath(os.path.expanduser(os.fspath(p))) for p in paths]
        check_cache_dir(cache_dir, [r for r in roots if os.path.isdir(r)])
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
