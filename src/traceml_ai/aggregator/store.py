"""The SQLite telemetry store: ``<run_dir>/aggregator/telemetry.sqlite`` (DESIGN §3.3).

One writer thread owns the only writing connection. Work arrives through a bounded queue: rows
(:meth:`TelemetryStore.put`) or callables that make rows on the writer thread
(:meth:`TelemetryStore.put_work`, how the server hands over frames). Rows are written in one
transaction per flush, every ``flush_interval_s`` (0.5 s) or as soon as ``flush_rows`` rows wait,
with multi-row ``INSERT`` statements; rows that come in a :class:`RowBlock` (the server's hot path)
bind their shared leading columns once per statement. The database runs in WAL mode with
``synchronous=NORMAL``: a committed flush survives the aggregator being killed (not a power cut),
and readers opened with :func:`open_readonly` read while the writer writes.

The same thread appends captured stdout/stderr lines to ``<log_dir>/rank_<global_rank>.log``.

SQLite and log-file errors never propagate: each is counted in :class:`StoreStats` with its
message kept, and the rows of a failed flush are counted as lost (only the unfit rows, when single
rows cannot be bound).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeAlias

from traceml_ai.aggregator.stats import keep_message
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.sqlite import read_only_uri

DB_NAME = "telemetry.sqlite"

LogLine = tuple["int | None", str]
"""``(global_rank, text)``: one line of ``rank_<global_rank>.log`` (``rank_unknown.log`` for None)."""


Row = tuple[Any, ...]
"""One table row: the table's columns in order, without ``id``."""


@dataclass(frozen=True, slots=True)
class RowBlock:
    """Rows of one table that share their leading columns (an envelope's observed time and identity).

    Row ``i`` is ``head + tuple(values[i * width:(i + 1) * width])``: ``values`` holds the rest of
    every row, flat, in row order. The writer binds ``head`` once per ``INSERT`` statement instead of
    once per row and never builds a tuple per row, which is most of what a row costs the writer
    besides SQLite itself (benchmarks/bench_aggregator.py). ``width`` is at least 1.
    """

    head: Row
    width: int
    values: list[Any]

    def __len__(self) -> int:
        return -(-len(self.values) // self.width)

    def rows(self) -> list[Row]:
        """The block's rows as full tuples (a last, incomplete row comes out short)."""
        head, width, values = self.head, self.width, self.values
        return [head + tuple(values[i:i + width]) for i in range(0, len(values), width)]


StoreRows = Mapping[str, "list[Row] | list[RowBlock]"]
"""Rows per table name: a list of full row tuples, or a list of :class:`RowBlock` objects."""

Work = Callable[[], "tuple[StoreRows, Sequence[LogLine]]"]
"""Deferred rows: run on the writer thread, returns ``(rows per table, log lines)``."""

_Segment: TypeAlias = "list[Row] | RowBlock"


PAGE_SIZE = 32_768
"""Bytes per database page of a new ``telemetry.sqlite``. A step_time row is about 1 KB (its
``events_json``), so SQLite's default 4 KiB pages hold only a few rows each and the writer spends
its time on per-page work: one WAL frame write per page at commit, one read and one write per page
at each checkpoint. 32 KiB pages cut the writer's insert cost by about a third
(benchmarks/bench_aggregator.py); larger pages gained nothing more and make each small flush of a
slow run write more."""


class StoreError(RuntimeError):
    """The database cannot be used: another schema version, or not a TraceML telemetry database."""


def create_schema(conn: sqlite3.Connection) -> None:
    """Put ``conn``'s database in WAL mode with ``synchronous=NORMAL`` and create the seven tables.

    A new database gets :data:`PAGE_SIZE` pages.

    Idempotent: existing tables and rows are kept, so an aggregator restarted on the same run
    appends. Sets ``PRAGMA user_version`` to :data:`schema.SCHEMA_USER_VERSION` on a new database.

    Raises:
        StoreError: the database has another (non-zero) ``user_version``.
        sqlite3.Error: the file cannot be opened or written.
    """
    # The page size only takes effect on a new, empty database (before WAL is switched on);
    # on an existing file this is a no-op. See PAGE_SIZE for why not SQLite's 4 KiB.
    conn.execute(f"PRAGMA page_size={int(PAGE_SIZE)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, schema.SCHEMA_USER_VERSION):
        raise StoreError(
            f"telemetry database has schema version {version}, this TraceML writes {schema.SCHEMA_USER_VERSION}"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in schema.TABLES:
            conn.execute(table.create_sql())
        conn.execute(f"PRAGMA user_version = {int(schema.SCHEMA_USER_VERSION)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def open_readonly(path: str | Path, *, timeout_s: float = 5.0) -> sqlite3.Connection:
    """A read-only connection to a telemetry database (``mode=ro`` URI), safe while the writer writes.

    ``path`` is the ``telemetry.sqlite`` file. WAL lets this reader see every committed flush
    without blocking the writer; ``timeout_s`` bounds waits on a lock (e.g. WAL recovery after
    the writer was killed).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        sqlite3.Error: the file is not a database or cannot be read.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no telemetry database at {file}")
    return sqlite3.connect(read_only_uri(file.resolve()), uri=True, timeout=timeout_s, check_same_thread=False)


@dataclass
class StoreStats:
    """What the writer did: rows committed (total and per table), flushes, and every problem.

    ``errors``/``messages``: SQLite failures (open, schema, insert, commit); ``lost_rows`` rows of
    flushes that failed; ``log_errors``/``log_messages``/``lost_log_lines``: rank log-file failures.
    """

    rows_written: int = 0
    rows_by_table: dict[str, int] = field(default_factory=dict)
    flushes: int = 0
    errors: int = 0
    messages: list[str] = field(default_factory=list)
    lost_rows: int = 0
    log_lines_written: int = 0
    log_errors: int = 0
    log_messages: list[str] = field(default_factory=list)
    lost_log_lines: int = 0


_STOP = object()

# Rows per multi-row INSERT statement; bounded further by SQLite's limit on bound variables
# (999 before SQLite 3.32, 32766 since; read from the connection where Python allows).
_CHUNK_ROWS = 500
_DEFAULT_MAX_VARIABLES = 999
# A RowBlock is written with statements of a power-of-two number of rows up to this many, so that
# blocks of any length reuse a few prepared statements per table (the connection caches them).
_BLOCK_ROWS = 512
_CACHED_STATEMENTS = 256


class _RankLogs:
    """Append-only ``rank_<g>.log`` files, kept open between flushes (writer thread only)."""

    # Beyond this many open files (a very wide job) they are closed and reopened on demand.
    MAX_OPEN = 256

    def __init__(self, folder: Path, stats: StoreStats) -> None:
        self._folder = folder
        self._stats = stats
        self._files: dict[int | None, IO[str]] = {}

    def write(self, lines: Sequence[LogLine]) -> None:
        by_rank: dict[int | None, list[str]] = {}
        for rank, text in lines:
            by_rank.setdefault(rank, []).append(text)
        for rank, texts in by_rank.items():
            try:
                handle = self._files.get(rank)
                if handle is None:
                    if len(self._files) >= self.MAX_OPEN:
                        self.close()
                    name = "rank_unknown.log" if rank is None else f"rank_{rank}.log"
                    handle = self._files[rank] = open(self._folder / name, "a", encoding="utf-8")
                handle.write("\n".join(texts) + "\n")
                self._stats.log_lines_written += len(texts)
            except (OSError, ValueError) as exc:
                self._stats.log_errors += 1
                self._stats.lost_log_lines += len(texts)
                keep_message(self._stats.log_messages, f"rank {rank} log: {exc}")

    def flush(self) -> None:
        for rank, handle in list(self._files.items()):
            try:
                handle.flush()
            except (OSError, ValueError) as exc:
                self._stats.log_errors += 1
                keep_message(self._stats.log_messages, f"rank {rank} log: {exc}")
                self._files.pop(rank, None)

    def close(self) -> None:
        self.flush()
        for handle in self._files.values():
            with contextlib.suppress(OSError, ValueError):
                handle.close()
        self._files.clear()


class TelemetryStore:
    """The single writer of ``telemetry.sqlite`` and of the rank log files (DESIGN §3.3).

    Args:
        path: the database file (normally ``<run_dir>/aggregator/telemetry.sqlite``).
        log_dir: folder of the ``rank_<g>.log`` files; default ``path``'s folder.
        flush_interval_s: longest time (s) a queued row waits before its transaction commits.
        flush_rows: commit early once this many rows wait.
        max_queued: batches :meth:`put` may queue before it refuses (backpressure).

    Example::

        store = TelemetryStore(run_dir / "aggregator" / "telemetry.sqlite")
        store.start()
        store.put({"step_memory_samples": rows})
        stats = store.close()   # flushes, then stops the writer thread
    """

    def __init__(
        self,
        path: str | Path,
        *,
        log_dir: str | Path | None = None,
        flush_interval_s: float = 0.5,
        flush_rows: int = 50_000,
        max_queued: int = 64,
    ) -> None:
        self.path = Path(path)
        self.log_dir = Path(log_dir) if log_dir is not None else self.path.parent
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self.stats = StoreStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queued)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._insert_sql = {t.name: t.insert_sql() for t in schema.TABLES}
        self._order = [t.name for t in schema.TABLES]
        self._width = {t.name: len(t.columns) for t in schema.TABLES}
        self._chunk_sql: dict[tuple[str, int], str] = {}
        self._block_sql: dict[tuple[str, int, int], str] = {}
        self._max_variables = _DEFAULT_MAX_VARIABLES

    # -- caller side ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread and wait until it opened the database and created the schema.

        A database that cannot be opened does not raise: the problem is in :attr:`stats` and the
        writer keeps retrying at each flush, counting the rows it cannot write as lost.
        """
        if self._thread is not None:
            raise RuntimeError("TelemetryStore.start() called twice")
        self._thread = threading.Thread(target=self._run, name="traceml-sqlite-writer", daemon=True)
        self._thread.start()
        self._ready.wait()

    def put(
        self,
        tables: StoreRows,
        log_lines: Sequence[LogLine] = (),
        *,
        block: bool = True,
        timeout: float | None = None,
    ) -> bool:
        """Queue rows (per table name, column order of ``schema``) and rank log lines for the next flush.

        A table's rows are full tuples or :class:`RowBlock` objects (one kind per list). Returns False
        when the queue stayed full (non-blocking, or ``timeout`` seconds passed): the caller keeps the
        batch and slows its producers. The lists must not be changed afterwards.

        Raises:
            RuntimeError: the store was not started or is closed.
        """
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("TelemetryStore is not running")
        try:
            self._queue.put((tables, log_lines), block=block, timeout=timeout)
        except queue.Full:
            return False
        return True

    def put_work(self, work: Work, *, block: bool = True, timeout: float | None = None) -> bool:
        """Queue ``work``: a callable the writer thread runs, in queue order, to get the rows and
        log lines to write (``(tables, log_lines)``, as for :meth:`put`).

        This lets the server decode and project frames on the writer thread: one thread then holds
        the GIL for all the per-row work instead of two threads handing it back and forth at every
        row SQLite inserts. ``work`` must not raise (an exception is counted as an error of this
        store and its rows are lost). Returns False when the queue stayed full, like :meth:`put`.

        Raises:
            RuntimeError: the store was not started or is closed.
        """
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("TelemetryStore is not running")
        try:
            self._queue.put(work, block=block, timeout=timeout)
        except queue.Full:
            return False
        return True

    def backlog(self) -> int:
        """Units of work queued for the writer thread right now (approximate): above 0, ingest is
        behind its input. The export worker waits while it is, so ingest keeps the CPU."""
        return self._queue.qsize()

    def close(self, timeout: float | None = None) -> StoreStats:
        """Flush everything queued, close the database and the log files, stop the writer thread.

        ``timeout`` (s) bounds the wait for the final flush; None waits for it. Returns :attr:`stats`.
        """
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(_STOP)
            thread.join(timeout)
        return self.stats

    # -- writer thread --------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection | None:
        conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # SQLite creates its file 0644 whatever the umask; an empty file made here gets the mode
            # every other run file has (0666 less the umask), and SQLite gives the WAL the same.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=True, cached_statements=_CACHED_STATEMENTS
            )
            create_schema(conn)
            getlimit = getattr(conn, "getlimit", None)  # Python 3.11+
            if getlimit is not None:
                self._max_variables = int(getlimit(getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9)))
            return conn
        except (sqlite3.Error, StoreError, OSError) as exc:
            self._error(f"cannot open {self.path}: {exc}")
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            return None

    def _error(self, message: str) -> None:
        self.stats.errors += 1
        keep_message(self.stats.messages, message)

    def _run(self) -> None:
        conn = self._open()
        self._ready.set()
        logs = _RankLogs(self.log_dir, self.stats)
        # Per table, its rows in arrival order: RowBlocks as they came, consecutive full rows in
        # lists of the writer's own.
        pending: dict[str, list[_Segment]] = {}
        pending_rows = 0
        pending_logs: list[LogLine] = []
        next_flush = time.monotonic() + self.flush_interval_s
        stopping = False
        while not stopping:
            wait = max(0.0, next_flush - time.monotonic()) if (pending_rows or pending_logs) else None
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _STOP:
                stopping = True
            elif item is not None:
                if callable(item):
                    try:
                        tables, lines = item()
                    except Exception as exc:  # a bug in the work function: count it, keep writing
                        self._error(f"ingest work failed: {type(exc).__name__}: {exc}")
                        tables, lines = {}, ()
                else:
                    tables, lines = item
                for name, rows in tables.items():
                    if rows:
                        pending_rows += _add_segments(pending.setdefault(name, []), rows)
                if lines:
                    pending_logs.extend(lines)
                # Keep draining what is already queued before deciding to commit: fewer, larger
                # transactions are what make the writer fast.
                if pending_rows < self.flush_rows and not self._queue.empty():
                    continue
            now = time.monotonic()
            if stopping or pending_rows >= self.flush_rows or now >= next_flush:
                if pending_rows:
                    conn = self._flush(conn, pending, pending_rows)
                if pending_logs:
                    logs.write(pending_logs)
                    logs.flush()
                pending = {}
                pending_rows = 0
                pending_logs = []
                next_flush = time.monotonic() + self.flush_interval_s
        logs.close()
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _flush(
        self, conn: sqlite3.Connection | None, pending: dict[str, list[_Segment]], count: int
    ) -> sqlite3.Connection | None:
        """One transaction for every pending row; on failure the rows are counted lost."""
        if conn is None:
            conn = self._open()
            if conn is None:
                self.stats.lost_rows += count
                return None
        unknown = [name for name in pending if name not in self._insert_sql]
        if unknown:
            # A caller bug, not a rank's: keep the known tables' rows, count the rest lost.
            lost = sum(_count(pending.pop(name)) for name in unknown)
            self._error(f"{lost} rows for unknown tables {sorted(unknown)} were not stored")
            self.stats.lost_rows += lost
            count -= lost
        try:
            conn.execute("BEGIN")
            for name in self._ordered(pending):
                self._insert(conn, name, pending[name])
            conn.execute("COMMIT")
        except (ValueError, TypeError, OverflowError, sqlite3.InterfaceError, sqlite3.ProgrammingError) as exc:
            # A value SQLite cannot bind (e.g. an int beyond 64 bits) fails the whole executemany;
            # write the flush again row by row so only the rows that do not fit are lost.
            self._rollback(conn)
            return self._flush_rowwise(conn, pending, count, exc)
        except (sqlite3.Error, StoreError) as exc:
            self._error(f"flush of {count} rows failed: {type(exc).__name__}: {exc}")
            self.stats.lost_rows += count
            return conn if self._rollback(conn) else None
        self.stats.flushes += 1
        self.stats.rows_written += count
        by_table = self.stats.rows_by_table
        for name, segments in pending.items():
            by_table[name] = by_table.get(name, 0) + _count(segments)
        return conn

    def _rollback(self, conn: sqlite3.Connection) -> bool:
        """Roll back an open transaction; False (connection closed) when even that fails."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return True
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            return False

    def _flush_rowwise(
        self,
        conn: sqlite3.Connection,
        pending: dict[str, list[_Segment]],
        count: int,
        first: BaseException,
    ) -> sqlite3.Connection | None:
        bad = 0
        written: dict[str, int] = {}
        try:
            conn.execute("BEGIN")
            for name in self._ordered(pending):
                sql = self._insert_sql[name]
                for row in _rows(pending[name]):
                    try:
                        conn.execute(sql, row)
                    except (ValueError, TypeError, OverflowError, sqlite3.InterfaceError, sqlite3.ProgrammingError,
                            sqlite3.IntegrityError):
                        bad += 1
                    else:
                        written[name] = written.get(name, 0) + 1
            conn.execute("COMMIT")
        except (sqlite3.Error, StoreError) as exc:
            self._error(f"flush of {count} rows failed: {type(exc).__name__}: {exc}")
            self.stats.lost_rows += count
            return conn if self._rollback(conn) else None
        self._error(f"{bad} of {count} rows could not be stored ({type(first).__name__}: {first})")
        self.stats.lost_rows += bad
        self.stats.flushes += 1
        self.stats.rows_written += count - bad
        for name, n in written.items():
            self.stats.rows_by_table[name] = self.stats.rows_by_table.get(name, 0) + n
        return conn

    def _insert(self, conn: sqlite3.Connection, name: str, segments: list[_Segment]) -> None:
        """Insert a table's pending rows, in order.

        Raises:
            ValueError: a row does not have one value per column (flattening would shift columns).
        """
        for segment in segments:
            if isinstance(segment, RowBlock):
                self._insert_block(conn, name, segment)
            else:
                self._insert_rows(conn, name, segment)

    def _insert_block(self, conn: sqlite3.Connection, name: str, block: RowBlock) -> None:
        """Insert ``block`` with ``INSERT ... VALUES (?1, .., ?h, ?h+1, ..), (?1, .., ?h, ..)``.

        The numbered parameters ``?1..?h`` carry the block's head: bound once, used by every row.

        Raises:
            ValueError: the head and the width do not make a row of the table, or ``values`` does
                not hold a whole number of rows.
        """
        head, width, values = block.head, block.width, block.values
        if width < 1 or len(head) + width != self._width[name] or len(values) % width:
            raise ValueError(f"a {name} row block does not make rows of {self._width[name]} values")
        count = len(values) // width
        cap = min(_BLOCK_ROWS, max(1, (self._max_variables - len(head)) // width))
        start = 0
        while start < count:
            rows = min(cap, 1 << ((count - start).bit_length() - 1))
            key = (name, len(head), rows)
            sql = self._block_sql.get(key)
            if sql is None:
                sql = self._block_sql[key] = self._block_statement(name, len(head), width, rows)
            conn.execute(sql, [*head, *values[start * width:(start + rows) * width]])
            start += rows

    def _block_statement(self, name: str, head: int, width: int, rows: int) -> str:
        shared = "".join(f"?{i}, " for i in range(1, head + 1))
        each = [
            "(" + shared + ", ".join(f"?{head + r * width + c}" for c in range(1, width + 1)) + ")"
            for r in range(rows)
        ]
        return self._insert_sql[name].split(" VALUES ")[0] + " VALUES " + ", ".join(each)

    def _insert_rows(self, conn: sqlite3.Connection, name: str, rows: list[Row]) -> None:
        """Insert ``rows`` into table ``name`` with multi-row ``INSERT ... VALUES (...), (...)``.

        One statement per chunk instead of one per row halves the insert cost (the AUTOINCREMENT
        bookkeeping and the statement step run once per chunk; benchmarks/bench_aggregator.py).

        Raises:
            ValueError: a row does not have one value per column (flattening would shift columns).
        """
        width = self._width[name]
        if set(map(len, rows)) - {width}:
            raise ValueError(f"a {name} row does not have {width} values")
        chunk = max(1, min(_CHUNK_ROWS, self._max_variables // width))
        full = len(rows) - len(rows) % chunk
        if full:
            sql = self._chunk_sql.get((name, chunk))
            if sql is None:
                one = "(" + ", ".join("?" * width) + ")"
                sql = self._insert_sql[name].split(" VALUES ")[0] + " VALUES " + ", ".join([one] * chunk)
                self._chunk_sql[(name, chunk)] = sql
            flat = itertools.chain.from_iterable
            for start in range(0, full, chunk):
                conn.execute(sql, list(flat(rows[start:start + chunk])))
        if full < len(rows):
            conn.executemany(self._insert_sql[name], rows[full:])

    def _ordered(self, pending: Mapping[str, Any]) -> Iterable[str]:
        return [name for name in self._order if name in pending]


def _add_segments(segments: list[_Segment], rows: list[Row] | list[RowBlock]) -> int:
    """Append a table's incoming ``rows`` to its pending ``segments``; returns how many rows came."""
    if isinstance(rows[0], RowBlock):
        segments.extend(rows)
        return _count(rows)
    last = segments[-1] if segments else None
    if isinstance(last, list):
        last.extend(rows)
    else:
        segments.append(list(rows))
    return len(rows)


def _count(segments: Sequence[_Segment]) -> int:
    return sum(map(len, segments))


def _rows(segments: list[_Segment]) -> Iterable[Row]:
    for segment in segments:
        yield from segment.rows() if isinstance(segment, RowBlock) else segment
