"""The viewer's cache folder and its only writer (003 seed, "Exporting the table for an agent",
"Exporting chart data", "The run database", "Security and resource use"; DESIGN §2.1, §4).

Every file the viewer (and ``traceml plot``) writes goes through :class:`CacheFolder`, into one folder
(default ``traceml/.cache``, beside the first runs root; see :func:`default_cache_dir`)::

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

PNGs are drawn with matplotlib's Agg canvas (no pyplot, no global state) in the viewer's dark theme,
from the same data as the page (:mod:`traceml_ai.runs.analysis`), then checked to be a PNG with a
``pHYs`` chunk of 300 DPI before they are written. matplotlib is imported only when a PNG is drawn.
"""

from __future__ import annotations

import io
import math
import os
import re
import secrets
import sqlite3
import stat
import struct
import sys
import threading
import time
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from traceml_ai.runs.analysis import (
    BarSpec,
    BoxSpec,
    ChartSpec,
    LineSpec,
    ScatterSpec,
    bar_data,
    box_data,
    chart_csv_rows,
    chart_slug_source,
    first_time,
    group_labels,
    line_groups,
    line_points,
    scatter_data,
    table_csv,
)
from traceml_ai.runs.discovery import inside
from traceml_ai.runs.layout import DEFAULT_RUNS_ROOT
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.rundb import (
    DB_FILE,
    Fingerprint,
    LoadedDb,
    RunDbError,
    fingerprint,
    load_db,
    update_db,
    write_db,
)
from traceml_ai.runs.series import DEFAULT_MAX_POINTS
from traceml_ai.runs.table import to_csv
from traceml_ai.runs.writer import iso_utc

if TYPE_CHECKING:
    from matplotlib.axes import Axes

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
PNG_DPI: Final = 300
MAX_SLUG_CHARS: Final = 60

TABLE_EXPORT_RE: Final = re.compile(r"table-(?P<stamp>\d{8}-\d{6})(?:-(?P<n>[1-9]\d{0,2}))?\.csv")
PLOT_RE: Final = re.compile(
    r"plot-(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<stamp>\d{8}-\d{6})(?:-(?P<n>[1-9]\d{0,2}))?\.(?P<ext>png|csv)"
)
_SLUG_RE: Final = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FIXED_NAMES: Final = frozenset({UI_STATE_FILE, HIDDEN_RUNS_FILE, RUN_DB_FILE, LATEST_CSV})
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"

ChartFormat = Literal["png", "csv"]
Theme = Literal["dark", "light"]


class CacheError(ValueError):
    """A cache folder or cache request the user can fix (one line naming the path or value)."""


# -- where -----------------------------------------------------------------------------------------


def default_cache_dir(roots: Sequence[str | os.PathLike[str]], setting: str | os.PathLike[str] | None) -> str:
    """The cache folder (absolute): the ``cache_dir`` setting or flag when given (``~`` expanded,
    relative to the working directory), else ``.cache`` beside the first root, i.e.
    ``traceml/.cache`` for the default root ``traceml/runs`` (003 seed, "Exporting the table for an
    agent"; DESIGN §2.1). Without roots the default root is assumed."""
    if setting is not None and os.fspath(setting).strip():
        return os.path.abspath(os.path.expanduser(os.fspath(setting)))
    first = os.fspath(roots[0]) if roots else DEFAULT_RUNS_ROOT
    return os.path.join(os.path.dirname(os.path.abspath(os.path.expanduser(first))), ".cache")


def check_cache_dir(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse a cache folder that is a runs root or lies inside a run folder: the viewer never
    writes inside a run (DESIGN §2.1). A dot-folder directly in a root (not a run) is allowed.

    Raises:
        CacheError: the message names the folder and the fix.
    """
    real = os.path.realpath(os.fspath(path))
    for root in roots:
        real_root = os.path.realpath(os.path.expanduser(os.fspath(root)))
        if not inside(real, real_root):
            continue
        first = os.path.relpath(real, real_root).split(os.sep)[0]
        if real == real_root or not first.startswith("."):
            raise CacheError(
                f"cache folder {real} is inside the runs folder {real_root}; "
                "set cache_dir (or --cache-dir) to a folder outside the runs"
            )


# -- names -----------------------------------------------------------------------------------------


def slugify(text: str, max_chars: int = MAX_SLUG_CHARS) -> str:
    """A safe ASCII file-name part: accents folded (``ü`` → ``u``), lower case, every other run of
    characters (``/``, spaces, dots, non-Latin letters) a single ``-``, at most ``max_chars``;
    ``chart`` when nothing is left. ``val/auc`` → ``val-auc``."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", folded).strip("-")[:max_chars].strip("-")
    return slug or "chart"


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


def is_png(data: bytes) -> bool:
    """True when ``data`` is a well-formed PNG: the signature, then chunks with valid CRCs starting
    with ``IHDR`` and ending with ``IEND``."""
    chunks = _png_chunks(data)
    return chunks is not None and bool(chunks) and chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"


def png_dpi(data: bytes) -> float | None:
    """The resolution in a PNG's ``pHYs`` chunk, in dots per inch (None without one, or when its
    unit is not the metre or x and y differ). 300 DPI is stored as 11811 pixels per metre."""
    for kind, body in _png_chunks(data) or []:
        if kind == b"pHYs" and len(body) == 9:
            x, y, unit = struct.unpack(">IIB", body)
            return x * 0.0254 if unit == 1 and x == y else None
    return None


def set_png_dpi(data: bytes, dpi: float) -> bytes:
    """``data`` with exactly one ``pHYs`` chunk saying ``dpi`` (pixels per metre, unit 1), placed
    right after ``IHDR``.

    Raises:
        ValueError: ``data`` is not a PNG.
    """
    chunks = _png_chunks(data)
    if not chunks or chunks[0][0] != b"IHDR":
        raise ValueError("not a PNG image")
    ppm = round(dpi / 0.0254)
    phys = (b"pHYs", struct.pack(">IIB", ppm, ppm, 1))
    kept = [c for c in chunks if c[0] != b"pHYs"]
    out = [_PNG_SIGNATURE]
    for kind, body in [kept[0], phys, *kept[1:]]:
        out.append(struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body)))
    return b"".join(out)


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]] | None:
    if not data.startswith(_PNG_SIGNATURE):
        return None
    chunks: list[tuple[bytes, bytes]] = []
    pos = len(_PNG_SIGNATURE)
    while pos < len(data):
        if pos + 12 > len(data):
            return None
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 8 + length
        if end + 4 > len(data):
            return None
        body = data[pos + 8 : end]
        (crc,) = struct.unpack(">I", data[end : end + 4])
        if crc != zlib.crc32(kind + body):
            return None
        chunks.append((kind, body))
        pos = end + 4
        if kind == b"IEND":
            break
    return chunks


# -- the folder ------------------------------------------------------------------------------------


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
    ) -> str | None:
        """Save the runs to ``runs.sqlite`` (003 seed, "The run database").

        Call it after every poll that changed something, and with ``force=True`` on shutdown. It
        writes at most every 10 s (:data:`RUN_DB_MIN_INTERVAL_S`; a call within that time returns
        None and the next call catches up, since changes are found by comparing with what was last
        written), skips writing when nothing changed, leaves out hidden runs, and rewrites only the
        changed runs in a copy of its previous file. The new file is built as a temp file in the
        cache folder and renamed over ``runs.sqlite``, so a reader never sees half a file.

        Args:
            runs: the runs (``RunStore.runs()``).
            stamps: their file stamps (``RunStore.stamps()``).

        Returns:
            The path written, or None when nothing was written.

        Raises:
            OSError, sqlite3.Error: the file could not be written.
        """
        with self._lock:
            return self._save_run_db(runs, stamps, force=force)

    def _save_run_db(
        self, runs: Sequence[RunSummary], stamps: Mapping[str, Mapping[str, tuple[int, int]]], *, force: bool
    ) -> str | None:
        now = self.monotonic()
        if not force and self._db_saved_at is not None and now - self._db_saved_at < RUN_DB_MIN_INTERVAL_S:
            return None
        hidden = set(self.hidden_runs())
        shown = [r for r in runs if r.key not in hidden]
        rows = {r.key: fingerprint(r, stamps.get(r.key, {})) for r in shown}
        target = os.path.join(self.path, RUN_DB_FILE)
        base_ok = self._db_file is not None and _same_file(target, self._db_file)
        if base_ok and rows == self._db_rows:
            return None
        changed = [key for key, fp in rows.items() if self._db_rows.get(key) != fp]
        folder = self._folder(None)
        fd, tmp = _temp_file(folder, RUN_DB_FILE)
        os.close(fd)
        written_at = iso_utc(self.clock())
        try:
            try:
                if not base_ok:
                    raise RunDbError("no base")
                update_db(target, tmp, shown, stamps, changed=changed, written_at=written_at)
            except (RunDbError, OSError, sqlite3.Error):
                os.truncate(tmp, 0)
                write_db(tmp, shown, stamps, written_at=written_at)
            os.replace(tmp, target)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        self._db_saved_at = now
        self._db_rows = rows
        self._db_file = _stat_id(target)
        return target

    # -- exports -------------------------------------------------------------------------------

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
            OSError: the file could not be written.
        """
        data = to_csv(runs, columns).encode("utf-8")
        t = self.clock() if now is None else now
        folder = self._folder(EXPORTS_DIR)
        path = _create_new(folder, lambda n: table_export_name(t, n), TABLE_EXPORT_RE, data)
        self._write_fixed(LATEST_CSV, data, sub=EXPORTS_DIR)
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

        Returns:
            The absolute path written.

        Raises:
            ColumnError: an invalid column name.
            OSError: the file could not be written.
        """
        if fmt == "csv":
            data = table_csv(chart_csv_rows(spec, runs, histories)).encode("utf-8")
        elif fmt == "png":
            _matplotlib_home(self.path)
            data = render_chart_png(spec, runs, histories, max_points=max_points, theme=theme)
            if not is_png(data) or png_dpi(data) is None or round(png_dpi(data) or 0) != PNG_DPI:
                raise RuntimeError("the rendered chart is not a 300-DPI PNG")
        else:
            raise CacheError(f"format must be png or csv, got {fmt!r}")
        t = self.clock() if now is None else now
        slug = slugify(chart_slug_source(spec))
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


def _create_new(folder: str, name_for: Callable[[int], str], pattern: re.Pattern[str], data: bytes) -> str:
    """Create a new file with the first free name ``name_for(0)``, ``name_for(1)``, … (exclusive
    create: never overwrites, never follows a planted symlink) and write ``data``; return its path."""
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

_THEMES: Final[dict[str, dict[str, str]]] = {
    "dark": {"bg": "#16181d", "fg": "#d7dae0", "muted": "#8b919c", "grid": "#2c313a"},
    "light": {"bg": "#ffffff", "fg": "#1f2328", "muted": "#59636e", "grid": "#d8dee4"},
}
PALETTE: Final = (
    "#4e9cf5", "#f5a524", "#3ecf8e", "#ef5a6f", "#a78bfa", "#22c1c3", "#f07c3e", "#c3d64a", "#ec6cb9", "#8fa1b3",
)
_FIG_INCHES: Final = (8.0, 4.5)


def _matplotlib_home(cache: str) -> None:
    """matplotlib keeps a font cache under ~/.cache and ~/.config; point it into the cache folder so
    the viewer writes nowhere else (a user's own MPLCONFIGDIR is kept)."""
    if "matplotlib" not in sys.modules:
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(cache, "matplotlib"))


def render_chart_png(
    spec: ChartSpec,
    runs: Sequence[RunSummary],
    histories: Sequence[tuple[RunSummary, MetricsTail]] = (),
    *,
    max_points: int = DEFAULT_MAX_POINTS,
    theme: Theme = "dark",
) -> bytes:
    """Draw a chart as PNG bytes at 300 DPI with ``pHYs`` set (DESIGN §4: the PNG is rendered
    server-side from the data the chart shows).

    - line: one panel per metric; per run the downsampled series (:func:`~traceml_ai.runs.analysis.
      line_points`), faded with the EMA drawn over it when ``ema`` > 0; with ``group_by`` one mean
      line per group over steps; ``log_y`` masks values ≤ 0;
    - bar: :func:`~traceml_ai.runs.analysis.bar_data` (60 bars at most; group means with min–max
      error bars);
    - scatter: :func:`~traceml_ai.runs.analysis.scatter_data`, sized by ``size_field`` (missing: the
      default size), coloured by ``color_field`` groups;
    - box: :func:`~traceml_ai.runs.analysis.box_data`, whiskers and outliers exactly as computed.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = _THEMES[theme]
    n_panels = len(spec.metrics) if isinstance(spec, LineSpec) else 1
    width, height = _FIG_INCHES
    fig = Figure(figsize=(width + (2.0 if isinstance(spec, LineSpec) else 0.0), height * (1 + 0.6 * (n_panels - 1))),
                 dpi=PNG_DPI, facecolor=colors["bg"])
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_panels, 1, squeeze=False, sharex=True)[:, 0]
    for ax in axes:
        _style_axes(ax, colors)
    if isinstance(spec, LineSpec):
        _draw_lines(list(axes), spec, histories, max_points, colors)
    elif isinstance(spec, BarSpec):
        _draw_bars(axes[0], spec, runs, colors)
    elif isinstance(spec, ScatterSpec):
        _draw_scatter(axes[0], spec, runs, colors)
    else:
        _draw_box(axes[0], spec, runs, colors)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, facecolor=colors["bg"])
    return set_png_dpi(buffer.getvalue(), PNG_DPI)


def _style_axes(ax: Axes, colors: Mapping[str, str]) -> None:
    ax.set_facecolor(colors["bg"])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(colors["grid"])
    ax.tick_params(which="both", colors=colors["muted"], labelsize=7)
    ax.grid(True, color=colors["grid"], linewidth=0.5)
    ax.set_axisbelow(True)


def _note(ax: Axes, text: str, colors: Mapping[str, str]) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=colors["muted"], fontsize=9)


def _legend(ax: Axes, colors: Mapping[str, str], *, outside: bool = False) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    kwargs: dict[str, Any] = {"fontsize": 6, "frameon": False, "labelcolor": colors["fg"]}
    if outside:
        kwargs.update(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    legend = ax.legend(handles, labels, **kwargs)
    for handle in legend.legend_handles:
        set_sizes = getattr(handle, "set_sizes", None)
        if set_sizes is not None:
            set_sizes([24.0])  # scatter legends: one marker size, not the first point's


def _draw_lines(
    axes: list[Axes],
    spec: LineSpec,
    histories: Sequence[tuple[RunSummary, MetricsTail]],
    max_points: int,
    colors: Mapping[str, str],
) -> None:
    x_label = "step" if spec.group_by else {"step": "step", "epoch": "epoch", "time": "time (s)"}[spec.x]
    for i, (ax, metric) in enumerate(zip(axes, spec.metrics, strict=True)):
        ax.set_title(metric, color=colors["fg"], fontsize=9, loc="left")
        drawn = False
        if spec.group_by is not None:
            for j, mean in enumerate(line_groups(histories, metric, spec.group_by)):
                ax.plot(mean.step, mean.mean, color=PALETTE[j % len(PALETTE)], linewidth=1.2,
                        label=f"{mean.label} (mean)")
                drawn = True
        else:
            for j, (run, tail) in enumerate(histories):
                series = tail.series(metric)
                if not len(series):
                    continue
                pts = line_points(series, spec.x, spec.ema, max_points, t0=first_time(tail))
                color = PALETTE[j % len(PALETTE)]
                if pts.smoothed is not None:
                    ax.plot(pts.x, pts.y, color=color, linewidth=0.8, alpha=0.3)
                    ax.plot(pts.x, pts.smoothed, color=color, linewidth=1.2, label=run.name)
                else:
                    ax.plot(pts.x, pts.y, color=color, linewidth=1.2, label=run.name)
                drawn = True
        if not drawn:
            _note(ax, f"no values of {metric}", colors)
        elif spec.log_y:
            ax.set_yscale("log", nonpositive="mask")
            _style_axes(ax, colors)  # a new scale brings new tick labels
        if i == 0:
            _legend(ax, colors, outside=True)
    axes[-1].set_xlabel(x_label, color=colors["muted"], fontsize=8)


def _draw_bars(ax: Axes, spec: BarSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = bar_data(runs, spec.field, spec.group_by)
    bars = data["bars"]
    title = spec.field + (f" by {spec.group_by}" if spec.group_by else "")
    if data["total"] > len(bars):
        title += f"  (first {len(bars)} of {data['total']})"
    ax.set_title(title, color=colors["fg"], fontsize=9, loc="left")
    if not bars:
        _note(ax, f"no run has a number in {spec.field}", colors)
        return
    xs = list(range(len(bars)))
    values = [b["value"] for b in bars]
    bar_colors = [PALETTE[i % len(PALETTE)] if spec.group_by else PALETTE[0] for i in range(len(bars))]
    ax.bar(xs, values, color=bar_colors, width=0.7)
    if spec.group_by:
        low = [b["value"] - (b["min"] if b["min"] is not None else b["value"]) for b in bars]
        high = [(b["max"] if b["max"] is not None else b["value"]) - b["value"] for b in bars]
        ax.errorbar(xs, values, yerr=[low, high], fmt="none", ecolor=colors["fg"], elinewidth=0.8, capsize=2)
    labels = [f"{b['label']} (n={b['n']})" if spec.group_by else b["label"] for b in bars]
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize=max(4, 7 - len(bars) // 20))
    ax.set_ylabel(spec.field, color=colors["muted"], fontsize=8)


def _draw_scatter(ax: Axes, spec: ScatterSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = scatter_data(runs, spec.x_field, spec.y_field, spec.size_field, spec.color_field)
    points = data["points"]
    title = f"{spec.y_field} vs {spec.x_field}"
    if data["dropped"]:
        title += f"  ({data['dropped']} run(s) without both values left out)"
    ax.set_title(title, color=colors["fg"], fontsize=9, loc="left")
    ax.set_xlabel(spec.x_field, color=colors["muted"], fontsize=8)
    ax.set_ylabel(spec.y_field, color=colors["muted"], fontsize=8)
    if not points:
        _note(ax, "no run has numbers in both fields", colors)
        return
    sizes = [p["size"] for p in points if p["size"] is not None]
    lo, hi = (min(sizes), max(sizes)) if sizes else (0.0, 0.0)

    def area(size: float | None) -> float:
        if size is None:
            return 24.0
        return 12.0 + 140.0 * ((size - lo) / (hi - lo) if hi > lo else 0.5)

    # Colours follow the order of the groups (as on the page), not the order of the points.
    groups = group_labels(runs, spec.color_field)[0] if spec.color_field else [None]
    for j, group in enumerate(groups):
        members = [p for p in points if p["group"] == group]
        if not members:
            continue
        ax.scatter(
            [p["x"] for p in members], [p["y"] for p in members], s=[area(p["size"]) for p in members],
            color=PALETTE[j % len(PALETTE)], alpha=0.85, linewidths=0, label=group,
        )
    if spec.log_x:
        ax.set_xscale("log", nonpositive="mask")
    if spec.log_y:
        ax.set_yscale("log", nonpositive="mask")
    _style_axes(ax, colors)  # a new scale brings new tick labels
    if spec.color_field:
        _legend(ax, colors)


def _draw_box(ax: Axes, spec: BoxSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = box_data(runs, spec.field, spec.group_by)
    ax.set_title(spec.field + (f" by {spec.group_by}" if spec.group_by else ""), color=colors["fg"], fontsize=9,
                 loc="left")
    if not data["groups"]:
        _note(ax, f"no run has a number in {spec.field}", colors)
        return
    stats = [
        {"label": f"{g['label']} (n={g['n']})", "q1": g["q1"], "med": g["median"], "q3": g["q3"],
         "whislo": g["low"], "whishi": g["high"], "fliers": [p["value"] for p in g["points"] if p["outlier"]]}
        for g in data["groups"]
    ]
    ax.bxp(
        stats,
        showfliers=True,
        patch_artist=True,
        boxprops={"facecolor": PALETTE[0] + "55", "edgecolor": PALETTE[0]},
        medianprops={"color": colors["fg"]},
        whiskerprops={"color": colors["muted"]},
        capprops={"color": colors["muted"]},
        flierprops={"marker": "o", "markersize": 3, "markerfacecolor": PALETTE[3], "markeredgewidth": 0},
    )
    for i, g in enumerate(data["groups"], start=1):
        inner = [p["value"] for p in g["points"] if not p["outlier"]]
        jitter = [i + 0.18 * math.sin(k * 2.399) for k in range(len(inner))]  # golden-angle spread
        ax.scatter(jitter, inner, s=6, color=colors["fg"], alpha=0.6, linewidths=0)
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_ylabel(spec.field, color=colors["muted"], fontsize=8)


__all__ = [
    "EXPORTS_DIR",
    "HIDDEN_RUNS_FILE",
    "KEEP_PLOTS",
    "KEEP_TABLE_EXPORTS",
    "LATEST_CSV",
    "MAX_UI_STATE_BYTES",
    "PLOTS_DIR",
    "PLOT_RE",
    "PNG_DPI",
    "RUN_DB_FILE",
    "RUN_DB_MIN_INTERVAL_S",
    "TABLE_EXPORT_RE",
    "UI_STATE_FILE",
    "CacheError",
    "CacheFolder",
    "check_cache_dir",
    "default_cache_dir",
    "is_png",
    "plot_name",
    "png_dpi",
    "render_chart_png",
    "set_png_dpi",
    "slugify",
    "table_export_name",
]
