"""The viewer's state between HTTP requests: the run store, change versions, live polling, hidden
runs and the cache folder (DESIGN §4; 003 seed, "Live refresh").

Versions: every poll that changes something bumps :attr:`Viewer.version` and stamps the changed runs
with it, so a page holding version ``v`` asks only for runs changed after ``v`` and never downloads
what it has. Polling runs only while at least one page holds an events stream open: unfinished runs
every ``refresh_interval_seconds``; finished runs only on Refresh.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceml_ai.runs.column_index import ColumnIndex, bounded_default
from traceml_ai.runs.filters import FilterError, filter_runs, parse_filter_arg, parse_statuses
from traceml_ai.runs.layout import TAIL_FIRST_FILES, VIEWABLE_FILES
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import BestValue, MetricValue, RunSummary, Scalar
from traceml_ai.runs.status import run_duration
from traceml_ai.runs.store import NotFoundError, PollResult, RunStore
from traceml_ai.runs.table import (
    ColumnError,
    ColumnFacts,
    SortKey,
    differing_config_keys,
    group_runs,
    parse_sort_arg,
    sort_runs,
    validate_column,
    warm_name_keys,
)
from traceml_ai.runs.writer import iso_utc
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.catalog_view import CATALOG_COLUMN, CatalogView
from traceml_ai.ui.perf import join_perf, perf_index
from traceml_ai.ui.warm import bulk_load, collector_paused

log = logging.getLogger("traceml.ui")

MAX_SERIES_RUNS = 30
"""At most this many runs are drawn as lines (``POST /api/series`` without ``group_by``)."""
MAX_GROUP_RUNS = 2000
"""With ``group_by`` (Plot by groups) the group means and bands cover up to this many runs; the
per-run ``series`` of the answer are those of the first :data:`MAX_SERIES_RUNS` only. The chart
export's limit, :data:`traceml_ai.runs.analysis.MAX_GROUP_LINE_RUNS`, is the same (not imported:
analysis loads numpy, which the viewer's start does not)."""
FREEZE_AFTER_ROWS = 50_000
"""A history load that adds this many rows or more is followed by ``gc.freeze()`` (:meth:`Viewer.history`)."""
MAX_FILE_BYTES = 2 * 1024 * 1024
DB_SAVE_EVERY_S = 10.0
RUNS_CHUNK = 2000
"""Rows per line of a streamed listing (``GET /api/runs?stream=1``): ~3 MB of JSON, which the page
parses in a few tens of milliseconds, so the tab never freezes while 100,000 runs arrive."""
MAX_FIRST_ROWS = 500
"""At most this many rows come with a table answer (``GET /api/table?rows=N``)."""


class RequestError(ValueError):
    """A bad request from the page: one line, HTTP 400."""


END_OF_STREAM = -1
"""Put into an events queue: the stream ends (see :meth:`Viewer.end_streams`)."""


@dataclass
class _Listeners:
    queues: set[asyncio.Queue[int]] = field(default_factory=set)
    loop: asyncio.AbstractEventLoop | None = None


class Viewer:
    """Everything the API serves, over one :class:`RunStore`.

    Args:
        store: the run store (not yet polled, or seeded from the run database).
        cache: the cache folder, or None to write nothing (tests, read-only media).
        refresh_interval_seconds: poll period for unfinished runs while a page is connected.
        max_points_per_series: downsampling budget per plotted series.
    """

    def __init__(
        self,
        store: RunStore,
        cache: CacheFolder | None,
        *,
        refresh_interval_seconds: float = 5.0,
        max_points_per_series: int = 5000,
    ) -> None:
        self.store = store
        self.cache = cache
        self.refresh_interval_seconds = refresh_interval_seconds
        self.max_points = max_points_per_series
        self.version = 0
        self.changed_at: dict[str, int] = {}
        self.removed_at: dict[str, int] = {}
        self.refreshed_at: float | None = None
        self.hidden: set[str] = set(cache.hidden_runs()) if cache is not None else set()
        self._listeners = _Listeners()
        self._lock = threading.RLock()
        self._series_cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        # GET /api/table answers and column facts of the current version (each page load and every
        # filter change asks; with 10,000 runs the column facts alone are a tenth of a second).
        self._tables: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._facts: dict[tuple[int, bool], ColumnFacts] = {}
        self._differing: dict[tuple[Any, ...], list[str]] = {}
        self._columns = ColumnIndex()  # column facts re-computed for changed runs only (issue 16)
        self._columns_hidden = ColumnIndex()  # (the same with hidden runs shown)
        self._db_dirty = False
        self._db_changed: set[str] = set()  # runs changed since the run database was last written
        self._db_saved_at = 0.0
        # The run catalog over the same roots: the catalog_run column and run attachments.
        self.catalog = CatalogView(store.roots, cache.path if cache is not None else None)
        # The perf.* columns of captured runs, read from their final summaries (ui/perf.py).
        self.perf = perf_index()
        self._joined_membership = -1  # the store's membership at the last full join of perf facts

    # -- updating --------------------------------------------------------------------------

    def start(self) -> None:
        """Fill from the run database (when there is one) so the first page has rows at once."""
        if self.cache is None:
            return
        with bulk_load():
            try:
                loaded = self.cache.load_run_db()
            except Exception as err:
                log.warning("[TraceML] run database not used: %s", err)
                return
            if loaded is None:
                return
            stored = {key: cached.summary.display_status for key, cached in loaded.runs.items()}
            taken = self.store.seed(dict(loaded.runs))
            if taken:
                # The column index saved with these runs: the first facts then read only the runs
                # the store holds otherwise (issue 16; a missing or bad state builds it instead).
                self._columns = ColumnIndex.primed([c.summary for c in loaded.runs.values()], loaded.column_state)
            if taken:
                runs = self.store.runs()
                self._bump([r.key for r in runs], [])
                # What the database holds needs no rewrite, except the display statuses that moved
                # on since it was written (a running run that went stale).
                self._db_changed = {r.key for r in runs if stored.get(r.key) != r.display_status}
                # The column facts of the first table, in the block: the index's per-run entries
                # live as long as the runs, and left to the collector they cost a full collection
                # over the whole heap right after the first answer (0.4 s at 100,000 runs).
                self._facts_of(self.version, False, self._visible(runs, False))

    def poll(self, *, refresh: bool = False) -> PollResult:
        """One poll (or a Refresh) of the store; records versions and wakes the event streams."""
        if self.refreshed_at is None:  # the first poll: a full scan without a run database
            with bulk_load():
                result = self.store.refresh() if refresh else self.store.poll()
                # The names' sort keys, long-lived, in the block: the first sort by name (or by a
                # metric whose ties the name breaks) then costs what the next ones do.
                warm_name_keys(self.store.runs())
                # The finished runs as a start from the run database holds them (their parsed
                # files out of memory: 200 MB after a first scan of 100,000 runs).
                self.store.forget_parse_state()
        else:
            result = self.store.refresh() if refresh else self.store.poll()
        # A poll that left the run set alone costs what may have changed (issue 16): the perf facts
        # of unfinished and pending runs only, and no catalog work until the catalog is due.
        membership = self.store.membership
        same_runs = not refresh and membership == self._joined_membership
        if same_runs:
            perf_changed = join_perf(self.store, self.perf, only=[*self.store.unfinished(), *self.perf.pending()])
        else:
            perf_changed = join_perf(self.store, self.perf, force=refresh)
            self._joined_membership = membership
        with self._lock:
            self.refreshed_at = time.time()
            changed = list(dict.fromkeys([*result.changed, *perf_changed]))
            if changed or result.removed:
                self._bump(changed, result.removed)
        # After the runs' own changes are out: the catalog walks every folder (docs/catalog.md).
        regrouped: list[str] = []
        if not same_runs or self.catalog.stale():
            regrouped = self.catalog.refresh(self.store.runs(), force=refresh)
            if regrouped:
                self._bump(regrouped, [])
        if not (changed or result.removed or regrouped):
            self._wake(self.version)  # nothing changed: the streams still say "polled" ("Refreshed … ago")
        self._save_db_if_due(force=False)
        return result

    def _bump(self, changed: Sequence[str], removed: Sequence[str]) -> None:
        with self._lock:
            self.version += 1
            for key in changed:
                self.changed_at[key] = self.version
                self.removed_at.pop(key, None)
            for key in removed:
                self.removed_at[key] = self.version
                self.changed_at.pop(key, None)
            self._db_changed.update(changed)
            self._db_dirty = True
            version = self.version
        self._wake(version)

    def _wake(self, version: int) -> None:
        for queue in list(self._listeners.queues):
            queue.put_nowait(version)

    def _save_db_if_due(self, *, force: bool) -> None:
        """Write runs.sqlite at most every 10 s while runs change (003 seed, "Live refresh")."""
        if self.cache is None or not self._db_dirty:
            return
        now = time.monotonic()
        if not force and now - self._db_saved_at < DB_SAVE_EVERY_S:
            return
        with self._lock:
            changed = set(self._db_changed)
            version = self.version
        try:
            self.cache.save_run_db(self.store.runs(), self.store.stamps(), force=True, changed=changed,
                                   columns=self._columns)
        except Exception as err:
            log.warning("[TraceML] could not save the run database: %s", err)
            return
        with self._lock:
            self._db_changed -= changed
            self._db_dirty = bool(self._db_changed) or self.version != version  # (a run removed meanwhile)
        self._db_saved_at = now

    def close(self) -> None:
        """Write the run database one last time (on shutdown)."""
        self._save_db_if_due(force=True)

    async def poll_loop(self) -> None:
        """Poll unfinished runs every ``refresh_interval_seconds`` while a page is connected."""
        while True:
            await asyncio.sleep(self.refresh_interval_seconds)
            if self._listeners.queues:
                try:
                    await asyncio.to_thread(self.poll)
                except Exception as err:
                    log.warning("[TraceML] poll failed: %s", err)

    def subscribe(self) -> asyncio.Queue[int]:
        """An events stream opened: returns the queue that receives new versions."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        self._listeners.loop = asyncio.get_running_loop()
        self._listeners.queues.add(queue)
        return queue

    def end_streams(self) -> None:
        """The server is stopping (Ctrl+C): every open events stream receives ``END_OF_STREAM`` and
        ends, so the server need not wait for the pages to go away. Safe from a signal handler."""
        loop = self._listeners.loop
        if loop is None or loop.is_closed():
            return
        for queue in list(self._listeners.queues):
            loop.call_soon_threadsafe(queue.put_nowait, END_OF_STREAM)

    def unsubscribe(self, queue: asyncio.Queue[int]) -> None:
        """An events stream closed."""
        self._listeners.queues.discard(queue)

    @property
    def connected(self) -> int:
        """How many event streams are open."""
        return len(self._listeners.queues)

    # -- reading ---------------------------------------------------------------------------

    def runs_payload(self, since: int = 0) -> dict[str, Any]:
        """``GET /api/runs`` (docs/viewer-api.md)."""
        with self._lock:
            header, changed = self._runs_header(since)
            return {**header, "runs": [self._row(r) for r in changed]}

    def runs_chunks(self, since: int = 0, size: int | None = None) -> Iterator[dict[str, Any]]:
        """``GET /api/runs?stream=1`` (docs/viewer-api.md, "Streamed listing"): the answer of
        :meth:`runs_payload` as objects to send one per line: first the header (every field but
        ``runs``, plus ``count``, the number of rows that follow), then ``{"runs": [...]}`` with at
        most ``size`` rows each (default :data:`RUNS_CHUNK`), then ``{"end": true, "count": n}``.

        The runs are those of the version the header names, taken when the first object is made;
        each chunk's rows are made from the runs as they are when it is made, so a run that
        changed in between comes newer than that version (the next ``since=version`` lists it
        again). The viewer's lock is held one chunk at a time: a poll or a table answer never waits
        for a whole listing (100,000 runs: ~1.2 s of rows, 165 MB of JSON). Nothing holds more than
        a chunk of rows, which is what keeps the server's memory flat while a page opens.
        """
        with self._lock:
            header, changed = self._runs_header(since)
        yield {**header, "count": len(changed)}
        size = size or RUNS_CHUNK
        for start in range(0, len(changed), size):
            with self._lock:
                rows = [self._row(r) for r in changed[start : start + size]]
            yield {"runs": rows}
        yield {"end": True, "count": len(changed)}

    def rows_of(self, keys: Sequence[str]) -> list[RunRow]:
        """The rows (as ``GET /api/runs`` lists them) of the runs of ``keys`` the store holds, in
        that order; unknown keys are left out."""
        with self._lock:
            found = (self.store.get(k) for k in keys)
            return [self._row(r) for r in found if r is not None]

    def _runs_header(self, since: int) -> tuple[dict[str, Any], list[RunSummary]]:
        """Everything of a ``GET /api/runs`` answer but its rows, and the runs to list (under the lock)."""
        runs = self.store.runs()
        full = since <= 0 or since > self.version
        if full:
            changed = runs
            removed: list[str] = []
        else:
            changed = [r for r in runs if self.changed_at.get(r.key, 0) > since]
            removed = [k for k, v in self.removed_at.items() if v > since]
        counts: dict[str, int] = {}
        for run in runs:
            counts[run.root] = counts.get(run.root, 0) + 1
        roots = [{"path": r, "count": counts.get(r, 0), "missing": False} for r in self._real_roots()]
        roots += [{"path": r, "count": 0, "missing": True} for r in self._missing_roots()]
        header = {
            "version": self.version,
            "full": full,
            "removed": removed,
            "hidden": sorted(self.hidden),
            "roots": roots,
            "warnings": list(self.store.warnings) + (list(self.cache.warnings) if self.cache else [])
            + self.catalog.global_warnings,
            "refreshed_at": iso_utc(self.refreshed_at) if self.refreshed_at else None,
            "refresh_interval_seconds": self.refresh_interval_seconds,
            "stale_after_seconds": self.store.stale_after_seconds,
        }
        return header, changed

    def _row(self, run: RunSummary) -> RunRow:
        """``run_row`` with the catalog run and the catalog's warnings about the run folder."""
        row = run_row(run)
        row.catalog_run = self.catalog.run_of(run.key)
        extra = self.catalog.warnings_of(run.key)
        perf_warning = self.perf.warning(run.key) if run.perf else None
        if perf_warning:
            extra = [*extra, perf_warning]
        if extra:
            row.warnings = [*row.warnings, *extra]
        return row

    def _real_roots(self) -> list[str]:
        from traceml_ai.runs.discovery import resolve_roots

        return resolve_roots(self.store.roots)[0]

    def _missing_roots(self) -> list[str]:
        from traceml_ai.runs.discovery import resolve_roots

        return resolve_roots(self.store.roots)[1]

    def table_payload(
        self,
        *,
        filters: Sequence[str] = (),
        sorts: Sequence[str] = (),
        group: str | None = None,
        search: str | None = None,
        status: str | None = None,
        columns: Sequence[str] | None = None,
        show_hidden: bool = False,
    ) -> dict[str, Any]:
        """``GET /api/table``: the table model applied in Python (docs/viewer-api.md). Answers are
        kept for the current version (the same question gets the same answer until a run changes)."""
        version = self.version
        query = (version, tuple(filters), tuple(sorts), group, search, status,
                 None if columns is None else tuple(columns), show_hidden)
        hit = self._tables.get(query)
        if hit is not None:
            return hit
        with collector_paused():
            answer = self._table_payload(version, filters, sorts, group, search, status, columns, show_hidden)
        if any(k[0] != version for k in self._tables) or len(self._tables) >= 32:
            self._tables = {}
        self._tables[query] = answer
        return answer

    def _table_payload(
        self,
        version: int,
        filters: Sequence[str],
        sorts: Sequence[str],
        group: str | None,
        search: str | None,
        status: str | None,
        columns: Sequence[str] | None,
        show_hidden: bool,
    ) -> dict[str, Any]:
        visible = self._visible(self.store.runs(), show_hidden)
        error: str | None = None
        shown = visible
        groups_out: list[dict[str, Any]] | None = None
        try:
            # A bad filter is reported and left out; the other filters, the search and the status
            # segment still apply (the page shows the error beside the table).
            parsed = []
            problems = []
            catalog_filters = []
            for expr in filters:
                if not expr.strip():
                    continue
                try:
                    if self.catalog.is_filter(expr):
                        catalog_filters.append(self.catalog.parse_filter(expr))
                        continue
                    parsed.append(parse_filter_arg(expr))
                except (FilterError, ColumnError) as err:
                    problems.append(str(err))
            statuses = parse_statuses(s for s in status.split(",") if s.strip()) if status else None
            keys = [_sort_key(s) for s in sorts if s.strip()] or [parse_sort_arg("-started")]
            numeric = self._facts_of(version, show_hidden, visible).numeric  # (kept per version)
            try:
                matched = filter_runs(visible, parsed, search=search or None, statuses=statuses, numeric=numeric)
            except FilterError:
                # A filter that only the values can refuse (`>abc` on a column of numbers): find it,
                # report it and leave it out like the others; never fall back to every run.
                kept = []
                for one in parsed:
                    try:
                        filter_runs(visible, [one], numeric=numeric)
                    except FilterError as err:
                        problems.append(str(err))
                    else:
                        kept.append(one)
                matched = filter_runs(visible, kept, search=search or None, statuses=statuses, numeric=numeric)
            error = "; ".join(problems) or None
            shown = self.catalog.sort(self.catalog.filter(matched, catalog_filters), keys)
            if group:
                groups = self.catalog.group(shown) if group == CATALOG_COLUMN else group_runs(
                    shown, validate_column(group))
                shown = [r for g in groups for r in g.runs]
                groups_out = [
                    {"label": g.label, "keys": [r.key for r in g.runs], "color": i} for i, g in enumerate(groups)
                ]
        except (FilterError, ColumnError) as err:
            error = str(err)
            shown = sort_runs(visible, [parse_sort_arg("-started")])
        facts = self._facts_of(version, show_hidden, visible)
        available, numeric = facts.available, facts.numeric
        available, defaults = self.catalog.columns(available, bounded_default(facts.default))
        chosen: list[str] = []
        for c in columns or defaults:
            try:
                chosen.append(c if c == CATALOG_COLUMN else validate_column(c))
            except ColumnError:
                continue
        return {
            "version": version,
            "keys": [r.key for r in shown],
            "total": len(visible),
            "shown": len(shown),
            "groups": groups_out,
            "columns": {
                "available": available,
                "default": defaults,
                "numeric": [c for c in available if c in numeric],
                "shown": chosen,
            },
            # Always sent: the page's "differing params only" toggle needs no second request.
            "differing": self._differing_of(shown, (version, tuple(filters), search, status, show_hidden, error),
                                            facts),
            "error": error,
        }

    def _visible(self, runs: list[RunSummary], show_hidden: bool) -> list[RunSummary]:
        return runs if show_hidden else [r for r in runs if r.key not in self.hidden]

    def _facts_of(self, version: int, show_hidden: bool, visible: Sequence[RunSummary]) -> ColumnFacts:
        """The column facts of ``visible`` at ``version``, kept for that version."""
        facts = self._facts.get((version, show_hidden))
        if facts is None:
            facts = (self._columns_hidden if show_hidden else self._columns).facts(visible)
            self._facts = {k: v for k, v in self._facts.items() if k[0] == version}
            self._facts[(version, show_hidden)] = facts
        return facts

    def _differing_of(self, shown: Sequence[RunSummary], rows: tuple[Any, ...], facts: ColumnFacts) -> list[str]:
        """The "differing params only" columns of ``shown``; kept per version and row question
        (filters, search, status, hidden), which decide the set of rows: a new sort or grouping of
        the same rows does not walk every run's params again (100,000 runs: a tenth of a second).
        Every visible run shown (no filter, search or status): the column facts know them, kept
        up to date run by run (issue 16: after each change a walk of 100,000 runs took 0.35 s)."""
        _version, filters, search, status, _hidden, error = rows
        if not (error or search or status or any(f.strip() for f in filters)):
            return [f"config.{k}" for k in facts.differing]
        hit = self._differing.get(rows)
        if hit is None:
            hit = [f"config.{k}" for k in differing_config_keys(shown)]
            if any(k[0] != rows[0] for k in self._differing) or len(self._differing) >= 32:
                self._differing = {}
            self._differing[rows] = hit
        return hit

    def remembered_table_payload(self) -> dict[str, Any]:
        """``GET /api/table?remembered=1``: the answer to the remembered view's question, with that
        question in ``query`` (see :func:`remembered_query`)."""
        query = remembered_query(self.cache.load_ui_state() if self.cache is not None else {})
        answer = self.table_payload(
            filters=query["filters"],
            sorts=query["sort"],
            group=query["group"],
            search=query["search"] or None,
            status=",".join(query["status"]) or None,
            columns=query["columns"],
            show_hidden=query["show_hidden"],
        )
        return {**answer, "query": query}

    def series_payload(self, keys: Sequence[str], metrics: Sequence[str], x: str, ema_weight: float,
                       x_range: tuple[float, float] | None = None,
                       group_by: str | None = None) -> dict[str, Any]:
        """``POST /api/series``: downsampled series of up to 30 runs (docs/viewer-api.md); with
        ``x_range`` (a zoomed chart) the buckets cover only that range of x. With ``group_by``
        (Plot by groups) also ``groups``: per metric and group of that column, the mean, min, max,
        population std and n_runs by step over the full histories of every run asked for (up to
        :data:`MAX_GROUP_RUNS`; the function the PNG/CSV export uses,
        :func:`~traceml_ai.runs.analysis.line_groups`), then downsampled for drawing; ``series``
        then holds the first :data:`MAX_SERIES_RUNS` runs only (the page draws the groups).

        Raises:
            RequestError: too many runs, an unknown x axis, a bad EMA weight, x range or group column.
        """
        if x_range is not None and not (math.isfinite(x_range[0]) and math.isfinite(x_range[1])
                                        and x_range[0] < x_range[1]):
            raise RequestError(f"x_range must be two finite numbers, low then high, got {list(x_range)}")
        if group_by is None and len(keys) > MAX_SERIES_RUNS:
            raise RequestError(f"at most {MAX_SERIES_RUNS} runs can be plotted at once, got {len(keys)}")
        if len(keys) > MAX_GROUP_RUNS:
            raise RequestError(f"at most {MAX_GROUP_RUNS} runs can be averaged by group at once, got {len(keys)}")
        if x not in ("step", "epoch", "time"):
            raise RequestError(f"x must be step, epoch or time, got {x!r}")
        if not (0.0 <= ema_weight < 1.0) or math.isnan(ema_weight):
            raise RequestError(f"ema must be in [0, 1), got {ema_weight}")
        if group_by is not None:
            if x != "step":
                raise RequestError(f"group means are taken step by step: x must be step with group_by, got {x!r}")
            try:
                group_by = validate_column(group_by)
            except ColumnError as err:
                raise RequestError(f"group_by: {err}") from None
        from traceml_ai.runs.analysis import time_axis_label, time_origin  # numpy: on the first chart, not at start

        out: list[dict[str, Any]] = []
        warnings: dict[str, list[str]] = {}
        origins: list[str] = []
        histories: list[tuple[RunSummary, MetricsTail]] = []
        for key in keys:
            run = self.store.get(key)
            if run is None:
                continue
            try:
                tail = self.history(key)
            except NotFoundError:
                continue  # removed since the check above: like an unknown key
            histories.append((run, tail))
            if tail.warnings:
                warnings[key] = tail.warnings
            if len(histories) > MAX_SERIES_RUNS:
                continue  # Plot by groups: in the group means only
            # No catch-all here: a bug while building a series is a logged HTTP 500, not a plausible
            # "could not be plotted" (the tail reader already turns bad files into warnings).
            points = [self._one_series(key, tail, metric, x, ema_weight, x_range) for metric in metrics]
            origins.append(points[0]["time_origin"] if points else time_origin(self.store.get(key), tail)[1])
            out.extend(points)
        # The wall-time axis label: time since each run's started_at (first logged row without one).
        time_label = time_axis_label(origins) if x == "time" else None  # type: ignore[arg-type]
        answer: dict[str, Any] = {"version": self.version, "series": out, "warnings": warnings,
                                  "time_label": time_label}
        if group_by is not None:
            answer["groups"] = [g for metric in metrics
                                for g in self._group_series(histories, metric, group_by, x_range)]
        return answer

    def _group_series(self, histories: Sequence[tuple[RunSummary, MetricsTail]], metric: str, group_by: str,
                      x_range: tuple[float, float] | None) -> list[dict[str, Any]]:
        """The groups of ``metric`` for Plot by groups: mean and band over the full histories, then
        downsampled (:func:`~traceml_ai.runs.analysis.group_points`); kept per version and rows."""
        from traceml_ai.runs.analysis import group_points, line_groups

        cache_key = ("groups", self.version, metric, group_by, x_range, self.max_points,
                     tuple((run.key, len(tail.rows), tail.resets) for run, tail in histories))
        hit = self._series_cache.get(cache_key)
        if hit is not None:
            return hit["groups"]  # type: ignore[no-any-return]
        items = []
        for mean in line_groups(histories, metric, group_by):
            points = group_points(mean, self.max_points, x_range)
            g = points.group
            items.append({
                "metric": metric,
                "label": g.label,
                "keys": list(g.keys),
                "step": g.step.tolist(),
                "mean": g.mean.tolist(),
                "min": g.min.tolist(),
                "max": g.max.tolist(),
                "std": g.std.tolist(),
                "n_runs": g.n_runs.tolist(),
                "raw_points": points.raw_points,
                "downsampled": points.downsampled,
            })
        if len(self._series_cache) > 512:
            self._series_cache.clear()
        self._series_cache[cache_key] = {"groups": items}
        return items

    def history(self, key: str) -> MetricsTail:
        """:meth:`RunStore.history`, and after a load of many rows (:data:`FREEZE_AFTER_ROWS`) the
        objects alive then are moved out of the garbage collector's way (``gc.collect()`` once, then
        ``gc.freeze()``): a 200,000-row history is long-lived, and without this every later full
        collection walks it again, which a re-poll pays (issue 15, item 24). Frozen objects are still
        freed when their last reference goes (a history's rows hold no reference cycles).

        Raises:
            NotFoundError: unknown run.
        """
        before = self.store.loaded_rows(key)
        tail = self.store.history(key)
        if len(tail.rows) - before >= FREEZE_AFTER_ROWS:
            gc.collect()  # what is garbage now is freed, not frozen
            gc.freeze()
        return tail

    def _one_series(self, key: str, tail: Any, metric: str, x: str, weight: float,
                    x_range: tuple[float, float] | None = None) -> dict[str, Any]:
        from traceml_ai.runs.analysis import line_points, time_origin

        rows = len(tail.rows)
        t0, origin = time_origin(self.store.get(key), tail)
        cache_key = (key, metric, x, weight, rows, tail.resets, self.max_points, t0, x_range)
        hit = self._series_cache.get(cache_key)
        if hit is not None:
            return hit
        # The same points the PNG export draws: EMA over the full history, then min/max buckets.
        points = line_points(tail.series(metric), x, weight, self.max_points, t0, x_range)  # type: ignore[arg-type]
        item = {
            "key": key,
            "metric": metric,
            "x": points.x.tolist(),
            "y": points.y.tolist(),
            "smoothed": points.smoothed.tolist() if points.smoothed is not None else None,
            "raw_points": points.raw_points,
            "downsampled": points.downsampled,
            "time_origin": origin,
        }
        if len(self._series_cache) > 512:
            self._series_cache.clear()
        self._series_cache[cache_key] = item
        return item

    def details_payload(self, key: str) -> dict[str, Any]:
        """``GET /api/run``: the inspector's data. Raises NotFoundError for an unknown run."""
        if self.store.get(key) is None:
            raise NotFoundError(f"no run {key!r}")
        self.history(key)  # so history warnings (corrupt lines) are part of the summary
        details = self.store.details(key)
        error = details.summary.error
        return {
            "run": self._row(details.summary),
            "config": details.config,
            "run_json": details.summary.run_json,
            "traceback": error.get("traceback") if error else None,
            "files": details.files,
        }

    def file_text(self, key: str, name: str) -> str:
        """``GET /api/file``: one of the viewable files as text (at most 2 MB; ``logs/run.log``, a
        log, its last 2 MB, from a whole line). NotFoundError when the run or the name is not known."""
        if name not in VIEWABLE_FILES:
            raise NotFoundError(f"{name!r} is not a viewable file")
        tail = name in TAIL_FIRST_FILES
        data, size = self.store.read_file(key, name, MAX_FILE_BYTES, tail=tail)
        if tail and size > len(data):
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else data  # start at a whole line
            text = data.decode("utf-8", errors="replace")
            return f"[TraceML: showing the last {len(data):,} of {size:,} bytes]\n…\n" + text
        text = data.decode("utf-8", errors="replace")
        if size > len(data):
            text += f"\n… [TraceML: showing the first {len(data):,} of {size:,} bytes]\n"
        return text

    def set_hidden(self, keys: Sequence[str], hidden: bool) -> list[str]:
        """``POST /api/hide``; hidden runs are remembered in the cache folder."""
        with self._lock:
            if self.cache is not None:
                self.hidden = set(self.cache.set_hidden(keys, hidden))
            elif hidden:
                self.hidden |= set(keys)
            else:
                self.hidden -= set(keys)
            self._bump([k for k in keys if self.store.get(k) is not None], [])
            return sorted(self.hidden)

    def export_chart(self, spec: Any, fmt: str) -> str:
        """``POST /api/export/chart``: the chart's data as CSV, or a 300-DPI PNG, in the cache folder."""
        if self.cache is None:
            raise RequestError("this viewer has no cache folder to write exports into")
        runs = self.runs_by_keys(list(spec.keys))
        histories = [(run, self.history(run.key)) for run in runs] if spec.kind == "line" else []
        return self.cache.export_chart(spec, runs, histories, fmt=fmt, max_points=self.max_points)  # type: ignore[arg-type]

    def runs_by_keys(self, keys: Sequence[str]) -> list[RunSummary]:
        """The known runs among ``keys``, in that order."""
        out = []
        for key in keys:
            run = self.store.get(key)
            if run is not None:
                out.append(run)
        return out


def _sort_key(arg: str) -> SortKey:
    """``parse_sort_arg`` that also knows the catalog column."""
    text = arg.strip()
    for form, descending in ((f"-{CATALOG_COLUMN}", True), (f"+{CATALOG_COLUMN}", False), (CATALOG_COLUMN, False),
                             (f"{CATALOG_COLUMN}:desc", True), (f"{CATALOG_COLUMN}:asc", False)):
        if text == form:
            return SortKey(CATALOG_COLUMN, descending)
    return parse_sort_arg(arg)


STATUS_SEGMENTS = ("all", "running", "stale", "completed", "failed", "killed", "legacy")
"""The page's status segments (web/src/store.ts); ``running`` also shows ``running?``."""


def remembered_query(state: Any) -> dict[str, Any]:
    """The table question of a remembered view (``ui-state.json``): the page's ``parseUiState`` and
    ``currentTableQuery`` (web/src/store.ts, web/src/actions.ts) in Python, so that the page can
    preload the answer before its script runs (``GET /api/table?remembered=1``).

    Returns ``{"filters": ["COL:EXPR", ...], "sort": [...], "group": str|None, "search": str,
    "status": [...], "columns": [...]|None, "show_hidden": bool}``; a field the page would not
    accept gets its default, as the page does.
    """
    ui = state if isinstance(state, dict) else {}

    def strings(value: Any) -> list[str] | None:
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None

    filters = ui.get("filters")
    segment = ui.get("status")
    if segment not in STATUS_SEGMENTS:
        segment = "all"
    group = ui.get("group")
    search = ui.get("search")
    columns = strings(ui.get("columns"))
    hidden = ui.get("showHidden")
    return {
        "filters": [
            f"{f['column']}:{f['expr']}"
            for f in (filters if isinstance(filters, list) else [])
            if isinstance(f, dict) and isinstance(f.get("column"), str) and isinstance(f.get("expr"), str)
        ],
        "sort": strings(ui.get("sort")) or [],
        "group": group if isinstance(group, str) and group else None,
        "search": search.strip() if isinstance(search, str) else "",
        "status": [] if segment == "all" else ["running", "running?"] if segment == "running" else [segment],
        # The page sends the chosen columns joined with commas, and the server splits them there.
        "columns": [c for c in ",".join(columns).split(",") if c] or None if columns else None,
        "show_hidden": hidden if isinstance(hidden, bool) else False,
    }


@dataclass(slots=True)
class RunRow:
    """A run as ``GET /api/runs`` sends it (docs/viewer-api.md, ``RunRow``); the fields in wire order.

    A slotted dataclass rather than a dict: orjson encodes it in C, and building 10,000 of them is
    a quarter of the cost of building the dicts (``best`` holds
    :class:`~traceml_ai.runs.model.BestValue` dataclasses, encoded the same way).
    """

    key: str
    id: str
    name: str
    group: str | None
    tags: list[str]
    notes: str
    status: str | None
    display_status: str
    legacy: bool
    started_at: str | None
    ended_at: str | None
    heartbeat_at: str | None
    duration_s: float | None
    step: int | None
    epoch: int | None
    path: str
    root: str
    warnings: list[str]
    error: dict[str, Any] | None
    params: dict[str, Scalar]
    start: dict[str, MetricValue]
    last: dict[str, MetricValue]
    best: dict[str, BestValue]
    summary: dict[str, Scalar]
    metric_names: list[str]
    perf: dict[str, Scalar]
    """The ``perf.*`` facts of a captured run (docs/viewer-api.md, "Performance columns"); ``{}``
    for a run that was not captured."""
    catalog_run: str | None = None
    """The run id of the catalog run holding this run folder's session (docs/catalog.md, "In the viewer")."""
    duration_derived: bool = False
    """True when ``duration_s`` is not run.json's but derived from its times (running: now −
    ``started_at``; stale: ``heartbeat_at`` − ``started_at``; finished: ``ended_at`` − ``started_at``)."""


def run_row(run: RunSummary) -> RunRow:
    """A RunSummary as the API's ``RunRow`` (docs/viewer-api.md). The summary's dicts are shared,
    not copied. NaN/inf become null when the response is encoded (orjson)."""
    error = run.error if run.exit else None
    duration, derived = run_duration(run, time.time())
    return RunRow(
        run.key,
        run.id,
        run.name,
        run.group,
        run.tags,
        run.notes,
        run.status,
        run.display_status,
        run.legacy,
        run.started_at,
        run.ended_at,
        run.heartbeat_at,
        duration,
        run.step,
        run.epoch,
        run.key,
        run.root,
        run.warnings,
        {k: error[k] for k in ("type", "message", "code", "signal")} if error else None,
        run.params,
        run.start,
        run.last,
        run.best,
        run.summary,
        run.metric_names,
        run.perf,
        duration_derived=derived,
    )
