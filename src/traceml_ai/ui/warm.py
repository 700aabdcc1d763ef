"""A run store started from the run database, for one-shot commands (issue 16 item 2; 003 seed,
"The run database").

``traceml runs ls`` (and the other commands that list runs) start like the viewer does: when
``runs.sqlite`` in the cache folder is valid, the store is seeded from it and its first poll checks
only what changed since (the roots' listing against the cached runs, a finished run by its folder's
stamp, an unfinished one file by file); when it is missing, of another schema version or corrupt,
the poll is a full scan and the database is written again (rebuilt) from the result. Writing goes
through :class:`~traceml_ai.ui.cache.CacheFolder`, into the cache folder only, never into a root.

Light: imports no web framework.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from traceml_ai.runs.column_index import ColumnIndex
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache_paths import default_cache_dir

if TYPE_CHECKING:
    from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.perf import join_perf, perf_index


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (if it was on): a table answer over
    100,000 runs builds hundreds of thousands of short-lived tuples, and the collections they set
    off were half of its time (issue 16)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def bulk_load() -> Iterator[None]:
    """Build the run table without Python's cyclic garbage collector, then set what was built aside.

    Tens of thousands of new, acyclic objects (summaries, their dicts and lists): the collector
    would walk them again and again while they are built (about half of a 10,000-run scan) and at
    every full collection afterwards. It is paused for the block; after it, ``gc.freeze()`` moves
    every tracked object into the permanent generation, which later collections skip (the objects
    are still freed by reference counting when a run is re-read or removed; they hold no reference
    cycles). No collection runs first: at 100,000 runs it took 2.3 s; the price is that cyclic
    garbage already there at that moment (a few objects) is never collected.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


Progress = Callable[[int, int], None]
"""Told ``(runs read, runs listed)`` every few seconds while a full scan lasts."""
PROGRESS_FIRST_S: Final = 3.0
"""A scan that ends within this many seconds says nothing; a longer one says how far it is, then
every :data:`PROGRESS_EVERY_S` seconds."""
PROGRESS_EVERY_S: Final = 10.0


@contextmanager
def scan_progress(store: RunStore, progress: Progress | None) -> Iterator[None]:
    """Tell ``progress`` how far ``store``'s poll in the block is, from a thread, every
    :data:`PROGRESS_EVERY_S` seconds once it lasted :data:`PROGRESS_FIRST_S` (review 16c: a first
    scan of 100,000 runs from a cold disk said nothing for nine minutes)."""
    if progress is None:
        yield
        return
    done = threading.Event()

    def report() -> None:
        wait = PROGRESS_FIRST_S
        while not done.wait(wait):
            read, listed = store.progress
            try:
                if listed:
                    progress(read, listed)
            except Exception:  # (a closed stderr, say: the scan goes on without notes)
                return
            wait = PROGRESS_EVERY_S

    thread = threading.Thread(target=report, name="traceml-scan-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass
class WarmStart:
    """What :func:`open_warm` did.

    Attributes:
        store: the polled run store (``perf.*`` facts joined).
        from_db: how many runs came from ``runs.sqlite`` (0: a full scan).
        saved: the database path written, or None (nothing changed, or no cache folder).
        warnings: cache-folder problems, one line each (e.g. a corrupt database being rebuilt).
        perf_warnings: run key → the problem of its ``aggregator/final_summary.json`` (unusable:
            not JSON, too big, a newer schema), the line the viewer adds to the run's warnings.
        columns: the column index of the runs (:class:`~traceml_ai.runs.column_index.ColumnIndex`),
            primed from the database's saved state on a warm start: ``columns.facts(runs)`` then
            costs the runs that changed, not a walk over every params value (seconds at 100,000).
    """

    store: RunStore
    from_db: int = 0
    saved: str | None = None
    warnings: list[str] = field(default_factory=list)
    perf_warnings: dict[str, str] = field(default_factory=dict)
    columns: ColumnIndex = field(default_factory=ColumnIndex)


_DB_FILE: Final = "runs.sqlite"  # = traceml_ai.runs.rundb.DB_FILE, not imported: its decoder is msgspec
DB_MIN_RUNS: Final = 500
"""Without a cache folder, a one-shot command writes ``runs.sqlite`` for this many runs or more
(below it a full scan takes a fraction of a second)."""


def _cache_folder(folder: str, roots: Sequence[str], result: WarmStart) -> CacheFolder | None:
    from traceml_ai.ui.cache import CacheError, CacheFolder

    try:
        return CacheFolder(folder, roots=roots)
    except CacheError as err:
        result.warnings.append(f"run database not used: {err}")
        return None


def open_warm(
    roots: Sequence[str],
    *,
    cache_dir: str | None = None,
    use_db: bool = True,
    stale_after_seconds: float,
    max_metrics_file_mb: float,
    progress: Progress | None = None,
) -> WarmStart:
    """A run store over ``roots``, polled once, started from the run database when it is usable.

    Args:
        roots: the runs roots (as given).
        cache_dir: the ``cache_dir`` setting (None: :func:`~traceml_ai.ui.cache.default_cache_dir`).
        use_db: False to neither read nor write ``runs.sqlite`` (a plain full scan). Without a
            database it is written (rebuilt) when the cache folder exists or there are at least
            :data:`DB_MIN_RUNS` runs.
        progress: told how far the poll is while it lasts (:func:`scan_progress`).

    Raises:
        NoRootError: no root exists.
    """
    store = RunStore(roots, stale_after_seconds=stale_after_seconds, max_metrics_file_mb=max_metrics_file_mb)
    result = WarmStart(store)
    folder = default_cache_dir(roots, cache_dir)
    # The run database's reader and writer cost an import of their own: a small workspace without a
    # database and without a cache folder (no viewer ran here) is scanned and left as it is.
    exists = use_db and os.path.exists(os.path.join(folder, _DB_FILE))
    cache: CacheFolder | None = None
    stored: dict[str, str] = {}
    with bulk_load():
        if exists:
            cache = _cache_folder(folder, roots, result)
            loaded = cache.load_run_db() if cache is not None else None
            if loaded is not None:
                stored = {key: cached.summary.display_status for key, cached in loaded.runs.items()}
                result.from_db = store.seed(dict(loaded.runs))
                result.columns = ColumnIndex.primed([c.summary for c in loaded.runs.values()], loaded.column_state)
        with scan_progress(store, progress):
            polled = store.poll()
        perf = perf_index()
        perf_changed = join_perf(store, perf)
        result.perf_warnings = perf.warnings()
    if use_db and cache is None and not exists and (os.path.isdir(folder) or len(store.runs()) >= DB_MIN_RUNS):
        cache = _cache_folder(folder, roots, result)
    if cache is not None:
        changed: set[str] | None = None
        if result.from_db:
            # Only these can differ from what the database holds: runs re-read, new or with new perf
            # facts, and cached runs whose display status moved on (a running run gone stale).
            changed = {*polled.changed, *perf_changed}
            changed |= {r.key for r in store.runs() if stored.get(r.key) != r.display_status}
        try:
            result.saved = cache.save_run_db(store.runs(), store.stamps(), force=True, changed=changed,
                                             columns=result.columns)
        except (OSError, sqlite3.Error) as err:
            result.warnings.append(f"run database not saved: {err}")
        result.warnings += cache.warnings
    return result


__all__ = ["DB_MIN_RUNS", "Progress", "WarmStart", "bulk_load", "collector_paused", "open_warm", "scan_progress"]
