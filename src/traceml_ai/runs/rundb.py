"""The run database ``runs.sqlite``: the runs the viewer shows, as SQL tables for people and agents,
plus the bookkeeping that lets the next start fill the table without parsing (003 seed, "The run
database", "Security and resource use"; DESIGN §2.1).

Tables (schema version :data:`SCHEMA_VERSION`):

- ``runs``: ``key`` (the run folder's real path), ``id``, ``name``, ``group_name``, ``tags`` (joined
  with ``;``), ``notes``, ``status`` (run.json's), ``display_status`` (adds ``stale``), ``started_at`` /
  ``ended_at`` / ``heartbeat_at`` (ISO-8601 UTC as written), ``duration_s``, ``step``, ``epoch``,
  ``path`` (the run folder), ``location`` (the runs root it was found in), ``legacy`` (1/0),
  ``warnings`` (the run's file problems, one per line);
- ``config``: ``run_key, key, value``: one row per params.yaml value, booleans 1/0;
- ``metrics``: ``run_key, metric, kind, value, step, mode``: ``kind`` is ``start``, ``last``,
  ``best`` or ``summary``; ``step`` and ``mode`` are set for ``best`` only. NaN is stored as NULL;
- ``run_cache`` (bookkeeping): ``run_key``, ``stamps`` (JSON ``{file: [mtime_ns, size]}`` of the core
  files the summary was parsed from) and ``summary`` (JSON of the whole
  :class:`~traceml_ai.runs.model.RunSummary`);
- ``meta`` (bookkeeping): ``schema_version``, ``written_at``.

Text that is not valid Unicode (a folder name with undecodable bytes, a lone surrogate from a JSON
escape) is stored in the SQL tables with ``?`` in place of the bad characters; the bookkeeping JSON
keeps it exactly.

This module only turns summaries into a database file at a path the caller gives and back. The
caller writes to a temp path and renames it (``traceml_ai.ui.cache`` does). :func:`load_db` validates
every field and checks that the SQL tables still say exactly what the bookkeeping says, so a
corrupt, edited or other-version file is refused and rebuilt from the run folders. What it returns
are cached summaries and their file stamps keyed by run key: it never decides where TraceML reads
(the run store lists the roots itself and only uses a cached summary for a run it found, whose files
have the same stamps).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, NamedTuple
from urllib.parse import quote

from traceml_ai.runs.layout import CORE_FILES, DISPLAY_STATUSES
from traceml_ai.runs.model import BestValue, RunSummary, Scalar

SCHEMA_VERSION: Final = 1
DB_FILE: Final = "runs.sqlite"
APPLICATION_ID: Final = 0x54524D4C  # "TRML": marks the file as TraceML's (PRAGMA application_id)
MAX_DB_BYTES: Final = 1 << 30
"""A file above this size is not read (1 GiB; a 10k-run database is a few tens of MB)."""

FileStamps = dict[str, tuple[int, int]]
"""``{file name: (mtime_ns, size)}`` of the core files a summary was parsed from; an absent file is
not listed."""

_TABLES: Final[dict[str, tuple[str, ...]]] = {
    "meta": ("key", "value"),
    "runs": (
        "key", "id", "name", "group_name", "tags", "notes", "status", "display_status", "started_at",
        "ended_at", "heartbeat_at", "duration_s", "step", "epoch", "path", "location", "legacy", "warnings",
    ),
    "config": ("run_key", "key", "value"),
    "metrics": ("run_key", "metric", "kind", "value", "step", "mode"),
    "run_cache": ("run_key", "stamps", "summary"),
}

_SCHEMA: Final = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    key TEXT PRIMARY KEY, id TEXT NOT NULL, name TEXT NOT NULL, group_name TEXT, tags TEXT NOT NULL,
    notes TEXT NOT NULL, status TEXT, display_status TEXT NOT NULL, started_at TEXT, ended_at TEXT,
    heartbeat_at TEXT, duration_s REAL, step INTEGER, epoch INTEGER, path TEXT NOT NULL,
    location TEXT NOT NULL, legacy INTEGER NOT NULL, warnings TEXT NOT NULL
);
CREATE TABLE config (run_key TEXT NOT NULL, key TEXT NOT NULL, value);
CREATE TABLE metrics (run_key TEXT NOT NULL, metric TEXT NOT NULL, kind TEXT NOT NULL, value, step INTEGER, mode TEXT);
CREATE TABLE run_cache (run_key TEXT PRIMARY KEY, stamps TEXT NOT NULL, summary TEXT NOT NULL);
CREATE INDEX config_by_key ON config (key, run_key);
CREATE INDEX config_by_run ON config (run_key);
CREATE INDEX metrics_by_metric ON metrics (metric, kind);
CREATE INDEX metrics_by_run ON metrics (run_key);
"""


class RunDbError(Exception):
    """A database that cannot be used as the base of an update (the caller then writes a new one)."""


class CachedRun(NamedTuple):
    """One run as the database remembers it: its summary and the stamps of the files it came from.
    A pair, so ``LoadedDb.runs`` can be handed to :meth:`traceml_ai.runs.store.RunStore.seed` as is."""

    summary: RunSummary
    stamps: FileStamps


@dataclass(frozen=True)
class LoadedDb:
    """A validated run database.

    Attributes:
        runs: run key → :class:`CachedRun`, in the order stored.
        written_at: when it was written (ISO-8601 UTC, as the writer gave it).
    """

    runs: dict[str, CachedRun]
    written_at: str


# -- rows ------------------------------------------------------------------------------------------


def _sql_value(value: Scalar) -> Scalar:
    """What SQLite stores for ``value``: NaN becomes NULL (SQLite does this itself; doing it here
    keeps the expected rows comparable with the stored ones), text becomes valid UTF-8."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str):
        return _text(value)
    return value


def _text(value: str) -> str:
    """``value`` with characters UTF-8 cannot encode (lone surrogates) replaced by ``?``."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def run_row(summary: RunSummary) -> tuple[Scalar, ...]:
    """The ``runs`` table row of one run (columns in :data:`_TABLES` order)."""
    row: tuple[Scalar, ...] = (
        summary.key,
        summary.id,
        summary.name,
        summary.group,
        ";".join(summary.tags),
        summary.notes,
        summary.status,
        summary.display_status,
        summary.started_at,
        summary.ended_at,
        summary.heartbeat_at,
        _sql_value(summary.duration_s),
        summary.step,
        summary.epoch,
        summary.path,
        summary.root,
        1 if summary.legacy else 0,
        "\n".join(summary.warnings),
    )
    return tuple(_sql_value(v) for v in row)


def config_rows(summary: RunSummary) -> list[tuple[Scalar, ...]]:
    """The ``config`` rows of one run: one per params.yaml key, booleans as 1/0."""
    key = _text(summary.key)
    return [(key, _text(k), _sql_value(int(v) if isinstance(v, bool) else v)) for k, v in summary.params.items()]


def metrics_rows(summary: RunSummary) -> list[tuple[Scalar, ...]]:
    """The ``metrics`` rows of one run: ``start``, ``last``, ``best`` (with step and mode), ``summary``."""
    key = _text(summary.key)
    rows: list[tuple[Scalar, ...]] = []
    for metric, value in summary.start.items():
        rows.append((key, _text(metric), "start", _sql_value(value), None, None))
    for metric, value in summary.last.items():
        rows.append((key, _text(metric), "last", _sql_value(value), None, None))
    for metric, best in summary.best.items():
        mode = _text(best.mode) if best.mode is not None else None
        rows.append((key, _text(metric), "best", _sql_value(best.value), best.step, mode))
    for name, sval in summary.summary.items():
        stored = _sql_value(int(sval) if isinstance(sval, bool) else sval)
        rows.append((key, _text(name), "summary", stored, None, None))
    return rows


def summary_json(summary: RunSummary) -> str:
    """The whole summary as JSON text (NaN and ±inf as JSON's extension tokens, any string as an
    ASCII escape: read back exactly)."""
    return json.dumps(asdict(summary), ensure_ascii=True, allow_nan=True, separators=(",", ":"))


def stamps_json(stamps: Mapping[str, tuple[int, int]]) -> str:
    """File stamps as JSON text, files sorted."""
    return json.dumps({k: [int(m), int(s)] for k, (m, s) in sorted(stamps.items())}, separators=(",", ":"))


# -- writing ---------------------------------------------------------------------------------------


def write_db(
    path: str | os.PathLike[str],
    runs: Sequence[RunSummary],
    stamps: Mapping[str, Mapping[str, tuple[int, int]]],
    *,
    written_at: str,
) -> None:
    """Write a new run database at ``path`` (a temp path that does not exist or is empty; the
    caller renames it into place).

    Args:
        runs: the runs to store, in order.
        stamps: run key → file stamps of the files its summary was parsed from (missing: none).
        written_at: ISO-8601 UTC time stored in ``meta``.

    Raises:
        sqlite3.Error, OSError: the file could not be written.
    """
    con = sqlite3.connect(os.fspath(path), isolation_level=None)
    try:
        _pragmas(con)
        con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("BEGIN")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        _insert_runs(con, runs, stamps)
        _write_meta(con, written_at)
        con.execute("COMMIT")
    finally:
        con.close()


def update_db(
    base: str | os.PathLike[str],
    path: str | os.PathLike[str],
    runs: Sequence[RunSummary],
    stamps: Mapping[str, Mapping[str, tuple[int, int]]],
    *,
    changed: Collection[str],
    written_at: str,
) -> None:
    """Write at ``path`` a copy of the database ``base`` (SQLite's online backup) in which only the
    runs ``changed`` are rewritten and the runs no longer in ``runs`` are deleted (003 seed: "only
    changed runs are rewritten").

    ``base`` must be a database this module wrote (the caller checks that the file is its own last
    write); a run in ``runs`` that ``base`` lacks must be listed in ``changed``.

    Raises:
        RunDbError: ``base`` is not a TraceML run database of this schema version.
        sqlite3.Error, OSError: a file could not be read or written.
    """
    src = sqlite3.connect(_ro_uri(base), uri=True)
    try:
        app_id, version = _ids(src)
        if app_id != APPLICATION_ID or version != SCHEMA_VERSION:
            raise RunDbError(f"{os.fspath(base)} is not a run database of schema version {SCHEMA_VERSION}")
        dst = sqlite3.connect(os.fspath(path), isolation_level=None)
        try:
            src.backup(dst)
            _pragmas(dst)
            keep = {_text(r.key) for r in runs}
            stored = [row[0] for row in dst.execute("SELECT run_key FROM run_cache")]
            gone = [k for k in stored if k not in keep]
            rewrite = [r for r in runs if r.key in changed]
            dst.execute("BEGIN")
            for key in (*gone, *(_text(r.key) for r in rewrite)):
                dst.execute("DELETE FROM runs WHERE key = ?", (key,))
                for table in ("config", "metrics", "run_cache"):
                    dst.execute(f"DELETE FROM {table} WHERE run_key = ?", (key,))
            _insert_runs(dst, rewrite, stamps)
            _write_meta(dst, written_at)
            dst.execute("COMMIT")
        finally:
            dst.close()
    finally:
        src.close()


def _pragmas(con: sqlite3.Connection) -> None:
    # The file is private until renamed: no rollback journal next to it; FULL sync so the rename
    # never publishes a file whose pages are still in flight.
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = FULL")


def _insert_runs(
    con: sqlite3.Connection, runs: Iterable[RunSummary], stamps: Mapping[str, Mapping[str, tuple[int, int]]]
) -> None:
    for summary in runs:
        con.execute(f"INSERT INTO runs VALUES ({', '.join('?' * len(_TABLES['runs']))})", run_row(summary))
        con.executemany("INSERT INTO config VALUES (?, ?, ?)", config_rows(summary))
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)", metrics_rows(summary))
        con.execute(
            "INSERT INTO run_cache VALUES (?, ?, ?)",
            (_text(summary.key), stamps_json(stamps.get(summary.key, {})), summary_json(summary)),
        )


def _write_meta(con: sqlite3.Connection, written_at: str) -> None:
    con.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [("schema_version", str(SCHEMA_VERSION)), ("written_at", _text(written_at))],
    )


# -- reading ---------------------------------------------------------------------------------------


class _Invalid(ValueError):
    """A field of the database that does not hold what this module wrote."""


def load_db(path: str | os.PathLike[str]) -> tuple[LoadedDb | None, str | None]:
    """Read and validate a run database.

    Returns:
        ``(LoadedDb, None)`` for a valid file; ``(None, None)`` when there is no file; ``(None,
        reason)`` when it must not be used: not SQLite (garbage bytes), another application's or
        schema version's file, a field of the wrong type, or SQL tables that no longer match the
        bookkeeping (an edited row). ``reason`` is one line; the caller rebuilds from the run folders.

    Never raises for a bad file.
    """
    path = os.fspath(path)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot read ({err.strerror or err})"
    if size > MAX_DB_BYTES:
        return None, f"larger than {MAX_DB_BYTES >> 20} MB; not read"
    try:
        con = sqlite3.connect(_ro_uri(path), uri=True)
    except sqlite3.Error as err:
        return None, f"cannot open ({err})"
    try:
        return _load(con), None
    except _Invalid as err:
        return None, str(err)
    except (sqlite3.Error, ValueError, TypeError, RecursionError, OverflowError) as err:
        return None, f"not a readable run database ({type(err).__name__}: {err})"
    finally:
        con.close()


def _ro_uri(path: str | os.PathLike[str]) -> str:
    return "file:" + quote(os.path.abspath(os.fspath(path))) + "?mode=ro"


def _ids(con: sqlite3.Connection) -> tuple[int, int]:
    app_id = con.execute("PRAGMA application_id").fetchone()[0]
    version = con.execute("PRAGMA user_version").fetchone()[0]
    return int(app_id), int(version)


def _load(con: sqlite3.Connection) -> LoadedDb:
    app_id, version = _ids(con)
    if app_id != APPLICATION_ID:
        raise _Invalid("not a TraceML run database")
    if version != SCHEMA_VERSION:
        raise _Invalid(f"schema version {version}, this TraceML reads {SCHEMA_VERSION}")
    for table, columns in _TABLES.items():
        found = tuple(row[1] for row in con.execute(f"PRAGMA table_info({table})"))
        if found != columns:
            raise _Invalid(f"table {table} has columns {', '.join(found) or '(none)'}, expected {', '.join(columns)}")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise _Invalid(f"meta.schema_version is {meta.get('schema_version')!r}, expected '{SCHEMA_VERSION}'")
    written_at = meta.get("written_at")
    if not isinstance(written_at, str):
        raise _Invalid("meta.written_at is missing")

    runs: dict[str, CachedRun] = {}
    cache_rows = con.execute("SELECT run_key, stamps, summary FROM run_cache ORDER BY rowid")
    for run_key, stamps_text, summary_text in cache_rows:
        if not isinstance(run_key, str) or not isinstance(stamps_text, str) or not isinstance(summary_text, str):
            raise _Invalid("run_cache holds a value of the wrong type")
        summary = _summary_from(json.loads(summary_text), run_key)
        if summary.key in runs:
            raise _Invalid(f"run_cache lists {run_key!r} twice")
        runs[summary.key] = CachedRun(summary, _stamps_from(json.loads(stamps_text), run_key))

    # The SQL tables must say exactly what the bookkeeping says: an edited row means an edited file.
    expected_runs = {_text(key): [run_row(c.summary)] for key, c in runs.items()}
    expected_config = {_text(key): config_rows(c.summary) for key, c in runs.items()}
    expected_metrics = {_text(key): metrics_rows(c.summary) for key, c in runs.items()}
    for table, expected in (("runs", expected_runs), ("config", expected_config), ("metrics", expected_metrics)):
        key_column = "key" if table == "runs" else "run_key"
        stored: dict[Any, list[tuple[Any, ...]]] = {}
        for row in con.execute(f"SELECT * FROM {table} ORDER BY rowid"):
            stored.setdefault(row[_TABLES[table].index(key_column)], []).append(tuple(row))
        for key in set(stored) | set(expected):
            if not _same_rows(stored.get(key, []), expected.get(key, [])):
                raise _Invalid(f"table {table} was edited (run {key!r} differs from the cache bookkeeping)")
    return LoadedDb(runs, written_at)


def _same_rows(stored: list[tuple[Any, ...]], expected: list[tuple[Scalar, ...]]) -> bool:
    if len(stored) != len(expected):
        return False
    for a_row, b_row in zip(stored, expected, strict=True):
        for a, b in zip(a_row, b_row, strict=True):
            # A REAL column stores an int as a float (3600 → 3600.0); text or a different number is a change.
            if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
                return False
            if a != b:
                return False
    return True


# -- validation of the bookkeeping JSON ------------------------------------------------------------


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, int, float))


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _dict_of(check: Any) -> Any:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


_FIELD_CHECKS: Final[dict[str, Any]] = {
    "key": lambda v: isinstance(v, str) and v != "",
    "id": lambda v: isinstance(v, str) and v != "",
    "root": lambda v: isinstance(v, str) and v != "",
    "name": lambda v: isinstance(v, str),
    "group": _opt(lambda v: isinstance(v, str)),
    "tags": _str_list,
    "notes": lambda v: isinstance(v, str),
    "status": _opt(lambda v: isinstance(v, str)),
    "display_status": lambda v: v in DISPLAY_STATUSES,
    "legacy": lambda v: isinstance(v, bool),
    "schema_version": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "started_at": _opt(lambda v: isinstance(v, str)),
    "ended_at": _opt(lambda v: isinstance(v, str)),
    "heartbeat_at": _opt(lambda v: isinstance(v, str)),
    "duration_s": _opt(_is_num),
    "step": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "epoch": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "exit": _opt(lambda v: isinstance(v, dict)),
    "params": _dict_of(_is_scalar),
    "start": _dict_of(_opt(_is_num)),
    "last": _dict_of(_opt(_is_num)),
    "best": _dict_of(lambda v: isinstance(v, dict)),  # items checked below
    "summary": _dict_of(_is_scalar),
    "metric_names": _str_list,
    "warnings": _str_list,
    "run_json": lambda v: isinstance(v, dict),
}
_BEST_CHECKS: Final[dict[str, Any]] = {
    "value": _opt(_is_num),
    "step": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "epoch": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "mode": _opt(lambda v: isinstance(v, str)),
}
assert set(_FIELD_CHECKS) == {f.name for f in fields(RunSummary)}, "keep _FIELD_CHECKS in step with RunSummary"


def _summary_from(obj: Any, run_key: str) -> RunSummary:
    if not isinstance(obj, dict) or set(obj) != set(_FIELD_CHECKS):
        raise _Invalid(f"run_cache.summary of {run_key!r} does not have the fields of a run summary")
    for name, check in _FIELD_CHECKS.items():
        if not check(obj[name]):
            raise _Invalid(f"run_cache.summary of {run_key!r}: field {name!r} has a value of the wrong type")
    if _text(obj["key"]) != run_key:
        raise _Invalid(f"run_cache.summary of {run_key!r} names another run")
    best: dict[str, BestValue] = {}
    for metric, item in obj["best"].items():
        if set(item) != set(_BEST_CHECKS) or not all(check(item[k]) for k, check in _BEST_CHECKS.items()):
            raise _Invalid(f"run_cache.summary of {run_key!r}: best[{metric!r}] has a value of the wrong type")
        best[metric] = BestValue(**item)
    return RunSummary(**{**obj, "best": best})


def _stamps_from(obj: Any, run_key: str) -> FileStamps:
    if not isinstance(obj, dict):
        raise _Invalid(f"run_cache.stamps of {run_key!r} is not an object")
    out: FileStamps = {}
    for name, stamp in obj.items():
        if (
            name not in CORE_FILES
            or not isinstance(stamp, list)
            or len(stamp) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in stamp)
        ):
            raise _Invalid(f"run_cache.stamps of {run_key!r}: {name!r} is not a file stamp")
        out[name] = (stamp[0], stamp[1])
    return out


__all__ = [
    "APPLICATION_ID",
    "DB_FILE",
    "SCHEMA_VERSION",
    "CachedRun",
    "FileStamps",
    "LoadedDb",
    "RunDbError",
    "config_rows",
    "load_db",
    "metrics_rows",
    "run_row",
    "stamps_json",
    "summary_json",
    "update_db",
    "write_db",
]
