"""Read-only readers over ``<run>/aggregator/telemetry.sqlite`` (DESIGN §3.3, §3.5; 000 seed tables).

:func:`read_telemetry` returns every row the rules need as typed, immutable samples. It never
raises for what a user can cause (no file, an empty file, a file that is not SQLite, a table the
writer has not created yet): it returns a :class:`Telemetry` whose ``status`` says what happened.

Opening never writes into the run folder. A database in WAL mode whose writer is live has its
``-wal``/``-shm`` files; the reader opens it with ``mode=ro`` and reads the live state. When there is
no ``-wal`` file the writer is gone (or never used WAL) and a ``mode=ro`` connection would create
``-wal``/``-shm`` files next to it, so the reader opens the file as ``immutable`` instead.

Phase time per step (000 seed, StepTimeRecord): for each device of an event, ``gpu_ms`` when it is
not None, else ``cpu_ms``, else the legacy ``duration_ms``; when an event was timed on several
devices the longest of them counts (they time the same region, so summing would count it twice).
None means "not measured" and stays None.

Speed (issue 13 item 5: a run of 8 ranks x 100,000 steps opens its Performance view in about a
second): a finished database (opened ``immutable``) is read through SQLite's memory map; the garbage
collector is paused while the rows become objects (they are all kept: a collection would find
nothing to free); and ``read_telemetry(..., totals=False)`` skips the two whole-table aggregates only
the rules read (``memory_peaks``, ``step_span``). Every fast path gives the fields it fills exactly
as the plain one (``fast=False``) does: tests/diagnose/test_reader_equivalence.py compares them.
"""

from __future__ import annotations

import gc
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import orjson

from traceml_ai.diagnose import thresholds as th
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.sqlite import read_only_uri

# "degraded": readable, but the aggregator died before the run ended, so the rows stop early
# (set by write_final_summary(degraded=...), never by the reader).
TelemetryStatus = Literal["ok", "degraded", "missing", "empty", "corrupt", "unreadable"]


@dataclass(frozen=True)
class StepSample:
    """One step of one rank: the time of each event in ms (None = not measured).

    ``rank`` is the global rank (None when the rank sent no identity); ``timestamp_ns`` when the rank
    measured the row (ns since the Unix epoch, None for legacy rows); ``phases`` maps event names
    (``traceml:forward`` ..., user regions) to ms; ``micro_batches`` is ``traceml:step``'s
    ``n_calls``: how many traced micro-batches the step (one optimizer update) held, None when not sent.
    """

    rank: int | None
    step: int
    timestamp_ns: int | None
    phases: Mapping[str, float | None]
    micro_batches: int | None = None


@dataclass(frozen=True)
class MemorySample:
    """PyTorch's peak allocated / reserved memory (bytes) of one rank's device during one step."""

    rank: int | None
    step: int
    device: str | None
    timestamp_ns: int | None
    peak_alloc_bytes: float | None
    peak_reserved_bytes: float | None


@dataclass(frozen=True)
class MemoryPeak:
    """The highest per-step peaks (bytes) of one rank's device over every step of the run, read with
    SQL ``MAX`` so that no step is missed even when steps are sampled (see :func:`read_telemetry`)."""

    rank: int | None
    device: str | None
    peak_alloc_bytes: float | None
    peak_reserved_bytes: float | None
    first_step: int | None
    last_step: int | None


@dataclass(frozen=True)
class StepSpan:
    """Every step in step_time_samples, sampled or not: distinct step numbers, first and last."""

    distinct: int
    first: int
    last: int


@dataclass(frozen=True)
class ProcessSample:
    """One snapshot of a rank's training process: CPU percent of one core, RSS and GPU memory (bytes)."""

    rank: int | None
    hostname: str | None
    seq: int | None
    timestamp_ns: int | None
    cpu_percent: float | None
    rss_bytes: float | None
    ram_total_bytes: float | None
    gpu_device_index: int | None
    gpu_mem_used_bytes: float | None
    gpu_mem_reserved_bytes: float | None
    gpu_mem_total_bytes: float | None
    cpu_cores: int | None = None
    """The host's logical cores (``cpu_percent`` / ``cpu_cores`` is the process's share of the host)."""


@dataclass(frozen=True)
class SystemSample:
    """One host snapshot sent by a node's local rank 0: host CPU percent and RAM (bytes)."""

    rank: int | None
    hostname: str | None
    seq: int | None
    timestamp_ns: int | None
    cpu_percent: float | None
    ram_used_bytes: float | None
    ram_total_bytes: float | None
    gpu_count: int | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU of one host snapshot: utilisation percent, memory (bytes), temperature (degrees
    Celsius) and power draw and limit (watts); None where NVML did not say."""

    rank: int | None
    hostname: str | None
    seq: int | None
    timestamp_ns: int | None
    gpu_idx: int
    util: float | None
    mem_used_bytes: float | None
    mem_total_bytes: float | None
    temperature_c: float | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class Telemetry:
    """Everything the rules read from one telemetry.sqlite.

    ``status`` is ``ok`` (at least one row), ``empty`` (a database without rows), ``missing`` (no
    file), ``corrupt`` (not a SQLite database, or damaged) or ``unreadable`` (permissions, locks);
    ``detail`` says why for every status but ``ok``. ``problems`` lists rows or tables that could not be
    used (each one line). ``world_size`` is the largest world size any row reported (None if none did).
    ``sampled_every`` is 1, or the stride k when a long run's steps were read every k-th step
    (``MAX_STEP_ROWS``); ``memory_peaks`` and ``step_span`` always cover every step. Sampling is by
    design, not a loss: it is never among the ``problems``.
    """

    path: str
    status: TelemetryStatus
    detail: str | None = None
    steps: tuple[StepSample, ...] = ()
    memory: tuple[MemorySample, ...] = ()
    memory_peaks: tuple[MemoryPeak, ...] = ()
    sampled_every: int = 1
    step_span: StepSpan | None = None
    process: tuple[ProcessSample, ...] = ()
    system: tuple[SystemSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    row_counts: Mapping[str, int] = field(default_factory=dict)
    world_size: int | None = None
    problems: tuple[str, ...] = ()


def _num(value: Any) -> float | None:
    """A finite number as float; anything else (None, NaN, text) is "not measured"."""
    if type(value) is float:  # fast path: nearly every value; x - x is 0.0 only when x is finite
        return value if value - value == 0.0 else None
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rank(global_rank: Any, rank: Any) -> int | None:
    g = _int(global_rank)
    return g if g is not None else _int(rank)


def event_ms(by_device: Any) -> float | None:
    """The time (ms) of one event in one step from its ``{device: stats}`` map (see module docs).

    Returns None when no device measured it; a negative time (clock trouble) is not a measurement.
    """
    # type() checks first: JSON decoding gives plain dicts, and an ABC isinstance costs more than
    # the rest of this function (it runs for every event of every step).
    if type(by_device) is not dict and not isinstance(by_device, Mapping):
        return None
    best: float | None = None
    for stats in by_device.values():
        if type(stats) is not dict and not isinstance(stats, Mapping):
            continue
        get = stats.get
        value = _num(get("gpu_ms"))
        if value is None:
            value = _num(get("cpu_ms"))
            if value is None:
                value = _num(get("duration_ms"))
        if value is not None and value >= 0 and (best is None or value > best):
            best = value
    return best


MMAP_BYTES: Final = 1 << 31
"""Memory-map at most this much of a finished database (SQLite caps it at its build's limit)."""


@contextmanager
def open_readonly(db_path: str | os.PathLike[str], *, mmap: bool = False) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a telemetry database that never creates files beside it.

    ``mmap``: read a finished database (no ``-wal`` file, so opened ``immutable``) through a memory
    map instead of copying each page (a live one is never mapped: its writer may still move pages).

    Raises:
        FileNotFoundError: the file does not exist (nothing is created).
        sqlite3.Error: SQLite could not open it.
    """
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    immutable = not Path(str(path) + "-wal").exists()
    with closing(sqlite3.connect(read_only_uri(path.resolve(), immutable=immutable), uri=True, timeout=5.0)) as conn:
        if mmap and immutable:
            conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        yield conn


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while many long-lived objects are made (each collection
    would walk all of them and free none), on again afterwards if it was on; nested or concurrent
    reads share one pause."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


STEP_COLS = "global_rank, rank, step, timestamp_unix_ns, events_json, world_size"
MEMORY_COLS = "global_rank, rank, step, device, timestamp_unix_ns, peak_alloc_bytes, peak_reserved_bytes, world_size"
PROCESS_COLS = (
    "global_rank, rank, hostname, seq, timestamp_unix_ns, cpu_percent, ram_used_bytes, ram_total_bytes, "
    "gpu_device_index, gpu_mem_used_bytes, gpu_mem_reserved_bytes, gpu_mem_total_bytes, world_size, "
    "cpu_logical_core_count"
)
SYSTEM_COLS = "global_rank, hostname, seq, timestamp_unix_ns, cpu_percent, ram_used_bytes, ram_total_bytes, gpu_count"
GPU_COLS = ("global_rank, hostname, seq, timestamp_unix_ns, gpu_idx, util, mem_used_bytes, mem_total_bytes, "
            "temperature_c, power_usage_w, power_limit_w")


# -- one row → one typed sample (the full read here and the live tail in diagnose.live share them) --


class _DeviceTimes(msgspec.Struct, gc=False):
    """The fields of one device's stats in ``events_json`` the reader uses (000 seed,
    StepTimeRecord); the others (``is_gpu`` ...) are skipped by the decoder."""

    gpu_ms: float | None = None
    cpu_ms: float | None = None
    duration_ms: float | None = None
    # 64-bit integers only: orjson reads a longer one as a float (not a count), and the generic
    # path decides the few between 2**63 and 2**64 that msgspec cannot bound.
    n_calls: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None


_EVENTS: Final = msgspec.json.Decoder(dict[str, dict[str, _DeviceTimes]])
"""Decodes an ``events_json`` of the shape the SDK writes straight into :class:`_DeviceTimes`
(no dict per device, unneeded numbers skipped); anything else it refuses, and the generic path
(:func:`orjson.loads`, :func:`event_ms`) reads it."""


def step_sample(row: tuple[Any, ...]) -> StepSample | Literal["step", "events"]:
    """One ``step_time_samples`` row (columns :data:`STEP_COLS`) as a :class:`StepSample`, or why it
    cannot be used: ``"step"`` (no integer step) or ``"events"`` (``events_json`` unreadable or not an
    object). Phase times follow the module docs (GPU, else CPU, else legacy ``duration_ms``)."""
    g, r, step, ts, events_json = row[:5]
    if type(step) is not int:
        return "step"
    rank = g if type(g) is int else _int(r)
    stamp = ts if type(ts) is int else None
    if events_json is None:
        return StepSample(rank, step, stamp, {}, None)
    try:
        typed = _EVENTS.decode(events_json)
    except (msgspec.DecodeError, TypeError):
        pass  # not the SDK's shape (or not JSON): the generic path decides
    else:
        return StepSample(rank, step, stamp, *_typed_phases(typed))
    try:
        events = orjson.loads(events_json)
    except orjson.JSONDecodeError:
        return "events"
    if type(events) is not dict:
        return "events"
    return StepSample(rank, step, stamp, _phases(events), _calls(events.get(schema.STEP)))


def _typed_phases(events: dict[str, dict[str, _DeviceTimes]]) -> tuple[dict[str, float | None], int | None]:
    """:func:`_phases` and the step's :func:`_calls` of a typed ``events_json`` (the same rules as
    :func:`event_ms`: a non-finite time falls through to the next field, a negative one is no
    measurement, the longest device counts)."""
    out: dict[str, float | None] = {}
    for name, by_device in events.items():
        best: float | None = None
        for times in by_device.values():
            value = times.gpu_ms
            if value is None or value - value != 0.0:  # x - x is 0.0 only when x is finite
                value = times.cpu_ms
                if value is None or value - value != 0.0:
                    value = times.duration_ms
                    if value is not None and value - value != 0.0:
                        value = None
            if value is not None and value >= 0 and (best is None or value > best):
                best = value
        out[name] = best
    calls: int | None = None
    for times in events.get(schema.STEP, {}).values():
        if (c := times.n_calls) is not None and (calls is None or c > calls):
            calls = c
    return out, calls


def _phases(events: dict[str, Any]) -> dict[str, float | None]:
    """``{name: event_ms(by_device)}`` of one decoded ``events_json``, with :func:`event_ms`'s
    common case (plain dicts of finite floats) inline: it runs for every event of every step."""
    out: dict[str, float | None] = {}
    for name, by_device in events.items():
        if type(by_device) is not dict:
            out[name] = event_ms(by_device)
            continue
        best: float | None = None
        for stats in by_device.values():
            if type(stats) is not dict:
                if isinstance(stats, Mapping):
                    best = None
                    break  # rare: let event_ms decide the whole event
                continue
            value = stats.get("gpu_ms")
            if type(value) is not float or value - value != 0.0:
                value = _num(value)
                if value is None:
                    value = _num(stats.get("cpu_ms"))
                    if value is None:
                        value = _num(stats.get("duration_ms"))
            if value is not None and value >= 0 and (best is None or value > best):
                best = value
        else:
            out[name] = best
            continue
        out[name] = event_ms(by_device)
    return out


def process_sample(row: tuple[Any, ...]) -> ProcessSample:
    """One ``process_samples`` row (columns :data:`PROCESS_COLS`) as a :class:`ProcessSample`."""
    g, r, host, seq, ts, cpu, rss, total, gidx, gused, gres, gtotal = row[:12]
    cores = _int(row[13]) if len(row) > 13 else None
    return ProcessSample(_rank(g, r), host if isinstance(host, str) else None, _int(seq), _int(ts), _num(cpu),
                         _num(rss), _num(total), _int(gidx), _num(gused), _num(gres), _num(gtotal),
                         cores if cores is not None and cores > 0 else None)


def system_sample(row: tuple[Any, ...]) -> SystemSample:
    """One ``system_samples`` row (columns :data:`SYSTEM_COLS`) as a :class:`SystemSample`."""
    g, host, seq, ts, cpu, used, total, count = row
    return SystemSample(_int(g), host if isinstance(host, str) else None, _int(seq), _int(ts), _num(cpu),
                        _num(used), _num(total), _int(count))


def gpu_sample(row: tuple[Any, ...]) -> GpuSample | None:
    """One ``system_gpu_samples`` row (columns :data:`GPU_COLS`) as a :class:`GpuSample`; None
    without an integer ``gpu_idx``."""
    g, host, seq, ts, idx, util, used, total, temp, power, limit = row
    gpu_idx = _int(idx)
    if gpu_idx is None:
        return None
    return GpuSample(_int(g), host if isinstance(host, str) else None, _int(seq), _int(ts), gpu_idx, _num(util),
                     _num(used), _num(total), _num(temp), _num(power), _num(limit))


def _select(
    conn: sqlite3.Connection, table: str, cols: str, problems: list[str], where: str = "",
    params: tuple[Any, ...] = (),
) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(f"SELECT {cols} FROM {table} {where} ORDER BY id", params).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []  # the writer creates tables lazily; a missing one is simply empty
        if "no such column" in str(e):
            problems.append(f"{table}: columns differ from this TraceML's schema ({e})")
            return []
        raise


def read_telemetry(db_path: str | os.PathLike[str], *, totals: bool = True, fast: bool = True) -> Telemetry:
    """Read the rows of the five tables the rules use (DESIGN §3.5) from ``db_path``.

    Duplicate rows (000 seed: duplicates pass through) keep the last one written per key:
    ``(rank, step)`` for steps, ``(rank, device, step)`` for memory. A step row without an integer
    ``step`` or with unreadable ``events_json`` is left out and counted in ``problems``.
    Never raises for a bad file: see :class:`Telemetry` ``status``.

    Args:
        totals: False: leave out ``memory_peaks`` (``()``) and ``step_span`` (None), the two
            whole-table aggregates only the rules read (the Performance view's charts do not); every
            other field is the same.
        fast: False: the plain path (no memory map, the first step asked for before the rows, the
            collector left on), which gives the same result; the tests compare the two.
    """
    path = str(db_path)
    try:
        with open_readonly(db_path, mmap=fast) as conn:
            if not fast:
                return _read(conn, path, totals=totals, guess=False)
            with _gc_paused():
                return _read(conn, path, totals=totals, guess=True)
    except FileNotFoundError:
        return Telemetry(path=path, status="missing", detail=f"no telemetry database at {path}")
    except sqlite3.DatabaseError as e:
        text = str(e)
        if isinstance(e, sqlite3.OperationalError) and ("unable to open" in text or "locked" in text):
            return Telemetry(path=path, status="unreadable", detail=f"cannot read {path}: {text}")
        return Telemetry(path=path, status="corrupt", detail=damaged_detail(_header_said(path) or text))
    except OSError as e:
        return Telemetry(path=path, status="unreadable", detail=f"cannot read {path}: {e}")


def _header_said(path: str) -> str | None:
    """What the file's SQLite header and size say is wrong (``truncated: 20,000 of 294,912 bytes``),
    where SQLite only said "database disk image is malformed": the words the run table and
    ``traceml summary`` use for the same file (review 13h), or None."""
    from traceml_ai.diagnose.perf import header_problem

    try:
        with open(path, "rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    return header_problem(head, size)


def damaged_detail(error: str) -> str:
    """The one line that says a telemetry database is damaged, ``error`` being SQLite's words
    (every panel and warning shows it, after the file's name where that is not said already)."""
    return f"telemetry database is damaged: {error}"


_Where = tuple[str, tuple[Any, ...], int]
STRIDE_WHERE: Final = "WHERE step IS NULL OR step < ? OR (step - ?) % ? = 0 OR id > ?"
TAIL_ROWS: Final = 256
"""A sampled read also takes the last rows written (the last steps of every rank, up to 256 ranks),
so the charts of a long run end at its last step, not at the last multiple of k (review 13d)."""


def _stride_of(count: Any, first: Any, last_id: Any = None) -> _Where:
    """The WHERE clause that reads a long run's steps every k-th step (warm-up steps and the last
    :data:`TAIL_ROWS` rows, after ``last_id - TAIL_ROWS``, always), its parameters and k (1: every
    step), for ``count`` step rows whose smallest step is ``first``.

    Sampling is by design, not a loss: it is said by ``sampled_every`` (and the summary's
    ``steps.sampled_every``), never among the ``problems`` (which make the telemetry ``partial``).
    ``count`` is the rows written as the rowids say (:func:`_written`), not ``COUNT(*)``."""
    if not isinstance(count, int) or count <= th.MAX_STEP_ROWS or not isinstance(first, int):
        return "", (), 1
    k = math.ceil(count / th.MAX_STEP_ROWS)
    tail = min(TAIL_ROWS, th.MAX_STEP_ROWS // 64)  # a sliver of what is read
    tail_from = last_id - tail if isinstance(last_id, int) else count  # (ids count from 1)
    return STRIDE_WHERE, (first + th.WARMUP_STEPS, first, k, tail_from), k


def _one(conn: sqlite3.Connection, sql: str) -> tuple[Any, ...] | None:
    """The first row of ``sql`` over the step table; None when the table does not exist yet."""
    try:
        row: tuple[Any, ...] | None = conn.execute(sql.format(t=schema.STEP_TIME_SAMPLES.name)).fetchone()
        return row
    except sqlite3.OperationalError as e:
        if "no such" in str(e):
            return None
        raise


def _written(conn: sqlite3.Connection) -> tuple[int | None, int | None]:
    """The number of step rows written and the last one's id, from the rowid's bounds: two B-tree
    descents, where ``COUNT(*)`` walks every page of the table (60 ms at 8 ranks x 100,000 steps,
    a tenth of the Performance view's cold open, issue 13 item 5). The writer only appends
    (``AUTOINCREMENT`` ids, never a delete), so the span of the ids is the count; a table whose rows
    were deleted by hand counts as the rows it once held, which only makes the sampling stride
    larger. (None, None) without a table or a row."""
    # (one subquery per bound: SQLite answers a lone MIN or MAX from the B-tree, both in one SELECT by a scan)
    row = _one(conn, "SELECT (SELECT MIN(id) FROM {t}), (SELECT MAX(id) FROM {t})")
    if row is None or type(row[0]) is not int or type(row[1]) is not int:
        return None, None
    return row[1] - row[0] + 1, row[1]


def _stride(conn: sqlite3.Connection) -> tuple[_Where, StepSpan | None]:
    """:func:`_stride_of` from one pass over the step table that also gives the span of all steps."""
    row = _one(conn, "SELECT MIN(step), MAX(step), COUNT(DISTINCT step) FROM {t}")
    if row is None:
        return ("", (), 1), None
    first, last, distinct = row
    count, last_id = _written(conn)
    span = StepSpan(distinct, first, last) if isinstance(first, int) and isinstance(last, int) else None
    return _stride_of(count, first, last_id), span


def _calls(by_device: Any) -> int | None:
    """``n_calls`` of one event (the most over its devices), None when no device says."""
    if type(by_device) is not dict:
        return None
    most: int | None = None
    for stats in by_device.values():
        if type(stats) is dict and type(c := stats.get("n_calls")) is int and (most is None or c > most):
            most = c
    return most


def _step_rows(conn: sqlite3.Connection, problems: list[str], *, totals: bool,
               guess: bool) -> tuple[list[tuple[Any, ...]], _Where, StepSpan | None]:
    """The step rows to read (every k-th step of a long run), the WHERE they were read with, and
    the span of all steps (None without ``totals``).

    With ``totals`` one aggregate pass gives the count, the first step and the span. Without, the
    count is the rowids' span (:func:`_written`, no scan) and, with ``guess``, the first step is taken to be the
    first row's: the rows read then hold every row below that guess plus the warm-up steps (``step
    < first + WARMUP_STEPS``), so a guess that was not the smallest step (or a non-integer step at or
    below it) shows in them, and only then is ``MIN(step)`` asked and the rows read again with it."""
    table = schema.STEP_TIME_SAMPLES.name
    span: StepSpan | None = None
    if totals:
        where, span = _stride(conn)
    else:
        count, last_id = _written(conn)
        if not isinstance(count, int) or count <= th.MAX_STEP_ROWS:
            where = _stride_of(count, None)
        else:
            first_row = _one(conn, "SELECT step FROM {t} ORDER BY id LIMIT 1") if guess else None
            first = first_row[0] if first_row is not None else None
            if type(first) is not int:
                found = _one(conn, "SELECT MIN(step) FROM {t}")
                first = found[0] if found is not None else None
            where = _stride_of(count, first, last_id)
            rows = _select(conn, table, STEP_COLS, problems, where[0], where[1])
            if guess and isinstance(first, int) and where[2] > 1 and any(
                (type(step := r[2]) is int and step < first) or (type(step) is float and step <= first)
                for r in rows
            ):
                found = _one(conn, "SELECT MIN(step) FROM {t}")
                exact = found[0] if found is not None else None
                if type(exact) is not int or exact != first:
                    where = _stride_of(count, exact, last_id)
                    rows = _select(conn, table, STEP_COLS, problems, where[0], where[1])
            return rows, where, span
    return _select(conn, table, STEP_COLS, problems, where[0], where[1]), where, span


def _read(conn: sqlite3.Connection, path: str, *, totals: bool = True, guess: bool = False) -> Telemetry:
    problems: list[str] = []
    world_sizes: set[int] = set()
    step_rows, (where, params, stride), span = _step_rows(conn, problems, totals=totals, guess=guess)

    steps: dict[tuple[int | None, int], StepSample] = {}
    bad_step, bad_events = 0, 0
    for row in step_rows:
        ws = row[-1]
        if type(ws) is int:
            world_sizes.add(ws)
        sample = step_sample(row)
        if type(sample) is StepSample:
            steps[(sample.rank, sample.step)] = sample
        elif sample == "step":
            bad_step += 1
        else:
            bad_events += 1
    if bad_step:
        problems.append(f"{bad_step} step_time row(s) without an integer step left out")
    if bad_events:
        problems.append(f"{bad_events} step_time row(s) with unreadable events_json left out")

    memory: dict[tuple[int | None, str | None, int], MemorySample] = {}
    for g, r, step, device, ts, alloc, reserved, ws in _select(
        conn, schema.STEP_MEMORY_SAMPLES.name, MEMORY_COLS, problems, where, params
    ):
        # SQLite gives only int, float, str, bytes or None, so type() tests are _int/_rank's tests.
        if type(ws) is int:
            world_sizes.add(ws)
        if type(step) is not int:
            continue
        rank = g if type(g) is int else r if type(r) is int else None
        dev = device if type(device) is str else None
        memory[(rank, dev, step)] = MemorySample(
            rank, step, dev, ts if type(ts) is int else None,
            alloc if type(alloc) is float and alloc - alloc == 0.0 else _num(alloc),
            reserved if type(reserved) is float and reserved - reserved == 0.0 else _num(reserved),
        )

    process = []
    for row in _select(conn, schema.PROCESS_SAMPLES.name, PROCESS_COLS, problems):
        ws = row[12]  # world_size (PROCESS_COLS)
        if type(ws) is int:
            world_sizes.add(ws)
        process.append(process_sample(row))

    system = [system_sample(row) for row in _select(conn, schema.SYSTEM_SAMPLES.name, SYSTEM_COLS, problems)]
    gpus = [g for row in _select(conn, schema.SYSTEM_GPU_SAMPLES.name, GPU_COLS, problems)
            if (g := gpu_sample(row)) is not None]
    peaks = tuple(
        MemoryPeak(_rank(g, r), device if isinstance(device, str) else None, _num(alloc), _num(reserved),
                   _int(first), _int(last))
        for g, r, device, alloc, reserved, first, last in (_select_peaks(conn) if totals else ())
    )
    counts = {
        schema.STEP_TIME_SAMPLES.name: len(step_rows),
        schema.STEP_MEMORY_SAMPLES.name: len(memory),
        schema.PROCESS_SAMPLES.name: len(process),
        schema.SYSTEM_SAMPLES.name: len(system),
        schema.SYSTEM_GPU_SAMPLES.name: len(gpus),
    }
    empty = not any(counts.values())
    return Telemetry(
        path=path,
        status="empty" if empty else "ok",
        detail=f"{path} holds no telemetry rows yet" if empty else None,
        # (rank is None, rank or 0) is rank_key(rank), without a call per row.
        steps=tuple(sorted(steps.values(), key=lambda s: (s.rank is None, s.rank or 0, s.step))),
        memory=tuple(sorted(memory.values(), key=lambda m: (m.rank is None, m.rank or 0, m.step))),
        memory_peaks=peaks,
        sampled_every=stride,
        step_span=span,
        process=tuple(process),
        system=tuple(system),
        gpus=tuple(gpus),
        row_counts=counts,
        world_size=max(world_sizes) if world_sizes else None,
        problems=tuple(problems),
    )


def _select_peaks(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(
            "SELECT global_rank, rank, device, MAX(peak_alloc_bytes), MAX(peak_reserved_bytes), MIN(step), MAX(step) "
            f"FROM {schema.STEP_MEMORY_SAMPLES.name} GROUP BY global_rank, rank, device"
        ).fetchall()
    except sqlite3.OperationalError as e:
        if "no such" in str(e):
            return []
        raise


def rank_key(rank: int | None) -> tuple[bool, int]:
    """Sort key for ranks that puts an unknown rank (None) last."""
    return (rank is None, rank if rank is not None else 0)
