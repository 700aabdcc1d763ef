"""The viewer's cache folder and its only writer (003 seed, "Exporting the table for an agent",
"Exporting chart data", "The run database", "Security and resource use"; DESIGN §2.1, §4).

Every file the viewer (and ``traceml plot``) writes goes through :class:`CacheFolder`, into one folder
(default ``traceml/.cache`` for the root ``traceml/runs``, else a folder under
``$XDG_CACHE_HOME/traceml`` keyed by the roots; see :func:`default_cache_dir`)::

    .cache/
    ├── ui-state.json       the remembered view: any JSON object up to 256 KB
    ├── hidden-runs.json    keys of runs hidden ("deleted") in the viewer: a JSON list of strings
    ├── runs.sqlite         the run database (traceml_ai.runs.rundb), replaced atomically
    ├── exports/            table-YYYYMMDD-HHMMSS.csv (UTC; newest 20 kept) and latest.csv
    └── plots/              plot-<slug>-YYYYMMDD-HHMMSS.png / .csv (newest 50 of each kept)

Rules: file names are fixed or generated from a strict pattern and checked against it before any
write; fixed files are written to a dot-prefixed temp file in the same folder and renamed; generated
files are created exclusively (never overwriting; a name taken in the same second gets ``-1``,
``-2``, …); pruning deletes only regular files whose names match the generated patterns, so a stray
file is never touched; a sub-folder that is a symlink is refused. Files read back are validated
field by field and only ever offer data: they never say where TraceML reads.

PNGs are drawn by :mod:`traceml_ai.ui.png` from the same data as the page, then checked here to be a
PNG with a ``pHYs`` chunk of 300 DPI before they are written.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Literal

import orjson

from traceml_ai.runs.column_index import ColumnIndex
from traceml_ai.runs.discovery import inside
from traceml_ai.runs.layout import DEFAULT_RUNS_ROOT
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.rundb import (
    DB_FILE,
    Fingerprint,
    LoadedDb,
    RowTexts,
    RunDbError,
    fingerprint,
    load_db,
    row_texts,
    update_db,
    update_db_in_place,
    write_db,
)
from traceml_ai.runs.series import DEFAULT_MAX_POINTS
from traceml_ai.runs.store import NotFoundError
from traceml_ai.runs.table import csv_columns, write_csv
from traceml_ai.runs.writer import atomic_write, iso_utc
from traceml_ai.ui.cache_paths import default_cache_dir, slugify

if TYPE_CHECKING:  # charts (numpy, the PNG renderer) load on the first export, not with the viewer (issue 16)
    from traceml_ai.runs.analysis import ChartSpec
    from traceml_ai.ui.png import Theme

UI_STATE_FILE: Final = "ui-state.json"
HIDDEN_RUNS_FILE: Final = "hidden-runs.json"
RUN_DB_FILE: Final = DB_FILE
EXPORTS_DIR: Final = "exports"
PLOTS_DIR: Final = "plots"
LATEST_CSV: Final = "latest.csv"

MAX_UI_STATE_BYTES: Final = 256 * 1024
MAX_HIDDEN_BYTES: Final = 16 * 1024 * 1024
MAX_HIDDEN_RUNS: Final = 100_000
MAX_KEY_CHARS: Final = 4096
KEEP_TABLE_EXPORTS: Final = 20
KEEP_PLOTS: Final = 50
RUN_DB_MIN_INTERVAL_S: Final = 10.0
"""The run database is written at most this often while runs change (003 seed)."""

TABLE_EXPORT_RE: Final = re.compile(r"table-(?P<stamp>\d{8}-\d{6})(?:-(?P<n>[1-9]\d{0,2}))?\.csv")
PLOT_RE: Final = re.compile(
    r"plot-(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<stamp>\d{8}-\d{6})(?:-(?P<n>[1-9]\d{0,2}))?\.(?P<ext>png|csv)"
)
_SLUG_RE: Final = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FIXED_NAMES: Final = frozenset({UI_STATE_FILE, HIDDEN_RUNS_FILE, RUN_DB_FILE, LATEST_CSV})

ChartFormat = Literal["png", "csv"]


class CacheError(ValueError):
    """A cache folder or cache request the user can fix (one line naming the path or value)."""


# -- where -----------------------------------------------------------------------------------------


def legacy_cache_dir(roots: Sequence[str | os.PathLike[str]]) -> str:
    """Where the cache folder was before it was keyed by its roots: ``.cache`` beside the first root."""
    first = os.fspath(roots[0]) if roots else DEFAULT_RUNS_ROOT
    return os.path.join(os.path.dirname(os.path.abspath(os.path.expanduser(first))), ".cache")


MIGRATED_FILES: Final = (UI_STATE_FILE, HIDDEN_RUNS_FILE)
"""What moves to a new cache folder: the user's choices. The run database and the exports are
rebuilt or made again (an old run database is how sibling roots saw each other's runs)."""


def migrate_cache_dir(roots: Sequence[str | os.PathLike[str]], new: str | os.PathLike[str]) -> list[str]:
    """Once, copy the remembered view and the hidden runs from the legacy cache folder
    (:func:`legacy_cache_dir`) into ``new`` when ``new`` does not exist yet; the old files are
    left where they are (that folder may be ``~/.cache``, shared with every other program).
    Returns the names copied; never raises for a file it cannot read or write (nothing is lost:
    the old file stays).
    """
    new_dir = os.path.abspath(os.fspath(new))
    old_dir = legacy_cache_dir(roots)
    if os.path.exists(new_dir) or os.path.realpath(old_dir) == os.path.realpath(new_dir):
        return []
    copied: list[str] = []
    for name in MIGRATED_FILES:
        src = os.path.join(old_dir, name)
        try:
            if not os.path.isfile(src) or os.path.islink(src):
                continue
            with open(src, "rb") as f:
                data = f.read(MAX_HIDDEN_BYTES + 1)
            if len(data) > MAX_HIDDEN_BYTES:
                continue
            os.makedirs(new_dir, exist_ok=True)
            atomic_write(os.path.join(new_dir, name), data)
            copied.append(name)
        except OSError:
            continue
    return copied


def check_cache_dir(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse a cache folder that is a runs root or lies anywhere inside one: the viewer never
    writes inside a runs root (DESIGN §2.1) — also when one root holds another, e.g.
    ``traceml ui proj/runs proj`` would put the default ``proj/.cache`` inside the root ``proj``.

    Raises:
        CacheError: the message names the folder and the fix.
    """
    real = os.path.realpath(os.fspath(path))
    for root in roots:
        real_root = os.path.realpath(os.path.expanduser(os.fspath(root)))
        if inside(real, real_root):
            raise CacheError(
                f"cache folder {real} is inside the runs folder {real_root}; "
                "set cache_dir (or --cache-dir) to a folder outside the runs"
            )


# -- names -----------------------------------------------------------------------------------------


def _utc_stamp(t: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))


def table_export_name(t: float, n: int = 0) -> str:
    """``table-YYYYMMDD-HHMMSS.csv`` for Unix seconds ``t`` (UTC); ``n`` > 0 adds ``-n`` (a second
    export within the same second)."""
    return f"table-{_utc_stamp(t)}{f'-{n}' if n else ''}.csv"


def plot_name(slug: str, t: float, ext: ChartFormat, n: int = 0) -> str:
    """``plot-<slug>-YYYYMMDD-HHMMSS[-n].<ext>``.

    Raises:
        ValueError: ``slug`` is not a :func:`slugify` result.
    """
    if not _SLUG_RE.fullmatch(slug):
        raise ValueError(f"not a slug: {slug!r}")
    return f"plot-{slug}-{_utc_stamp(t)}{f'-{n}' if n else ''}.{ext}"


# -- PNG checks ------------------------------------------------------------------------------------


class CacheFolder:
    """The viewer's cache folder; the only place the viewer writes.

    Args:
        path: the folder (created with its parents on the first write, never before).
        roots: the runs roots; when given, a cache folder inside a run or equal to a root is refused.
        clock: Unix-seconds clock for file names (tests pass a fake one).
        monotonic: clock for the run-database throttle.

    Attributes:
        warnings: one line per problem found in a cache file read back (newest last, at most 20).

    Raises:
        CacheError: the folder is inside a run folder (see :func:`check_cache_dir`).

    Example:
        >>> cache = CacheFolder("traceml/.cache", roots=["traceml/runs"])    # doctest: +SKIP
        >>> cache.export_table_csv(runs, ["name", "run.best.val/auc"])       # doctest: +SKIP
        ('/abs/traceml/.cache/exports/table-20261130-120000.csv', '/abs/traceml/.cache/exports/latest.csv')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        roots: Iterable[str | os.PathLike[str]] = (),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        check_cache_dir(self.path, roots)
        self.clock = clock
        self.monotonic = monotonic
        self.warnings: list[str] = []
        self._hidden: list[str] | None = None
        self._db_saved_at: float | None = None
        self._db_rows: dict[str, Fingerprint] = {}  # run key → what was last written for it
        self._db_file: tuple[int, int, int] | None = None  # (ino, mtime_ns, size) of our last write
        # Web handlers run in threads: read-modify-write of hidden-runs.json and the run database's
        # bookkeeping happen one at a time.
        self._lock = threading.RLock()

    # -- ui-state.json -------------------------------------------------------------------------

    def save_ui_state(self, obj: Any) -> None:
        """Remember the page's view (``PUT /api/ui-state``).

        Raises:
            CacheError: ``obj`` is not a JSON object, holds NaN/infinity or non-JSON values, or its
                JSON text exceeds 256 KB.
        """
        if not isinstance(obj, dict):
            raise CacheError("the UI state must be a JSON object")
        try:
            data = orjson.dumps(obj)
        except (TypeError, orjson.JSONEncodeError) as err:
            raise CacheError(f"the UI state is not plain JSON ({err})") from None
        if len(data) > MAX_UI_STATE_BYTES:
            raise CacheError(f"the UI state is {len(data)} bytes; at most {MAX_UI_STATE_BYTES} are kept")
        self._write_fixed(UI_STATE_FILE, data)

    def load_ui_state(self) -> dict[str, Any]:
        """The remembered view, or ``{}`` when there is none or the file is not a JSON object of at
        most 256 KB (then with a line in :attr:`warnings`)."""
        data = self._read_fixed(UI_STATE_FILE, MAX_UI_STATE_BYTES)
        if data is None:
            return {}
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._warn(f"{UI_STATE_FILE}: not JSON; starting with the default view")
            return {}
        if not isinstance(obj, dict):
            self._warn(f"{UI_STATE_FILE}: not a JSON object; starting with the default view")
            return {}
        return obj

    # -- hidden-runs.json ----------------------------------------------------------------------

    def hidden_runs(self) -> list[str]:
        """Keys of the runs hidden in the viewer, in the order hidden. Entries that are not
        non-empty strings of at most 4096 characters, and repeats, are dropped with a warning; a
        file that is not a JSON list counts as empty (with a warning). Hiding never touches a run."""
        if self._hidden is None:
            self._hidden = self._load_hidden()
        return list(self._hidden)

    def set_hidden(self, keys: Iterable[str], hidden: bool) -> list[str]:
        """Hide (``hidden=True``) or show again the runs ``keys``; returns the new hidden list.

        Raises:
            CacheError: a key is not a non-empty string of at most 4096 characters, or the list
                would exceed 100,000 runs.
        """
        with self._lock:
            return self._set_hidden(list(keys), hidden)

    def _set_hidden(self, wanted: list[str], hidden: bool) -> list[str]:
        for key in wanted:
            if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
                raise CacheError(f"not a run key: {str(key)[:80]!r}")
        current = self.hidden_runs()
        if hidden:
            new = list(dict.fromkeys([*current, *wanted]))
        else:
            drop = set(wanted)
            new = [k for k in current if k not in drop]
        if len(new) > MAX_HIDDEN_RUNS:
            raise CacheError(f"at most {MAX_HIDDEN_RUNS} runs can be hidden")
        if new != current:
            self._write_fixed(HIDDEN_RUNS_FILE, orjson.dumps(new, option=orjson.OPT_INDENT_2))
        self._hidden = new
        return list(new)

    def _load_hidden(self) -> list[str]:
        data = self._read_fixed(HIDDEN_RUNS_FILE, MAX_HIDDEN_BYTES)
        if data is None:
            return []
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._warn(f"{HIDDEN_RUNS_FILE}: not JSON; no run is hidden")
            return []
        if not isinstance(obj, list):
            self._warn(f"{HIDDEN_RUNS_FILE}: not a JSON list; no run is hidden")
            return []
        good = [k for k in obj if isinstance(k, str) and k and len(k) <= MAX_KEY_CHARS]
        kept = list(dict.fromkeys(good))[:MAX_HIDDEN_RUNS]
        if len(kept) != len(obj):
            self._warn(f"{HIDDEN_RUNS_FILE}: {len(obj) - len(kept)} invalid or repeated entries ignored")
        return kept

    # -- runs.sqlite ---------------------------------------------------------------------------

    def load_run_db(self) -> LoadedDb | None:
        """The run database for a fast start, or None when there is none or it must be rebuilt
        (corrupt, edited, other version: a line in :attr:`warnings`). Pass ``result.runs`` to
        :meth:`traceml_ai.runs.store.RunStore.seed`. A valid file becomes the base of the next
        :meth:`save_run_db`, which then rewrites only the runs that changed."""
        path = os.path.join(self.path, RUN_DB_FILE)
        with self._lock:
            before = _stat_id(path)
            db, reason = load_db(path)
            if db is None:
                if reason is not None:
                    self._warn(f"{RUN_DB_FILE}: {reason}; rebuilding it from the run folders")
                return None
            if before is not None and _stat_id(path) == before:  # not replaced while we read it
                self._db_file = before
                self._db_rows = dict(db.fingerprints)  # as read: nothing is serialized again
            return db

    def save_run_db(
        self,
        runs: Sequence[RunSummary],
        stamps: Mapping[str, Mapping[str, tuple[int, int]]],
        *,
        force: bool = False,
        changed: Collection[str] | None = None,
        columns: ColumnIndex | None = None,
    ) -> str | None:
        """Save the runs to ``runs.sqlite`` (003 seed, "The run database").

        Call it after every poll that changed something, and with ``force=True`` on shutdown. It
        writes at most every 10 s (:data:`RUN_DB_MIN_INTERVAL_S`; a call within that time returns
        None and the next call catches up, since changes are found by comparing with what was last
        written), skips writing when nothing changed, and leaves out hidden runs. When the file is
        still this folder's own last write and few runs changed (:data:`IN_PLACE_MAX_RUNS`), only
        those are rewritten, in the file, in one SQLite transaction; otherwise a new file is built
        as a temp file in the cache folder (a copy of the previous one with the changed runs
        rewritten, or from scratch) and renamed over ``runs.sqlite``. Either way a reader never
        sees half a file.

        Args:
            runs: the runs (``RunStore.runs()``).
            stamps: their file stamps (``RunStore.stamps()``).
            changed: when given, the keys of the only runs that may differ from what this cache
                folder last wrote or loaded (the viewer knows them from its polls): the others are
                not serialized again to find out (with 10,000 runs that took seconds).
            columns: the caller's column index over the saved runs (the viewer's, kept up to date
                by its polls), saved with them for the next warm start; None builds one (a
                walk over every params value: 1 s at 100,000 runs, paid here, not at the start).

        Returns:
            The path written, or None when nothing was written.

        Raises:
            OSError, sqlite3.Error: the file could not be written.
        """
        with self._lock:
            return self._save_run_db(runs, stamps, force=force, changed=changed, columns=columns)

    def _save_run_db(
        self,
        runs: Sequence[RunSummary],
        stamps: Mapping[str, Mapping[str, tuple[int, int]]],
        *,
        force: bool,
        changed: Collection[str] | None,
        columns: ColumnIndex | None,
    ) -> str | None:
        now = self.monotonic()
        if not force and self._db_saved_at is not None and now - self._db_saved_at < RUN_DB_MIN_INTERVAL_S:
            return None
        hidden = set(self.hidden_runs())
        shown = [r for r in runs if r.key not in hidden]
        rows: dict[str, Fingerprint] = {}
        texts: dict[str, RowTexts] = {}  # made once for the fingerprint, written as they are
        maybe_changed = None if changed is None else set(changed)  # a list made this quadratic
        for r in shown:
            fp = self._db_rows.get(r.key) if maybe_changed is not None and r.key not in maybe_changed else None
            if fp is None:
                made = texts[r.key] = row_texts(r, stamps.get(r.key, {}))
                fp = fingerprint(r, {}, made)
            rows[r.key] = fp
        target = os.path.join(self.path, RUN_DB_FILE)
        base_ok = self._db_file is not None and _same_file(target, self._db_file)
        if base_ok and rows == self._db_rows:
            return None
        changed = {key for key, fp in rows.items() if self._db_rows.get(key) != fp}
        written_at = iso_utc(self.clock())
        state = (columns if columns is not None else ColumnIndex()).export_state(shown)
        gone = self._db_rows.keys() - rows.keys()
        if base_ok and len(changed) + len(gone) <= max(IN_PLACE_MAX_RUNS, len(rows) // 4):
            # A few runs changed: rewrite them in the file itself, in one transaction (a copy of a
            # 100,000-run file is 1.1 GB, issue 16); anything unexpected writes a new file below.
            try:
                update_db_in_place(target, shown, stamps, changed=changed, gone=gone, written_at=written_at,
                                   column_state=state, texts=texts)
            except (RunDbError, OSError, sqlite3.Error):
                pass
            else:
                return self._saved(now, rows, target)
        folder = self._folder(None)
        fd, tmp = _temp_file(folder, RUN_DB_FILE)
        os.close(fd)
        try:
            try:
                if not base_ok:
                    raise RunDbError("no base")
                update_db(target, tmp, shown, stamps, changed=changed, written_at=written_at, column_state=state,
                          texts=texts)
            except (RunDbError, OSError, sqlite3.Error):
                os.truncate(tmp, 0)
                write_db(tmp, shown, stamps, written_at=written_at, column_state=state, texts=texts)
            # A journal an in-place write left (it was interrupted) belongs to the file replaced:
            # SQLite would roll it back into the new one.
            _unlink_quietly(target + "-journal")
            os.replace(tmp, target)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return self._saved(now, rows, target)

    def _saved(self, now: float, rows: dict[str, Fingerprint], target: str) -> str:
        """Remember a save that wrote ``rows`` to ``target`` (the base of the next one) and return it."""
        self._db_saved_at = now
        self._db_rows = rows
        self._db_file = _stat_id(target)
        return target

    # -- exports -------------------------------------------------------------------------------

    def read_export(self, name: str) -> tuple[bytes, str]:
        """A file this folder wrote, to show read-only ("Open (read-only)" in the page's export
        bar): ``name`` is ``exports/<table-…csv | latest.csv>`` or ``plots/plot-….png|csv``, exactly
        as written (:data:`TABLE_EXPORT_RE`, :data:`PLOT_RE`); nothing else is served.

        Returns:
            ``(bytes, media type)``: ``image/png`` or ``text/plain; charset=utf-8`` (CSV is shown
            as text, not downloaded).

        Raises:
            CacheError: a name that is not an export of this folder, a link, or not a file.
            NotFoundError: no such export (pruned, or never written).
        """
        sub, _, base = name.partition("/")
        ok = (sub == EXPORTS_DIR and (base == LATEST_CSV or TABLE_EXPORT_RE.fullmatch(base) is not None)) or (
            sub == PLOTS_DIR and PLOT_RE.fullmatch(base) is not None
        )
        if not ok:
            raise CacheError(f"not an export of the cache folder: {name!r}")
        folder = os.path.join(self.path, sub)
        path = os.path.join(folder, base)
        try:
            if stat.S_ISLNK(os.lstat(folder).st_mode):
                raise CacheError(f"{folder} is a symlink; exports are read from the cache folder only")
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            raise NotFoundError(f"no export {name!r} (the newest {KEEP_PLOTS} plots and {KEEP_TABLE_EXPORTS} "
                                "table exports are kept)") from None
        except OSError as err:
            raise CacheError(f"cannot open {path}: {err.strerror or err}") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CacheError(f"{path} is not a file")
            data = f.read()
        return data, "image/png" if base.endswith(".png") else "text/plain; charset=utf-8"

    def export_table_csv(
        self, runs: Sequence[RunSummary], columns: Sequence[str], now: float | None = None
    ) -> tuple[str, str]:
        """Write the shown table rows as CSV for an agent (003 seed, "Exporting the table for an
        agent"): ``exports/table-YYYYMMDD-HHMMSS.csv`` (UTC; ``-1``, ``-2`` … within one second) and
        the same bytes as ``exports/latest.csv``. Only the 20 newest timestamped exports are kept.

        Args:
            runs: the rows, in table order.
            columns: the visible columns (the six lead columns come first anyway).
            now: Unix seconds for the name (default: the clock).

        Returns:
            ``(timestamped path, latest.csv path)``, absolute.

        Raises:
            ColumnError: an invalid column name.
            CacheError: no rows (an empty table is not exported: ``latest.csv``, which an agent
                reads, keeps the last export with rows).
            OSError: the file could not be written.
        """
        csv_columns(columns)  # a bad column is refused before a file is made
        if not runs:
            raise CacheError("nothing to export: the table shows no runs (latest.csv is left as it was)")
        t = self.clock() if now is None else now
        folder = self._folder(EXPORTS_DIR)

        def write(f: BinaryIO) -> None:  # row by row: 100,000 rows never stand in memory (issue 16)
            text = io.TextIOWrapper(f, encoding="utf-8", newline="")
            write_csv(text, runs, columns)
            text.flush()
            text.detach()  # the caller flushes, syncs and closes the file

        path = _create_new(folder, lambda n: table_export_name(t, n), TABLE_EXPORT_RE, write)
        self._link_fixed(LATEST_CSV, path, sub=EXPORTS_DIR)
        _prune(folder, TABLE_EXPORT_RE, KEEP_TABLE_EXPORTS)
        return path, os.path.join(folder, LATEST_CSV)

    def export_chart(
        self,
        spec: ChartSpec,
        runs: Sequence[RunSummary],
        histories: Sequence[tuple[RunSummary, MetricsTail]] = (),
        *,
        fmt: ChartFormat = "png",
        now: float | None = None,
        max_points: int = DEFAULT_MAX_POINTS,
        theme: Theme = "dark",
        notes: list[str] | None = None,
    ) -> str:
        """Save a chart as data (CSV, the columns of the 003 seed's "Exporting chart data") or as a
        300-DPI PNG drawn from the same data, in ``plots/plot-<slug>-YYYYMMDD-HHMMSS.<ext>``. The
        newest 50 PNGs and 50 CSVs are kept.

        Args:
            spec: the chart (:func:`traceml_ai.runs.analysis.parse_chart_spec`).
            runs: the chart's runs in order (the runs of ``spec.keys``).
            histories: ``(run, its metrics.jsonl reader)`` per run, for line charts.
            fmt: ``png`` or ``csv``.
            now: Unix seconds for the name (default: the clock).
            max_points: points per drawn series (``max_points_per_series``); the CSV is never
                downsampled.
            theme: PNG colours (the viewer is dark).
            notes: a line for characters the PNG's font cannot draw is appended.

        Returns:
            The absolute path written.

        Raises:
            ColumnError: an invalid column name.
            OSError: the file could not be written.
        """
        from traceml_ai.runs.analysis import chart_csv_rows, chart_slug_source, table_csv
        from traceml_ai.ui.png import render_chart_png

        if fmt == "csv":
            data = table_csv(chart_csv_rows(spec, runs, histories)).encode("utf-8")
        elif fmt == "png":
            self.prepare_png()
            data = render_chart_png(spec, runs, histories, max_points=max_points, theme=theme, notes=notes)
        else:
            raise CacheError(f"format must be png or csv, got {fmt!r}")
        return self.save_plot(chart_slug_source(spec), data, fmt, now=now)

    def prepare_png(self) -> None:
        """Point matplotlib's config and font cache into this cache folder (call before drawing)."""
        _matplotlib_home(self.path)

    def save_plot(self, words: str, data: bytes, fmt: ChartFormat, *, now: float | None = None) -> str:
        """Save chart bytes as ``plots/plot-<slug of words>-YYYYMMDD-HHMMSS.<fmt>`` (the newest 50 of
        each format kept) and return the absolute path. A PNG must be a 300-DPI PNG.

        Raises:
            RuntimeError: ``fmt`` is png and ``data`` is not a 300-DPI PNG.
            CacheError: ``fmt`` is not png or csv.
            OSError: the file could not be written.
        """
        from traceml_ai.ui.png import PNG_DPI, is_png, png_dpi

        if fmt not in ("png", "csv"):
            raise CacheError(f"format must be png or csv, got {fmt!r}")
        if fmt == "png" and (not is_png(data) or round(png_dpi(data) or 0) != PNG_DPI):
            raise RuntimeError("the rendered chart is not a 300-DPI PNG")
        t = self.clock() if now is None else now
        slug = slugify(words)
        folder = self._folder(PLOTS_DIR)
        path = _create_new(folder, lambda n: plot_name(slug, t, fmt, n), PLOT_RE, data)
        _prune(folder, PLOT_RE, KEEP_PLOTS, ext=fmt)
        return path

    # -- plumbing ------------------------------------------------------------------------------

    def _warn(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings = [*self.warnings, line][-20:]

    def _folder(self, sub: str | None) -> str:
        """The cache folder or one of its two sub-folders, created when missing; a sub-folder that
        is a symlink or not a folder is refused, so nothing is written outside the cache folder."""
        os.makedirs(self.path, exist_ok=True)
        if sub is None:
            return self.path
        if sub not in (EXPORTS_DIR, PLOTS_DIR):
            raise ValueError(f"not a cache sub-folder: {sub!r}")
        folder = os.path.join(self.path, sub)
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            os.mkdir(folder)
            return folder
        if not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"{folder} is not a folder (a symlink or a file); remove it to export")
        return folder

    def _write_fixed(self, name: str, data: bytes, *, sub: str | None = None) -> None:
        """Replace a fixed-name file atomically (dot-prefixed temp file in the same folder + rename)."""
        if name not in _FIXED_NAMES:
            raise ValueError(f"not a cache file name: {name!r}")
        folder = self._folder(sub)
        fd, tmp = _temp_file(folder, name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(folder, name))
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def _link_fixed(self, name: str, source: str, *, sub: str | None = None) -> None:
        """Replace a fixed-name file atomically by the file ``source`` (a hard link under a temp
        name, renamed over it; a copy where the file system has no links)."""
        if name not in _FIXED_NAMES:
            raise ValueError(f"not a cache file name: {name!r}")
        folder = self._folder(sub)
        fd, tmp = _temp_file(folder, name)
        os.close(fd)
        try:
            try:
                os.unlink(tmp)
                os.link(source, tmp)
            except OSError:
                shutil.copyfile(source, tmp)
            os.replace(tmp, os.path.join(folder, name))
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def _read_fixed(self, name: str, limit: int) -> bytes | None:
        """A fixed-name file's bytes; None when missing, not a regular file, or above ``limit``
        (with a warning for the last two)."""
        path = os.path.join(self.path, name)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            self._warn(f"{name}: not a regular file; ignored")
            return None
        if st.st_size > limit:
            self._warn(f"{name}: {st.st_size} bytes, more than the {limit} allowed; ignored")
            return None
        try:
            with open(path, "rb") as f:
                return f.read(limit + 1)[:limit]
        except OSError as err:
            self._warn(f"{name}: cannot read ({err.strerror or err}); ignored")
            return None


def _temp_file(folder: str, name: str) -> tuple[int, str]:
    """A new, empty ``.<name>.<random>.tmp`` in ``folder`` (exclusive create; the mode follows the
    umask like any file the user writes, unlike ``tempfile.mkstemp``'s 0600)."""
    for _ in range(100):
        path = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644), path
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temp file in {folder}")


def _file_id(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_mtime_ns, st.st_size


IN_PLACE_MAX_RUNS: Final = 1000
"""A save rewrites the changed runs inside ``runs.sqlite`` when at most this many (or a quarter of
the runs) changed or left; more write a new file (issue 16)."""


def _stat_id(path: str) -> tuple[int, int, int] | None:
    try:
        return _file_id(os.stat(path))
    except OSError:
        return None


def _same_file(path: str, ident: tuple[int, int, int]) -> bool:
    return _stat_id(path) == ident


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _create_new(
    folder: str, name_for: Callable[[int], str], pattern: re.Pattern[str], data: bytes | Callable[[BinaryIO], None]
) -> str:
    """Create a new file with the first free name ``name_for(0)``, ``name_for(1)``, … (exclusive
    create: never overwrites, never follows a planted symlink) and write ``data`` (bytes, or a
    function that writes the open file); return its path."""
    for n in range(1000):
        name = name_for(n)
        if not pattern.fullmatch(name) or os.sep in name:
            raise ValueError(f"generated name {name!r} does not match its pattern")
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _unlink_quietly(path)
            raise
        return path
    raise CacheError(f"more than 1000 files for one second in {folder}; try again")


def _prune(folder: str, pattern: re.Pattern[str], keep: int, *, ext: str | None = None) -> list[str]:
    """Delete all but the ``keep`` newest regular files whose names match ``pattern`` (and have
    extension ``ext``), ordered by the time and counter in their names. Nothing else is touched.
    Returns the deleted names."""
    found: list[tuple[str, int, str]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m is None or (ext is not None and m.group("ext") != ext):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            found.append((m.group("stamp"), int(m.group("n") or 0), entry.name))
    found.sort(reverse=True)
    deleted = []
    for _, _, name in found[keep:]:
        try:
            os.unlink(os.path.join(folder, name))
            deleted.append(name)
        except FileNotFoundError:
            pass
    return deleted


# -- PNG rendering ---------------------------------------------------------------------------------


def _matplotlib_home(cache: str) -> None:
    """matplotlib keeps a font cache under ~/.cache and ~/.config; point it into the cache folder so
    the viewer writes nowhere else (a user's own MPLCONFIGDIR is kept)."""
    if "matplotlib" not in sys.modules:
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(cache, "matplotlib"))


__all__ = [
    "EXPORTS_DIR",
    "HIDDEN_RUNS_FILE",
    "KEEP_PLOTS",
    "KEEP_TABLE_EXPORTS",
    "LATEST_CSV",
    "MAX_UI_STATE_BYTES",
    "PLOTS_DIR",
    "PLOT_RE",
    "RUN_DB_FILE",
    "RUN_DB_MIN_INTERVAL_S",
    "TABLE_EXPORT_RE",
    "UI_STATE_FILE",
    "CacheError",
    "CacheFolder",
    "check_cache_dir",
    "default_cache_dir",
    "legacy_cache_dir",
    "migrate_cache_dir",
    "plot_name",
    "slugify",
    "table_export_name",
]
