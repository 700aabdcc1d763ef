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
  in all tables an integer beyond 64 bits is stored as REAL (as SQLite stores such a literal);
- ``perf``: ``run_key, column, value``: one row per performance fact of a captured run, ``column``
  the run table's full column name (``perf.verdict``, ``perf.step_ms.p50``, ``perf.share.dataloader``,
  ...; the list and units in docs/viewer-api.md, "Performance columns"), so
  ``SELECT run_key FROM perf WHERE column = 'perf.share.dataloader' AND value > 0.3`` finds the
  input-bound runs. Written from :attr:`RunSummary.perf` (filled by the viewer from each run's
  ``aggregator/final_summary.json``); ``run_cache.summary`` holds the same facts, so a start shows
  them at once (the viewer then checks each captured run's final summary and updates what changed);
- ``run_cache`` (bookkeeping): ``run_key``, ``stamps`` (JSON ``{file: [mtime_ns, size]}`` of the core
  files the summary was parsed from, plus ``".": [mtime_ns, inode]`` of the run folder itself) and
  ``summary`` (JSON of the :class:`~traceml_ai.runs.model.RunSummary`, all fields but ``run_json``,
  which the inspector reads from the run folder);
- ``meta`` (bookkeeping): ``schema_version``, ``written_at``, ``cache_digest`` (the sum of the
  ``run_cache`` rows' checksums) and ``change_counter`` (the SQLite file change counter the file has after
  TraceML's last write of it).

Text that is not valid Unicode (a folder name with undecodable bytes, a lone surrogate from a JSON
escape) is stored in the SQL tables with ``?`` in place of the bad characters; the bookkeeping JSON
keeps it exactly.

This module only turns summaries into a database file at a path the caller gives and back. The
caller writes a new file at a temp path and renames it, or updates its own last write in place in
one SQLite transaction (``traceml_ai.ui.cache`` does both: in place when only some runs changed). :func:`load_db` reads
only the bookkeeping and validates every field of it, so a corrupt, edited or other-version file is
refused and rebuilt from the run folders. An edit is found without reading the
SQL tables back (the viewer's start must stay under 0.1 s for 1,000 runs):

- SQLite counts every write transaction that changes its file in the file's header (the "file
  change counter"); the writer stores the count its own last write leaves in ``meta``, so any edit
  made through SQLite (the ``sqlite3`` shell, DB Browser, pandas, sql.js), of any table, shows as a
  different count. A file switched to WAL mode is refused too (its writes no longer count).
- The ``run_cache`` rows, the only ones TraceML reads, must also match the checksum
  ``cache_digest``, which catches a byte-level edit of what TraceML would show. A byte-level edit
  of the SQL tables alone (bypassing SQLite) is not detected; TraceML never reads them.

What it returns are cached summaries and their file stamps keyed by run key: it never decides where
TraceML reads (the run store lists the roots itself and only uses a cached summary for a run it
found, whose files have the same stamps).
"""

from __future__ import annotations

import gc
import json
import math
import os
import sqlite3
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Annotated, Any, Final, Literal, NamedTuple, get_args
from urllib.parse import quote

import msgspec
import orjson

from traceml_ai.runs.layout import CORE_FILES, DISPLAY_STATUSES, RUN_FOLDER_STAMP
from traceml_ai.runs.model import BestValue, RunSummary, Scalar
from traceml_ai.runs.safeio import open_regular

SCHEMA_VERSION: Final = 6
"""2: ``run_cache.summary`` no longer holds ``run_json``; 3: the ``perf`` table, and ``perf`` in
``run_cache.summary``; 4: ``run_cache.stamps`` may hold the run folder's own stamp under
:data:`RUN_FOLDER_STAMP` (issue 16: a start checks a finished run by that one ``stat``); 5: the
``perf`` facts' new meanings (``verdict`` ``not_judged`` for a run with no step timed, ``telemetry``
``no_summary`` / ``partial`` for a damaged database, ``worst_rank`` by the straggler rule's measure),
so a database written before them is rebuilt rather than kept; 6: ``meta.cache_digest`` is a sum of
per-row checksums (order-free), so a save can update the file in place (:func:`update_db_in_place`)."""

DB_FILE: Final = "runs.sqlite"
APPLICATION_ID: Final = 0x54524D4C  # "TRML": marks the file as TraceML's (PRAGMA application_id)
COLUMN_STATE_KEY: Final = "column_index"
"""The ``meta`` row holding the column index of the stored runs (a BLOB; issue 16)."""
MAX_DB_BYTES: Final = 1 << 33
"""A file above this size is not read (8 GiB; the fake generator's runs take ~11 KB each with the
SQL tables' indexes: 10,000 runs ~110 MB, 100,000 runs ~1.1 GB, issue 16)."""

_LOAD_CHUNK: Final = 4096  # rows of run_cache decoded at a time by load_db (bounds the texts held)

FileStamps = dict[str, tuple[int, int]]
"""``{file name: (mtime_ns, size)}`` of the core files a summary was parsed from; an absent file is
not listed."""

Fingerprint = int
"""A 64-bit hash of what the database stores for one run (its stamps and summary texts, as UTF-8):
enough to tell which runs changed since the last write, without keeping megabytes of JSON text for
10,000 runs in memory. Python's ``hash`` (SipHash, seeded per process): compare fingerprints made in
the same process only, as :class:`traceml_ai.ui.cache.CacheFolder` does."""

_TABLES: Final[dict[str, tuple[str, ...]]] = {
    "meta": ("key", "value"),
    "runs": (
        "key", "id", "name", "group_name", "tags", "notes", "status", "display_status", "started_at",
        "ended_at", "heartbeat_at", "duration_s", "step", "epoch", "path", "location", "legacy", "warnings",
    ),
    "config": ("run_key", "key", "value"),
    "metrics": ("run_key", "metric", "kind", "value", "step", "mode"),
    "perf": ("run_key", "column", "value"),
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
CREATE TABLE perf (run_key TEXT NOT NULL, column TEXT NOT NULL, value);
CREATE TABLE run_cache (run_key TEXT PRIMARY KEY, stamps TEXT NOT NULL, summary TEXT NOT NULL);
"""

_INDEXES: Final = """
CREATE INDEX config_by_key ON config (key, run_key);
CREATE INDEX config_by_run ON config (run_key);
CREATE INDEX metrics_by_metric ON metrics (metric, kind);
CREATE INDEX metrics_by_run ON metrics (run_key);
CREATE INDEX perf_by_column ON perf (column, run_key);
CREATE INDEX perf_by_run ON perf (run_key);
"""

_SUMMARY_FIELDS: Final = tuple(f.name for f in fields(RunSummary) if f.name != "run_json")
"""The fields of a summary the database stores."""
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"


class RunDbError(Exception):
    """A database that cannot be used as the base of an update (the caller then writes a new one)."""


class CachedRun(NamedTuple):
    """One run as the database remembers it: its summary and the stamps of the files it came from
    (a :class:`StoredStamps`). A pair, so ``LoadedDb.runs`` can be handed to
    :meth:`traceml_ai.runs.store.RunStore.seed` as is."""

    summary: RunSummary
    stamps: Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class LoadedDb:
    """A validated run database.

    Attributes:
        runs: run key → :class:`CachedRun`, in the order stored.
        written_at: when it was written (ISO-8601 UTC, as the writer gave it).
        fingerprints: run key → the :data:`Fingerprint` of what is stored for it (the texts as read, not
            serialized again), to compare with :func:`fingerprint` of the runs at the next save.
        column_state: the column index saved with these runs (for
            :meth:`traceml_ai.runs.column_index.ColumnIndex.primed`), or None.
    """

    runs: dict[str, CachedRun]
    written_at: str
    fingerprints: dict[str, Fingerprint]
    column_state: bytes | None = None


# -- rows ------------------------------------------------------------------------------------------


def _sql_value(value: Scalar) -> Scalar:
    """What SQLite stores for ``value``: NaN becomes NULL, text becomes valid UTF-8, an integer
    beyond 64 bits becomes REAL (as SQLite stores such an integer literal itself)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str):
        return _text(value)
    if type(value) is int and not -(2**63) <= value < 2**63:
        return float(value)
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
        rows.append((key, _text(metric), "best", _sql_value(best.value), _sql_value(best.step), mode))
    for name, sval in summary.summary.items():
        stored = _sql_value(int(sval) if isinstance(sval, bool) else sval)
        rows.append((key, _text(name), "summary", stored, None, None))
    return rows


def perf_rows(summary: RunSummary) -> list[tuple[Scalar, ...]]:
    """The ``perf`` rows of one run: one per performance fact, the column named in full (``perf.<key>``)."""
    key = _text(summary.key)
    return [(key, _text(f"perf.{k}"), _sql_value(int(v) if isinstance(v, bool) else v))
            for k, v in summary.perf.items()]


def _summary_obj(s: RunSummary) -> dict[str, Any]:
    # By hand, not dataclasses.asdict: asdict deep-copies every value, which made serializing
    # 1,000 summaries take seconds. The JSON encoder copies nothing.
    return {
        "key": s.key,
        "id": s.id,
        "root": s.root,
        "name": s.name,
        "group": s.group,
        "tags": s.tags,
        "notes": s.notes,
        "status": s.status,
        "display_status": s.display_status,
        "legacy": s.legacy,
        "schema_version": s.schema_version,
        "started_at": s.started_at,
        "ended_at": s.ended_at,
        "heartbeat_at": s.heartbeat_at,
        "duration_s": s.duration_s,
        "step": s.step,
        "epoch": s.epoch,
        "exit": s.exit,
        "params": s.params,
        "start": s.start,
        "last": s.last,
        "best": {m: {"value": b.value, "step": b.step, "epoch": b.epoch, "mode": b.mode} for m, b in s.best.items()},
        "summary": s.summary,
        "metric_names": s.metric_names,
        "warnings": s.warnings,
        "perf": s.perf,
    }


_DIGITS_TO_ZERO: Final = str.maketrans("0123456789", "0000000000")
_LONG_INTEGER: Final = "0" * 19  # 19 digits in a row: possibly an integer beyond 64 bits


def summary_json(summary: RunSummary) -> str:
    """The whole summary as JSON text, fields in :class:`RunSummary` order, read back exactly.

    orjson writes it (UTF-8, compact) when it can hold every value; a summary with NaN or ±inf
    (which orjson would write as null), a lone surrogate or an integer beyond 64 bits is written by
    the standard library instead (NaN and ±inf as JSON's extension tokens, every string as an ASCII
    escape). A text with 19 or more digits in a row (maybe an integer beyond 64 bits, which orjson
    would read as a float) starts with a space: :func:`load_db` reads such a text with the standard
    library's decoder."""
    obj = _summary_obj(summary)
    text: str | None = None
    if _all_finite(summary):
        try:
            text = orjson.dumps(obj).decode()
        except TypeError:  # a lone surrogate, an integer beyond 64 bits, a value of another type
            text = None
    if text is None:
        text = json.dumps(obj, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    if _LONG_INTEGER in text.translate(_DIGITS_TO_ZERO):
        return " " + text
    return text


def _all_finite(summary: RunSummary) -> bool:
    """No NaN or ±inf anywhere in ``summary`` (the float-holding fields; ``exit`` walked whole)."""
    for values in (summary.params.values(), summary.start.values(), summary.last.values(),
                   summary.summary.values(), summary.perf.values(),
                   (v for b in summary.best.values() for v in (b.value, b.step, b.epoch)),
                   (summary.duration_s,)):
        for v in values:
            if type(v) is float:
                if v - v != 0.0:  # x - x is 0.0 only when x is finite
                    return False
            elif not (v is None or type(v) is int or type(v) is str or _deep_finite(v)):
                return False
    return summary.exit is None or _deep_finite(summary.exit)


def _deep_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(_deep_finite, value.values()))
    if isinstance(value, (list, tuple)):
        return all(map(_deep_finite, value))
    return True


def stamps_json(stamps: Mapping[str, tuple[int, int]]) -> str:
    """File stamps as JSON text, files sorted (a :class:`StoredStamps` as stored)."""
    if isinstance(stamps, StoredStamps):
        return stamps.text.decode()
    return json.dumps({k: [int(m), int(s)] for k, (m, s) in sorted(stamps.items())}, separators=(",", ":"))


RowTexts = tuple[str, str]
"""``(run_cache.stamps, run_cache.summary)`` of one run, as :func:`row_texts` makes them."""


def row_texts(summary: RunSummary, stamps: Mapping[str, tuple[int, int]]) -> RowTexts:
    """The texts the database stores for ``summary`` and its file ``stamps``: give them to
    :func:`write_db` / :func:`update_db` (``texts=``) when they were made already for a
    :func:`fingerprint`, so no summary is encoded twice (a third of writing 100,000 runs)."""
    return stamps_json(stamps), summary_json(summary)


def fingerprint(summary: RunSummary, stamps: Mapping[str, tuple[int, int]],
                texts: RowTexts | None = None) -> Fingerprint:
    """What the database stores for ``summary`` and its file ``stamps`` (``run_cache.stamps`` and
    ``run_cache.summary``; ``texts``: their :func:`row_texts`, when made already). Compare it with
    :attr:`LoadedDb.fingerprints` to find the changed runs."""
    stamps_text, summary_text = texts if texts is not None else row_texts(summary, stamps)
    return _fingerprint(stamps_text.encode(), summary_text.encode())


def _fingerprint(stamps_text: bytes, summary_text: bytes) -> Fingerprint:
    return hash((stamps_text, summary_text))


class _CacheDigest:
    """The checksum of the ``run_cache`` rows as stored (UTF-8): the sum, modulo 2**64, of one value
    per row, its fields joined by NUL (which neither a path nor the ASCII-escaped JSON texts can
    hold): that text's CRC-32 plus its length times 2**32. A checksum, not a signature: it finds an
    edit, not a forger, who could recompute any digest the file holds.

    A sum does not depend on the rows' order, so a save that rewrites some runs updates it from
    those rows alone (:meth:`remove` the old, :meth:`update` with the new) instead of reading the
    whole table again (issue 16: 250 MB at 100,000 runs). Fed row by row, so neither the writer nor
    the chunked reader holds a copy of the whole table."""

    __slots__ = ("_sum",)

    PREFIX: Final = "sum64:"

    def __init__(self, start: int = 0) -> None:
        self._sum = start

    @classmethod
    def parse(cls, text: str) -> _CacheDigest | None:
        """The digest ``hexdigest`` wrote, or None for another form."""
        if not text.startswith(cls.PREFIX) or len(text) != len(cls.PREFIX) + 16:
            return None
        try:
            return cls(int(text[len(cls.PREFIX):], 16))
        except ValueError:
            return None

    @staticmethod
    def _total(rows: Iterable[tuple[bytes, bytes, bytes]]) -> int:
        total = 0
        crc32, join = zlib.crc32, b"\x00".join
        for row in rows:
            text = join(row)
            total += crc32(text) + (len(text) << 32)
        return total

    def update(self, rows: Iterable[tuple[bytes, bytes, bytes]]) -> None:
        self._sum = (self._sum + self._total(rows)) & _MASK64

    def remove(self, rows: Iterable[tuple[bytes, bytes, bytes]]) -> None:
        self._sum = (self._sum - self._total(rows)) & _MASK64

    def hexdigest(self) -> str:
        return f"{self.PREFIX}{self._sum:016x}"


_MASK64: Final = (1 << 64) - 1


def _cache_digest(rows: Iterable[tuple[bytes, bytes, bytes]]) -> str:
    """:class:`_CacheDigest` of ``rows``, all at once."""
    digest = _CacheDigest()
    digest.update(rows)
    return digest.hexdigest()


# -- writing ---------------------------------------------------------------------------------------


def write_db(
    path: str | os.PathLike[str],
    runs: Sequence[RunSummary],
    stamps: Mapping[str, Mapping[str, tuple[int, int]]],
    *,
    written_at: str,
    column_state: bytes | None = None,
    texts: Mapping[str, RowTexts] | None = None,
) -> None:
    """Write a new run database at ``path`` (a temp path that does not exist or is empty; the
    caller renames it into place).

    Args:
        runs: the runs to store, in order.
        stamps: run key → file stamps of the files its summary was parsed from (missing: none).
        written_at: ISO-8601 UTC time stored in ``meta``.
        column_state: :meth:`traceml_ai.runs.column_index.ColumnIndex.export_state` of ``runs``,
            kept in ``meta`` for :attr:`LoadedDb.column_state`; None stores none.
        texts: run key → :func:`row_texts` of the runs whose texts were made already.

    Raises:
        sqlite3.Error, OSError: the file could not be written.
        RunDbError: SQLite did not count the writes in the file header (see :func:`load_db`).
    """
    con = sqlite3.connect(os.fspath(path), isolation_level=None)
    try:
        # 16 KB pages: a run_cache row is 2-3 KB, so 4 KB pages held one each, and the start read
        # a page per run.
        con.execute("PRAGMA page_size = 16384")
        _pragmas(con)
        con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("BEGIN")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        _insert_runs(con, runs, stamps, texts or {})
        # The indexes after the rows: built from sorted keys at once, not kept up row by row.
        for statement in _INDEXES.split(";"):
            if statement.strip():
                con.execute(statement)
        _write_meta(con, written_at, column_state)
        con.execute("COMMIT")
        _seal(con, path)
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
    column_state: bytes | None = None,
    texts: Mapping[str, RowTexts] | None = None,
) -> None:
    """Write at ``path`` a copy of the database ``base`` (SQLite's online backup) in which only the
    runs ``changed`` are rewritten and the runs no longer in ``runs`` are deleted (003 seed: "only
    changed runs are rewritten").

    ``base`` must be a database this module wrote (the caller checks that the file is its own last
    write); a run in ``runs`` that ``base`` lacks must be listed in ``changed``. ``column_state``
    replaces the base's and ``texts`` are as for :func:`write_db`.

    Raises:
        RunDbError: ``base`` is not a TraceML run database of this schema version, or SQLite did not
            count the writes in the file header.
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
            # Sets: with 100,000 runs a membership test on a list made this quadratic (hours).
            keep = {_text(r.key) for r in runs}
            changed_keys = changed if isinstance(changed, (set, frozenset)) else set(changed)
            stored = [row[0] for row in dst.execute("SELECT run_key FROM run_cache")]
            gone = [k for k in stored if k not in keep]
            rewrite = [r for r in runs if r.key in changed_keys]
            dst.execute("BEGIN")
            for key in (*gone, *(_text(r.key) for r in rewrite)):
                dst.execute("DELETE FROM runs WHERE key = ?", (key,))
                for table in ("config", "metrics", "perf", "run_cache"):
                    dst.execute(f"DELETE FROM {table} WHERE run_key = ?", (key,))
            _insert_runs(dst, rewrite, stamps, texts or {})
            _write_meta(dst, written_at, column_state)
            dst.execute("COMMIT")
            _seal(dst, path)
        finally:
            dst.close()
    finally:
        src.close()


IN_PLACE_BUSY_TIMEOUT_S: Final = 5.0
"""How long :func:`update_db_in_place` waits for readers of the file to finish (a start reading
100,000 runs holds its read lock about 2 s) before it gives up (the caller then writes a copy)."""


def update_db_in_place(
    path: str | os.PathLike[str],
    runs: Sequence[RunSummary],
    stamps: Mapping[str, Mapping[str, tuple[int, int]]],
    *,
    changed: Collection[str],
    gone: Collection[str],
    written_at: str,
    column_state: bytes | None = None,
    texts: Mapping[str, RowTexts] | None = None,
) -> None:
    """Rewrite in the database at ``path`` only the runs ``changed`` (their keys, found in ``runs``)
    and delete the runs ``gone``, in one SQLite transaction (rollback journal: a reader sees the
    file before or after it, never half of it), without copying the file: a save of 10 changed
    runs out of 100,000 costs what those 10 cost (issue 16; :func:`update_db` copies 1.1 GB).

    ``path`` must be this module's own last write, unchanged since: the file's change counter must
    still be the one ``meta`` holds (checked under the write lock). The digest is updated from the
    rows replaced and written alone (:class:`_CacheDigest` is a sum), and ``meta.change_counter``
    is written in the same transaction as the count its commit leaves.

    Raises:
        RunDbError: ``path`` is not a run database of this schema version, another program wrote
            it since, its digest is not of this version, or SQLite did not count the commit (the
            file may then be left refused by :func:`load_db`: write a new one).
        sqlite3.Error, OSError: the file could not be read or written, or readers held it longer
            than :data:`IN_PLACE_BUSY_TIMEOUT_S` (``database is locked``).
    """
    con = sqlite3.connect(os.fspath(path), isolation_level=None, timeout=IN_PLACE_BUSY_TIMEOUT_S)
    try:
        app_id, version = _ids(con)
        if app_id != APPLICATION_ID or version != SCHEMA_VERSION:
            raise RunDbError(f"{os.fspath(path)} is not a run database of schema version {SCHEMA_VERSION}")
        con.execute("PRAGMA journal_mode = DELETE")
        con.execute("PRAGMA synchronous = FULL")
        # The header is read before the lock is taken: closing another descriptor of the file while
        # SQLite holds a lock would drop that lock (POSIX record locks are per process). A write
        # between the two is then seen as a count meta does not hold, or after the commit.
        header = _read_header(path)[0]
        con.execute("BEGIN EXCLUSIVE")
        try:
            meta = dict(con.execute("SELECT key, value FROM meta WHERE key IN ('change_counter', 'cache_digest')"))
            if not header.rollback or not header.counter_valid or meta.get("change_counter") != str(header.counter):
                raise RunDbError(f"{os.fspath(path)} was written by another program since TraceML's last write")
            digest = _CacheDigest.parse(meta.get("cache_digest") or "")
            if digest is None:
                raise RunDbError(f"{os.fspath(path)}: meta.cache_digest is not of this version")
            rewrite = [r for r in runs if r.key in changed]
            old_keys = [*dict.fromkeys([*(_text(k) for k in gone), *(_text(r.key) for r in rewrite)])]
            for start in range(0, len(old_keys), 500):  # (SQLite allows 999 parameters per statement)
                chunk = old_keys[start:start + 500]
                marks = ", ".join("?" * len(chunk))
                digest.remove(con.execute(f"{_STORED_ROWS} WHERE run_key IN ({marks})", chunk))
                con.execute(f"DELETE FROM runs WHERE key IN ({marks})", chunk)
                for table in ("config", "metrics", "perf", "run_cache"):
                    con.execute(f"DELETE FROM {table} WHERE run_key IN ({marks})", chunk)
            _insert_runs(con, rewrite, stamps, texts or {})
            new_keys = [_text(r.key) for r in rewrite]
            for start in range(0, len(new_keys), 500):  # the rows as stored: what a load will sum
                chunk = new_keys[start:start + 500]
                digest.update(con.execute(f"{_STORED_ROWS} WHERE run_key IN ({', '.join('?' * len(chunk))})", chunk))
            _write_meta(con, written_at, column_state, digest.hexdigest())
            # The count this commit leaves (SQLite adds one per write transaction; delete, then
            # insert: a write that leaves a row's bytes as they were is skipped and not counted).
            sealed = (header.counter + 1) & 0xFFFFFFFF
            con.execute("DELETE FROM meta WHERE key = 'change_counter'")
            con.execute("INSERT INTO meta VALUES ('change_counter', ?)", (str(sealed),))
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        if _read_header(path)[0].counter != sealed:
            raise RunDbError(f"SQLite {sqlite3.sqlite_version} did not count the write of {os.fspath(path)}")
    finally:
        con.close()


def _pragmas(con: sqlite3.Connection) -> None:
    # The file is private until renamed: no rollback journal next to it; FULL sync so the rename
    # never publishes a file whose pages are still in flight.
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = FULL")


_INSERT_CHUNK: Final = 2048
"""Runs whose rows are inserted with one ``executemany`` per table (two calls per run were a third
of writing 100,000 runs); each table keeps the runs' order."""


def _insert_runs(
    con: sqlite3.Connection, runs: Iterable[RunSummary], stamps: Mapping[str, Mapping[str, tuple[int, int]]],
    texts: Mapping[str, RowTexts],
) -> None:
    insert_run = f"INSERT INTO runs VALUES ({', '.join('?' * len(_TABLES['runs']))})"
    items = list(runs)
    for start in range(0, len(items), _INSERT_CHUNK):
        chunk = items[start : start + _INSERT_CHUNK]
        run_rows, config, metrics, perf, cache = [], [], [], [], []
        for summary in chunk:
            made = texts.get(summary.key)
            stamps_text, summary_text = made if made is not None else row_texts(summary, stamps.get(summary.key, {}))
            run_rows.append(run_row(summary))
            config += config_rows(summary)
            metrics += metrics_rows(summary)
            if summary.perf:
                perf += perf_rows(summary)
            cache.append((_text(summary.key), stamps_text, summary_text))
        con.executemany(insert_run, run_rows)
        con.executemany("INSERT INTO config VALUES (?, ?, ?)", config)
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)", metrics)
        con.executemany("INSERT INTO perf VALUES (?, ?, ?)", perf)
        con.executemany("INSERT INTO run_cache VALUES (?, ?, ?)", cache)


_STORED_ROWS: Final = "SELECT CAST(run_key AS BLOB), CAST(stamps AS BLOB), CAST(summary AS BLOB) FROM run_cache"


def _write_meta(con: sqlite3.Connection, written_at: str, column_state: bytes | None,
                digest: str | None = None) -> None:
    """Inside the write transaction, after the rows: what ``meta`` says besides the change counter
    (``digest``: the rows' :class:`_CacheDigest` when known, else read from the table)."""
    if digest is None:
        digest = _cache_digest(con.execute(_STORED_ROWS))
    con.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [("schema_version", str(SCHEMA_VERSION)), ("written_at", _text(written_at)), ("cache_digest", digest)],
    )
    # The column index of exactly these rows (one file, one seal), or none: a stale one must not stay.
    if column_state is None:
        con.execute("DELETE FROM meta WHERE key = ?", (COLUMN_STATE_KEY,))
    else:
        con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (COLUMN_STATE_KEY, column_state))


def _seal(con: sqlite3.Connection, path: str | os.PathLike[str]) -> None:
    """Store in ``meta.change_counter`` the file change counter the file has after this last write
    (one more than now: storing it is itself a write). ``con`` has no transaction open."""
    for _ in range(3):
        sealed = (_read_header(path)[0].counter + 1) & 0xFFFFFFFF
        con.execute("BEGIN")
        # Delete, then insert: SQLite skips a write that leaves a row's bytes as they were, and a
        # skipped write is not counted.
        con.execute("DELETE FROM meta WHERE key = 'change_counter'")
        con.execute("INSERT INTO meta VALUES ('change_counter', ?)", (str(sealed),))
        con.execute("COMMIT")
        if _read_header(path)[0].counter == sealed:
            return
    raise RunDbError(f"SQLite {sqlite3.sqlite_version} does not count the writes of {os.fspath(path)}")


# -- reading ---------------------------------------------------------------------------------------


class _Invalid(ValueError):
    """A field of the database that does not hold what this module wrote."""


class _Replaced(Exception):
    """The file changed between the first stat and the end of the read: read it again."""


class _Header(NamedTuple):
    """What the 100-byte SQLite file header says about writes (sqlite.org/fileformat.html §1.3)."""

    counter: int  # the file change counter (offset 24)
    counter_valid: bool  # "version-valid-for" (offset 92) equals it: the last writer kept the counter
    rollback: bool  # read and write versions 1 (rollback journal); 2 is WAL, whose writes are not counted


def _read_header(path: str | os.PathLike[str]) -> tuple[_Header, os.stat_result]:
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        data = f.read(100)
    if len(data) < 100 or not data.startswith(_SQLITE_MAGIC):
        raise _Invalid("not an SQLite file")
    counter = int.from_bytes(data[24:28], "big")
    valid = int.from_bytes(data[92:96], "big") == counter
    return _Header(counter, valid, data[18] == 1 and data[19] == 1), st


def load_db(path: str | os.PathLike[str]) -> tuple[LoadedDb | None, str | None]:
    """Read and validate a run database.

    Only ``meta`` and ``run_cache`` are read; the SQL tables are covered by SQLite's file change
    counter (see the module docstring).

    Returns:
        ``(LoadedDb, None)`` for a valid file; ``(None, None)`` when there is no file; ``(None,
        reason)`` when it must not be used: not SQLite (garbage bytes), another application's or
        schema version's file, a field of the wrong type, ``run_cache`` rows that do not match
        ``meta.cache_digest``, or a file written since TraceML wrote it (an edited row of any
        table). ``reason`` is one line; the caller rebuilds from the run folders.

    Never raises for a bad file.
    """
    path = os.fspath(path)
    for _ in range(2):
        try:
            before = os.stat(path)
        except FileNotFoundError:
            return None, None
        except OSError as err:
            return None, f"cannot read ({err.strerror or err})"
        if before.st_size > MAX_DB_BYTES:
            return None, f"larger than {MAX_DB_BYTES >> 20} MB; not read"
        try:
            con = sqlite3.connect(_ro_uri(path), uri=True, isolation_level=None)
        except sqlite3.Error as err:
            return None, f"cannot open ({err})"
        try:
            with _collector_paused():
                return _load(con, path, before), None
        except _Replaced:
            continue
        except _Invalid as err:
            return None, str(err)
        except (sqlite3.Error, OSError, ValueError, TypeError, RecursionError, OverflowError) as err:
            return None, f"not a readable run database ({type(err).__name__}: {err})"
        finally:
            con.close()
    return None, "replaced by another writer while it was read"


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (if it runs) for the duration of the block."""
    # Reading 1,000 summaries builds ~25,000 lists, dicts and objects, none in a reference cycle.
    # Every 700 of them start a collection and every 25 % the heap grows a full one, each scanning
    # what was built so far again: in a fresh process that was a quarter of the start. Paused, they
    # are scanned once, by the first collections after the read.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _ro_uri(path: str | os.PathLike[str]) -> str:
    return "file:" + quote(os.path.abspath(os.fspath(path))) + "?mode=ro"


def _ids(con: sqlite3.Connection) -> tuple[int, int]:
    app_id = con.execute("PRAGMA application_id").fetchone()[0]
    version = con.execute("PRAGMA user_version").fetchone()[0]
    return int(app_id), int(version)


def _load(con: sqlite3.Connection, path: str, before: os.stat_result) -> LoadedDb:
    # One read transaction: no writer can commit while it lasts, so the header read at its end
    # describes the rows read in it.
    con.execute("BEGIN")
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
    digest, sealed = meta.get("cache_digest"), meta.get("change_counter")
    if not isinstance(digest, str) or not isinstance(sealed, str):
        raise _Invalid("meta.cache_digest or meta.change_counter is missing (written by an older TraceML?)")
    con.text_factory = bytes  # the texts as stored: orjson and the digest take UTF-8, nothing is decoded twice
    # In chunks: the stored texts of 100,000 runs are ~250 MB, freed as soon as a chunk is decoded,
    # so the read never holds more than one chunk of them beside the summaries it built.
    cursor = con.execute("SELECT run_key, stamps, summary FROM run_cache ORDER BY rowid")
    runs: dict[str, CachedRun] = {}
    prints: dict[str, Fingerprint] = {}
    computed = _CacheDigest()
    while rows := cursor.fetchmany(_LOAD_CHUNK):
        if not {*map(type, chain.from_iterable(rows))} <= {bytes}:
            raise _Invalid("run_cache holds a value of the wrong type")
        computed.update(rows)
        run_keys = [row[0].decode() for row in rows]
        stamps_texts = [row[1] for row in rows]
        summary_texts = [row[2] for row in rows]
        summaries = _decode_summaries(summary_texts, run_keys)
        stamps = map(StoredStamps, stamps_texts)  # (decoded when a poll or a save asks)
        keys: list[str] = list(map(_SUMMARY_KEY, summaries))
        if keys != run_keys:  # (the same list unless a key holds text UTF-8 cannot encode)
            for key, run_key in zip(keys, run_keys, strict=True):
                if _text(key) != run_key:
                    raise _Invalid(f"run_cache.summary of {run_key!r} names another run")
        before_len = len(runs)
        runs.update(zip(keys, map(CachedRun, summaries, stamps), strict=True))
        if len(runs) != before_len + len(keys):
            raise _Invalid("run_cache lists a run twice")
        # = _fingerprint of each row
        prints.update(zip(keys, map(hash, zip(stamps_texts, summary_texts, strict=True)), strict=True))
        del rows, stamps_texts, summary_texts
    header, st = _read_header(path)
    if _identity(st) != _identity(before):
        raise _Replaced
    if computed.hexdigest() != digest:
        raise _Invalid("table run_cache was edited (its rows do not match meta.cache_digest)")
    if not header.rollback:
        raise _Invalid("the file was edited (another program switched it to WAL mode)")
    if not header.counter_valid or str(header.counter) != sealed:
        raise _Invalid(
            f"the file was edited by another program since TraceML wrote it (SQLite change counter "
            f"{header.counter}, TraceML's last write left {sealed})"
        )
    state = meta.get(COLUMN_STATE_KEY)
    return LoadedDb(runs, written_at, prints, state if isinstance(state, bytes) else None)


def _identity(st: os.stat_result) -> tuple[int, int]:
    # Which file, not which version of it: the read holds SQLite's shared lock, so a write in place
    # (update_db_in_place) waits for it to end; only a file renamed over the path (a new inode;
    # the old one is still open here, so its number is not reused) can make the header read by path
    # describe another file than the rows read.
    return st.st_dev, st.st_ino


def _decode(text: bytes) -> Any:
    # orjson reads the bookkeeping several times faster than the standard library, which reads what
    # orjson refuses (NaN and ±Infinity tokens, escaped lone surrogates) and the texts summary_json
    # marks with a leading space (long integers, which orjson would turn into floats).
    if not text.startswith(b" "):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


# -- validation of the bookkeeping JSON ------------------------------------------------------------
# The checks of a run whose text the typed decoder below refused (see "decoding"). The values come
# from a JSON decoder, so exact type tests suffice (bool is not int here) and object keys are always
# strings. One table says what each field may hold.

_NONE_TYPE: Final = type(None)
_STR: Final = frozenset({str})
_OPT_STR: Final = frozenset({str, _NONE_TYPE})
_OPT_INT: Final = frozenset({int, _NONE_TYPE})
_SCALAR_TYPES: Final = frozenset({str, int, float, bool, _NONE_TYPE})
_METRIC_TYPES: Final = frozenset({int, float, _NONE_TYPE})
_LIST: Final = frozenset({list})
_DICT: Final = frozenset({dict})

_FIELD_TYPES: Final[dict[str, frozenset[object]]] = {
    "key": _STR,
    "id": _STR,
    "root": _STR,
    "name": _STR,
    "group": _OPT_STR,
    "tags": _LIST,
    "notes": _STR,
    "status": _OPT_STR,
    "display_status": _STR,
    "legacy": frozenset({bool}),
    "schema_version": _OPT_INT,
    "started_at": _OPT_STR,
    "ended_at": _OPT_STR,
    "heartbeat_at": _OPT_STR,
    "duration_s": _METRIC_TYPES,
    "step": _OPT_INT,
    "epoch": _OPT_INT,
    "exit": frozenset({dict, _NONE_TYPE}),
    "params": _DICT,
    "start": _DICT,
    "last": _DICT,
    "best": _DICT,  # of objects with the fields of BestValue (_BEST_TYPES)
    "summary": _DICT,
    "metric_names": _LIST,
    "warnings": _LIST,
    "perf": _DICT,
}
"""The types each field of a summary may have."""
_ITEM_TYPES: Final[dict[str, frozenset[object]]] = {
    "tags": _STR,
    "metric_names": _STR,
    "warnings": _STR,
    "params": _SCALAR_TYPES,
    "summary": _SCALAR_TYPES,
    "start": _METRIC_TYPES,
    "last": _METRIC_TYPES,
    "perf": _SCALAR_TYPES,
}
"""The types of the items (a list field) or values (an object field) of a container field."""
_NOT_EMPTY: Final = ("key", "id", "root")
_DISPLAY: Final = frozenset(DISPLAY_STATUSES)
_BEST_TYPES: Final[dict[str, frozenset[object]]] = {
    "value": _METRIC_TYPES,
    "step": _OPT_INT,
    "epoch": _OPT_INT,
    "mode": _OPT_STR,
}
_CORE: Final = frozenset((*CORE_FILES, RUN_FOLDER_STAMP))
assert tuple(_FIELD_TYPES) == _SUMMARY_FIELDS, "keep _FIELD_TYPES in step with RunSummary"
assert tuple(_summary_obj(RunSummary("k", "i", "r", "n"))) == _SUMMARY_FIELDS, "keep _summary_obj in step"
assert tuple(_BEST_TYPES) == tuple(f.name for f in fields(BestValue)), "keep _BEST_TYPES in step with BestValue"


def _types(values: Iterable[Any]) -> set[type]:
    return set(map(type, values))


def _columns_ok(objs: list[Any], types: Mapping[str, frozenset[object]]) -> bool:
    """Every one of ``objs`` is an object with exactly the fields of ``types``, each of a type it
    allows. (A missing field raises KeyError; with as many fields as ``types``, none is extra.)"""
    try:
        return (
            _types(objs) <= _DICT
            and set(map(len, objs)) <= {len(types)}
            and all(_types(map(itemgetter(name), objs)) <= allowed for name, allowed in types.items())
        )
    except KeyError:
        return False


def _check_summary(obj: Any, run_key: str) -> None:
    """Raise :class:`_Invalid` naming the first field of ``obj`` that is not what a summary holds."""
    if type(obj) is not dict or obj.keys() != _FIELD_TYPES.keys():
        raise _Invalid(f"run_cache.summary of {run_key!r} does not have the fields of a run summary")
    for name, allowed in _FIELD_TYPES.items():
        value = obj[name]
        if (
            type(value) not in allowed
            or (name in _ITEM_TYPES and not _types(value.values() if allowed is _DICT else value) <= _ITEM_TYPES[name])
            or (name in _NOT_EMPTY and not value)
            or (name == "display_status" and value not in _DISPLAY)
        ):
            raise _Invalid(f"run_cache.summary of {run_key!r}: field {name!r} has a value of the wrong type")
    for metric, item in obj["best"].items():
        if not _columns_ok([item], _BEST_TYPES):
            raise _Invalid(f"run_cache.summary of {run_key!r}: best[{metric!r}] has a value of the wrong type")


# -- decoding: one typed msgspec pass, the checks above when it fails --------------------------------
# msgspec decodes all summaries in one call straight into RunSummary and BestValue instances and
# checks every field's type as it goes (bool is not int, lists hold strings, ...), several times
# faster than decoding to dicts, checking them and building the instances: at a start of 1,000
# runs that was half of it. What it does not check is checked after it; a text it refuses (one
# holding NaN or ±Infinity, which it does not read, or a wrong value) goes through the
# dict-decoder and the checks above, one run at a time, which name the run and field at fault.

_SUMMARY: Final = msgspec.json.Decoder(RunSummary)
_StampName = Literal[".", "config.json", "metrics.json", "metrics.jsonl", "params.yaml", "run.json"]
_Count = Annotated[int, msgspec.Meta(ge=0)]
assert frozenset(get_args(_StampName)) == _CORE, "keep _StampName in step with the core files"
_SUMMARY_KEY: Final = attrgetter("key")
_DISPLAY_STATUS: Final = attrgetter("display_status")
_NOT_EMPTY_GETTERS: Final = tuple(attrgetter(name) for name in _NOT_EMPTY)


def _decode_summaries(texts: list[bytes], run_keys: list[str]) -> list[RunSummary]:
    """The summaries of ``texts`` (``run_cache.summary``), in order; :class:`_Invalid` naming the
    first run whose text is not a summary."""
    try:
        # One decode per text: as fast as one of the joined list, without copying them all first.
        summaries = list(map(_SUMMARY.decode, texts))
    except msgspec.MsgspecError:
        summaries = []
    if not (len(summaries) == len(texts) and _summaries_checked(summaries)):
        summaries = [_decode_summary(text, run_key) for text, run_key in zip(texts, run_keys, strict=True)]
    _share_texts(summaries)
    return summaries


_SHARED: Final[dict[str, str]] = {}
"""Texts most runs repeat (metric names, tags, the root, the status), one object each across loads:
msgspec gives every run its own copies, ~700 bytes a run (70 MB at 100,000 runs, issue 16)."""


def _share_texts(summaries: list[RunSummary]) -> None:
    share = _SHARED.setdefault
    if len(_SHARED) > 1 << 16:  # (bounded: texts that do not repeat must not pile up)
        _SHARED.clear()
    for s in summaries:
        names = s.metric_names
        names[:] = map(share, names, names)
        if s.tags:
            s.tags[:] = map(share, s.tags, s.tags)
        s.root = share(s.root, s.root)
        if s.status is not None:
            s.status = share(s.status, s.status)


def _summaries_checked(summaries: list[RunSummary]) -> bool:
    """What msgspec does not check: known display statuses, and a key, id and root for every run."""
    return set(map(_DISPLAY_STATUS, summaries)) <= _DISPLAY and all(
        all(map(get, summaries)) for get in _NOT_EMPTY_GETTERS
    )


def _decode_summary(text: bytes, run_key: str) -> RunSummary:
    try:
        summary = _SUMMARY.decode(text)
    except msgspec.MsgspecError:
        pass
    else:
        if _summaries_checked([summary]):
            return summary
    obj = _decode(text)
    _check_summary(obj, run_key)
    best = {metric: BestValue(**item) for metric, item in obj.pop("best").items()}
    return RunSummary(**obj, best=best)


class StoredStamps(Mapping[str, tuple[int, int]]):
    """The file stamps of one run as ``run_cache.stamps`` holds them, JSON text decoded at each
    look: ``{core file or ".": (mtime_ns, size)}``.

    A start from the database looks at them once, in its first poll (a Refresh again, a save
    only for the runs it rewrites); held decoded they were ~800 bytes a run against ~200 as text
    (80 MB at 100,000 runs), and decoding them all was a tenth of the warm start (issue 16). A
    text that is not ``{core file: [mtime_ns, size]}`` with integers ≥ 0 reads as no stamps: the
    run's files are read again (an edit of the file is refused before, by ``meta.cache_digest``
    and SQLite's change counter)."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def decoded(self) -> FileStamps:
        """The stamps as a new dict (``{}`` for a text that is not stamps)."""
        try:
            return _STAMPS_OF_ONE.decode(self.text)  # type: ignore[return-value]  # (names: the core files')
        except msgspec.DecodeError:  # (a ValidationError too)
            return {}

    def __getitem__(self, name: str) -> tuple[int, int]:
        return self.decoded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return len(self.decoded())

    def __repr__(self) -> str:
        return f"StoredStamps({self.text!r})"


_STAMPS_OF_ONE: Final = msgspec.json.Decoder(dict[_StampName, tuple[_Count, _Count]])


__all__ = [
    "APPLICATION_ID",
    "DB_FILE",
    "RUN_FOLDER_STAMP",
    "SCHEMA_VERSION",
    "CachedRun",
    "FileStamps",
    "Fingerprint",
    "LoadedDb",
    "RunDbError",
    "StoredStamps",
    "config_rows",
    "fingerprint",
    "load_db",
    "metrics_rows",
    "row_texts",
    "run_row",
    "stamps_json",
    "summary_json",
    "update_db",
    "update_db_in_place",
    "write_db",
]
