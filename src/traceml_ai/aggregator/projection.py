"""Projection: a normalised telemetry envelope → rows of the seven SQLite tables (DESIGN §3.1, 000 seed).

Pure functions, no I/O. The SQLite store and the export records (000 seed, ``records_from_payload``)
share this code so that a row and its record hold the same values.

A *projection* is one callable per rank stream::

    projection(meta, rows, observed_ns) -> Projected(tables={table_name: [row_tuple, ...]}, skipped=n)

``meta`` is the envelope's normalised identity (:class:`~traceml_ai.telemetry.envelope.Envelope`),
``rows`` the stream's list of row dicts and ``observed_ns`` the envelope's observed time (ns since
the Unix epoch). Each row tuple holds the table's columns in order (``telemetry.schema``, without
``id``); ``tables`` lists its tables in the writer's order (``schema.TABLES``).

Value rules (000 seed, "Common fields" and per-record tables):

- only a missing key or None is None; a measured 0 stays 0 (``0.0`` in a REAL column);
- INTEGER fields take ints, never bools, except the integer booleans ``gpu_available`` and
  ``distributed_initialized``, which take only True/False (as 1/0) and the ints 1 and 0; REAL fields
  take ints and floats (as float); TEXT fields take str; ``is_gpu`` takes a bool. A value
  of any other type (an object or list where a number belongs, a number where text belongs), or
  another int in a boolean field (3, -1), or an integer beyond 64 bits (SQLite's INTEGER), is one
  the record cannot hold: the row does not fit and is skipped, counted once (never coerced to None);
- keys a record does not have (a newer rank's fields, in a row or in an ``events`` stats map) are
  not read: ignoring them is forward compatibility, not a loss, and is not counted;
- the two exceptions the 000 seed names: ``timestamp_unix_ns`` is None unless the row carries an
  integer (a legacy float ``timestamp`` alone gives None), and ``step`` is None unless it is an
  integer;
- the identity fields come from the envelope's ``meta``, None when missing or null; an envelope
  whose identity field has another type does not normalise
  (:func:`~traceml_ai.telemetry.envelope.normalise`) and loses its rows, counted once;
- ``events`` stats always hold the five keys ``is_gpu, duration_ms, cpu_ms, gpu_ms, n_calls``,
  each None when the rank did not send it.

Losses (000 seed, ``skipped``) are counted in units, never silently:

- a row that does not fit (not a mapping; a field of the wrong type; an ``events`` map of the
  wrong shape; a ``gpus`` value or item of the wrong type, which drops its whole system row; a
  stdout/stderr ``line`` that is not a str) counts once, in :attr:`Projected.skipped`; the other
  rows of that stream are kept;
- a projection that raises counts once and that envelope loses all its rows for that
  projection's tables (handled by :func:`project_envelope`);
- an item that does not normalise to an envelope counts once (:func:`project_payload`); a table
  whose value is not a list of rows is not such an item: it counts once as its projection's loss
  and the envelope's other streams are kept (:func:`envelope_of`).

Empty stdout/stderr lines are not recorded and not counted: leaving them out is not a loss.
Rows of a stream no projection knows are counted per stream name in ``unknown_streams``.

These rules are the reference; :mod:`~traceml_ai.aggregator.fastpath` gives the same rows straight
from frame bytes for well-typed payloads (the server's hot path).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import msgspec

from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import Envelope, EnvelopeError, normalise, payload_items

Row = tuple[Any, ...]
"""One table row: the table's columns in order, without ``id``."""

TableRows = dict[str, list[Row]]
"""Rows per SQLite table name."""


class Projected(NamedTuple):
    """What one projection made of one stream's rows: rows per table and how many rows did not fit."""

    tables: TableRows
    skipped: int


Projection = Callable[[Mapping[str, Any], list[Any], int], Projected]
"""``projection(meta, rows, observed_ns) -> Projected``; may raise (the caller counts it once)."""


class RowMismatch(ValueError):
    """A row does not fit its table; the projection counts it once in ``skipped`` and goes on."""


# -- value readers ------------------------------------------------------------------------------------
# Fast paths on exact types (msgpack gives plain int/float/str); the isinstance fallbacks keep
# int/float subclasses (IntEnum, numpy.float64) working for in-process callers.


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""An INTEGER column (SQLite's, and so the record's) holds a signed 64-bit integer."""


def _int(value: Any) -> int | None:
    if type(value) is int:
        if INT64_MIN <= value <= INT64_MAX:
            return value
        raise _too_wide(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _int(int(value))
    return None


def _too_wide(value: int) -> RowMismatch:
    return RowMismatch(f"the integer {value} is beyond 64 bits, which its record cannot hold")


int_or_none = _int
"""``value`` when it is an int (not a bool), else None: how ``step``, ``timestamp_unix_ns`` and identity are read."""


def _text(value: Any) -> str | None:
    if type(value) is str or isinstance(value, str):
        return str(value)
    return None


def _mismatch(column: str, value: Any) -> RowMismatch:
    return RowMismatch(f"{column!r} holds a {type(value).__name__}, which its record cannot hold")


def _int_field(value: Any, column: str) -> int | None:
    """An INTEGER field of a row: None when missing or null, the int, else the row does not fit."""
    if value is None:
        return None
    if type(value) is int:
        if INT64_MIN <= value <= INT64_MAX:
            return value
        raise _too_wide(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_field(int(value), column)
    raise _mismatch(column, value)


def _real_field(value: Any, column: str) -> float | None:
    """A REAL field of a row: None when missing or null, an int or float as float, else the row does not fit."""
    kind = type(value)
    if kind is float or value is None:
        return value  # type: ignore[no-any-return]
    if kind is int or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return float(value)
    raise _mismatch(column, value)


def _text_field(value: Any, column: str) -> str | None:
    """A TEXT field of a row: None when missing or null, the str, else the row does not fit."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    raise _mismatch(column, value)


def _flag_field(value: Any, column: str) -> int | None:
    """An integer-boolean field (000 seed: "1 or 0"): None when missing or null, True/False as 1/0,
    the int 1 or 0; any other value (3, -1, 0.0, a str) is one the record cannot hold: the row does
    not fit."""
    if value is None:
        return None
    if value is True or value is False:
        return 1 if value else 0
    if isinstance(value, int) and value in (0, 1):
        return int(value)
    raise _mismatch(column, value) if not isinstance(value, int) else RowMismatch(
        f"{column!r} holds {value!r}, and its record holds only 1 or 0")


def _bool_field(value: Any, column: str) -> bool | None:
    """A bool field (``is_gpu``): None when missing or null, True/False; anything else (1, "yes")
    is a value its record cannot hold (upstream's sampler sends ``bool(is_gpu)``)."""
    if value is None or value is True or value is False:
        return value
    raise _mismatch(column, value)


def identity_columns(meta: Mapping[str, Any]) -> tuple[Any, ...]:
    """``(global_rank, local_rank, world_size, local_world_size, node_rank, hostname)`` from a
    normalised ``meta`` (its types already checked by ``normalise``): ints and a str, None when
    missing or null."""
    return (
        _int(meta.get("global_rank")),
        _int(meta.get("local_rank")),
        _int(meta.get("world_size")),
        _int(meta.get("local_world_size")),
        _int(meta.get("node_rank")),
        _text(meta.get("hostname")),
    )


def _row_map(row: Any) -> Mapping[str, Any]:
    if type(row) is dict or isinstance(row, Mapping):
        return row
    raise RowMismatch(f"a row is a mapping, not {type(row).__name__}")


# -- events map (step_time) ---------------------------------------------------------------------------


def _in_normal_form(events: dict[Any, Any]) -> bool:
    """True when ``events`` is already a normalised events map: plain dicts, str names and devices,
    exactly the five stats keys, each value None or of its type (floats as float)."""
    # Five entries of which none is missing are exactly the five keys: cheaper than comparing key
    # sets, and this runs for every phase of every step (benchmarks/bench_export.py).
    try:
        for name, by_device in events.items():
            if type(name) is not str or type(by_device) is not dict:
                return False
            for device, stats in by_device.items():
                if type(device) is not str or type(stats) is not dict or len(stats) != 5:
                    return False
                value = stats["is_gpu"]
                if not (value is None or value is True or value is False):
                    return False
                value = stats["duration_ms"]
                if not (value is None or type(value) is float):
                    return False
                value = stats["cpu_ms"]
                if not (value is None or type(value) is float):
                    return False
                value = stats["gpu_ms"]
                if not (value is None or type(value) is float):
                    return False
                value = stats["n_calls"]
                if not (value is None or (type(value) is int and INT64_MIN <= value <= INT64_MAX)):
                    return False
    except KeyError:  # one of the five keys is missing
        return False
    return True


def normalise_events(events: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """The events map of a step_time row in its normalised form (000 seed, StepTimeRecord).

    ``events[name][device]`` becomes ``{"is_gpu": bool|None, "duration_ms": float|None,
    "cpu_ms": float|None, "gpu_ms": float|None, "n_calls": int|None}`` (ms; None when not sent;
    other keys dropped). A missing or None ``events`` gives ``{}``. A map already in that form (plain
    dicts, exactly the five keys, each value of its type: what a rank sends) is checked and returned
    as it is, not copied.

    Raises:
        RowMismatch: ``events`` is not a mapping of str → mapping of str → mapping.
    """
    if events is None:
        return {}
    if type(events) is dict and _in_normal_form(events):
        return events  # what ranks send: checked, not copied
    return _rebuild_events(events)


def _rebuild_events(events: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`normalise_events` of a map that is not in normal form: a new map, or RowMismatch."""
    if type(events) is not dict and not isinstance(events, Mapping):
        raise RowMismatch("step_time 'events' is not a mapping")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, by_device in events.items():
        if type(name) is not str or (type(by_device) is not dict and not isinstance(by_device, Mapping)):
            raise RowMismatch(f"step_time event {name!r} is not a mapping of device → stats")
        devices: dict[str, dict[str, Any]] = {}
        for device, stats in by_device.items():
            if type(device) is not str or (type(stats) is not dict and not isinstance(stats, Mapping)):
                raise RowMismatch(f"step_time event {name!r} device {device!r} has no stats mapping")
            # Inline fast paths: this runs for every phase of every step, and a call per value
            # costs more than the check itself (benchmarks/bench_aggregator.py).
            get = stats.get
            is_gpu = get("is_gpu")
            duration = get("duration_ms")
            cpu = get("cpu_ms")
            gpu = get("gpu_ms")
            calls = get("n_calls")
            devices[device] = {
                "is_gpu": is_gpu if (is_gpu is None or is_gpu is True or is_gpu is False)
                else _bool_field(is_gpu, "is_gpu"),
                "duration_ms": duration if (duration is None or type(duration) is float)
                else _real_field(duration, "duration_ms"),
                "cpu_ms": cpu if (cpu is None or type(cpu) is float) else _real_field(cpu, "cpu_ms"),
                "gpu_ms": gpu if (gpu is None or type(gpu) is float) else _real_field(gpu, "gpu_ms"),
                "n_calls": calls if (calls is None or (type(calls) is int and INT64_MIN <= calls <= INT64_MAX))
                else _int_field(calls, "n_calls"),
            }
        out[name] = devices
    return out


_json = msgspec.json.Encoder()


def events_json(events: Mapping[str, Any]) -> str:
    """Compact JSON text of a normalised events map (the ``events_json`` column).

    Non-finite floats (NaN, ±inf) become ``null``: JSON has no such numbers and readers would fail.
    """
    return _json.encode(events).decode("utf-8")


# -- the projections ----------------------------------------------------------------------------------


def _with_rank(meta: Mapping[str, Any], observed_ns: int) -> tuple[Any, ...]:
    ident = identity_columns(meta)
    return (observed_ns, ident[0], *ident)


def project_step_time(
    meta: Mapping[str, Any], rows: list[Any], observed_ns: int, *, encode_events: bool = True
) -> Projected:
    """``step_time`` rows → ``step_time_samples``.

    With ``encode_events`` (the SQLite row) the last column is :func:`events_json` text; without it
    the last column is the normalised events map itself (what ``StepTimeRecord.events`` holds).
    """
    head = _with_rank(meta, observed_ns)
    out: list[Row] = []
    add = out.append
    skipped = 0
    normal_form = _in_normal_form
    encode = _json.encode if encode_events else None
    # The common case (a plain dict row of plain ints and a normal-form events map) is checked
    # inline: this loop runs once per training step of every rank, and each helper call costs
    # about as much as its check (benchmarks/bench_export.py).
    for raw in rows:
        try:
            get = (raw if type(raw) is dict else _row_map(raw)).get
            events = get("events")
            if type(events) is not dict or not normal_form(events):
                events = {} if events is None else _rebuild_events(events)
            ts = get("timestamp_unix_ns")
            seq = get("seq")
            step = get("step")
            add((
                *head,
                ts if (type(ts) is int and INT64_MIN <= ts <= INT64_MAX) else _int(ts),
                seq if (seq is None or (type(seq) is int and INT64_MIN <= seq <= INT64_MAX))
                else _int_field(seq, "seq"),
                step if (type(step) is int and INT64_MIN <= step <= INT64_MAX) else _int(step),
                events if encode is None else encode(events).decode("utf-8"),
            ))
        except RowMismatch:
            skipped += 1
    return Projected({schema.STEP_TIME_SAMPLES.name: out}, skipped)


def project_step_memory(meta: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
    """``step_memory`` rows → ``step_memory_samples`` (peaks in bytes)."""
    head = _with_rank(meta, observed_ns)
    out: list[Row] = []
    skipped = 0
    for raw in rows:
        try:
            get = _row_map(raw).get
            out.append(
                (
                    *head,
                    _int(get("timestamp_unix_ns")),
                    _int_field(get("seq"), "seq"),
                    _text_field(get("device"), "device"),
                    _int(get("step")),
                    _real_field(get("peak_alloc_bytes"), "peak_alloc_bytes"),
                    _real_field(get("peak_reserved_bytes"), "peak_reserved_bytes"),
                )
            )
        except RowMismatch:
            skipped += 1
    return Projected({schema.STEP_MEMORY_SAMPLES.name: out}, skipped)


def project_system(meta: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
    """``system`` rows → ``system_samples`` plus one ``system_gpu_samples`` row per ``gpus`` item.

    ``gpu_idx`` is the item's position in ``gpus``. The GPUs are part of their snapshot's row: a
    ``gpus`` value that is not a list, an item that is not a mapping or an item field of the wrong
    type makes the whole row not fit (host and GPUs left out, counted once in ``skipped``).
    """
    head = (observed_ns, *identity_columns(meta))
    hosts: list[Row] = []
    gpus: list[Row] = []
    skipped = 0
    for raw in rows:
        try:
            get = _row_map(raw).get
            ts = _int(get("timestamp_unix_ns"))
            seq = _int_field(get("seq"), "seq")
            host = (
                *head,
                ts,
                seq,
                _real_field(get("cpu_percent"), "cpu_percent"),
                _real_field(get("ram_used_bytes"), "ram_used_bytes"),
                _real_field(get("ram_total_bytes"), "ram_total_bytes"),
                _flag_field(get("gpu_available"), "gpu_available"),
                _int_field(get("gpu_count"), "gpu_count"),
            )
            items = get("gpus")
            row_gpus: list[Row] = []
            if items is not None:
                if type(items) is not list:
                    raise _mismatch("gpus", items)
                for idx, item in enumerate(items):
                    if not isinstance(item, Mapping):
                        raise _mismatch(f"gpus[{idx}]", item)
                    gget = item.get
                    row_gpus.append(
                        (
                            *head,
                            ts,
                            seq,
                            idx,
                            _real_field(gget("util"), "util"),
                            _real_field(gget("mem_used_bytes"), "mem_used_bytes"),
                            _real_field(gget("mem_total_bytes"), "mem_total_bytes"),
                            _real_field(gget("temperature_c"), "temperature_c"),
                            _real_field(gget("power_usage_w"), "power_usage_w"),
                            _real_field(gget("power_limit_w"), "power_limit_w"),
                        )
                    )
        except RowMismatch:
            skipped += 1
            continue
        hosts.append(host)
        gpus.extend(row_gpus)
    return Projected({schema.SYSTEM_SAMPLES.name: hosts, schema.SYSTEM_GPU_SAMPLES.name: gpus}, skipped)


def project_process(meta: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
    """``process`` rows → ``process_samples`` (cpu_percent of one core, memory in bytes)."""
    head = _with_rank(meta, observed_ns)
    out: list[Row] = []
    skipped = 0
    for raw in rows:
        try:
            get = _row_map(raw).get
            out.append(
                (
                    *head,
                    _int(get("timestamp_unix_ns")),
                    _int_field(get("seq"), "seq"),
                    _real_field(get("cpu_percent"), "cpu_percent"),
                    _int_field(get("cpu_logical_core_count"), "cpu_logical_core_count"),
                    _real_field(get("ram_used_bytes"), "ram_used_bytes"),
                    _real_field(get("ram_total_bytes"), "ram_total_bytes"),
                    _flag_field(get("gpu_available"), "gpu_available"),
                    _int_field(get("gpu_count"), "gpu_count"),
                    _int_field(get("gpu_device_index"), "gpu_device_index"),
                    _real_field(get("gpu_mem_used_bytes"), "gpu_mem_used_bytes"),
                    _real_field(get("gpu_mem_reserved_bytes"), "gpu_mem_reserved_bytes"),
                    _real_field(get("gpu_mem_total_bytes"), "gpu_mem_total_bytes"),
                )
            )
        except RowMismatch:
            skipped += 1
    return Projected({schema.PROCESS_SAMPLES.name: out}, skipped)


def project_runtime_environment(meta: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
    """``runtime_environment`` rows → ``runtime_environment`` (``pid`` from ``meta``)."""
    head = (*_with_rank(meta, observed_ns), _int(meta.get("pid")))
    out: list[Row] = []
    skipped = 0
    for raw in rows:
        try:
            get = _row_map(raw).get
            out.append(
                (
                    *head,
                    _int(get("timestamp_unix_ns")),
                    _int_field(get("seq"), "seq"),
                    _text_field(get("topology"), "topology"),
                    _flag_field(get("distributed_initialized"), "distributed_initialized"),
                    _text_field(get("distributed_backend"), "distributed_backend"),
                    _text_field(get("training_strategy"), "training_strategy"),
                    _text_field(get("strategy_source"), "strategy_source"),
                    _text_field(get("strategy_confidence"), "strategy_confidence"),
                )
            )
        except RowMismatch:
            skipped += 1
    return Projected({schema.RUNTIME_ENVIRONMENT_TABLE.name: out}, skipped)


def project_stdout_stderr(meta: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
    """``stdout_stderr`` rows → ``stdout_stderr_samples`` (``rank`` = ``global_rank``).

    Empty lines are not recorded (and not counted); a ``line`` that is not a str does not fit.
    The extra row key ``stream`` ("stdout"/"stderr") is not a column (see :func:`rank_log_lines`).
    """
    rank = _int(meta.get("global_rank"))
    out: list[Row] = []
    skipped = 0
    for raw in rows:
        try:
            get = _row_map(raw).get
        except RowMismatch:
            skipped += 1
            continue
        line = get("line")
        if not isinstance(line, str):
            skipped += 1
            continue
        if not line:
            continue
        try:
            out.append((observed_ns, rank, _int(get("timestamp_unix_ns")), line))
        except RowMismatch:
            skipped += 1
    return Projected({schema.STDOUT_STDERR_SAMPLES.name: out}, skipped)


PROJECTIONS: dict[str, Projection] = {
    schema.STEP_TIME: project_step_time,
    schema.STEP_MEMORY: project_step_memory,
    schema.SYSTEM: project_system,
    schema.PROCESS: project_process,
    schema.RUNTIME_ENVIRONMENT: project_runtime_environment,
    schema.STDOUT_STDERR: project_stdout_stderr,
}
"""The SQLite projections, one per rank stream (``schema.RANK_STREAMS``)."""

PROJECTION_TABLES: dict[str, tuple[str, ...]] = {
    stream: tuple(t.name for t in schema.TABLES if t.stream == stream) for stream in schema.RANK_STREAMS
}
"""The tables each stream's projection writes, in the writer's order."""

_TABLE_ORDER = tuple(t.name for t in schema.TABLES)


_V = TypeVar("_V")


def in_writer_order(tables: dict[str, _V]) -> dict[str, _V]:
    """``tables`` ordered as ``schema.TABLES``; names outside it (custom projections) follow."""
    ordered = {name: tables[name] for name in _TABLE_ORDER if name in tables}
    ordered.update((name, rows) for name, rows in tables.items() if name not in ordered)
    return ordered


# -- envelopes and payloads ---------------------------------------------------------------------------


def envelope_of(item: Any) -> tuple[Envelope, tuple[str, ...]]:
    """One payload item as an :class:`Envelope`, and the names of its tables whose value is not a
    list of rows ("bad tables", left out of the envelope).

    A bad table is a loss of the projection that would read it, not of the whole item (000 seed:
    "That envelope loses all of its rows for the tables that projection writes"), so
    :func:`project_envelope` counts it once, like a projection that raised, and the envelope's
    other streams are kept. Well-formed items cost one :func:`normalise` call, as before.

    Raises:
        EnvelopeError: the item is not a mapping, ``meta`` is not a mapping, ``tables`` is missing
            or not a mapping, or a table name is not a str.
    """
    try:
        return normalise(item), ()
    except EnvelopeError:
        tables = item.get("tables") if isinstance(item, Mapping) else None
        if not isinstance(tables, Mapping) or not all(isinstance(name, str) for name in tables):
            raise
        bad = tuple(name for name, rows in tables.items() if not isinstance(rows, list))
        if not bad:
            raise
        good = {name: rows for name, rows in tables.items() if isinstance(rows, list)}
        return normalise({**item, "tables": good}), bad


@dataclass
class EnvelopeRows:
    """The rows of one envelope: per table in the writer's order, plus its losses.

    ``skipped`` counts rows that did not fit plus projections that raised (000 seed units);
    ``unknown_streams`` maps a stream name no projection knows to its number of rows;
    ``failures`` holds one ``"<stream>: <error>"`` line per projection that raised.
    """

    tables: TableRows
    skipped: int = 0
    unknown_streams: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def project_envelope(
    envelope: Envelope,
    observed_ns: int,
    *,
    projections: Mapping[str, Projection] = PROJECTIONS,
    streams: Collection[str] | None = None,
    bad_tables: tuple[str, ...] = (),
) -> EnvelopeRows:
    """Project every stream of ``envelope`` (DESIGN §3.1).

    ``streams`` (rank stream names) limits the work to those streams; the others are neither
    projected nor counted, because leaving them out is not a loss (000 seed, stream selection).
    ``projections`` lets the export records substitute their own step_time projection.
    A projection that raises counts once in ``skipped`` and its tables get no rows from this
    envelope; so does each of ``bad_tables`` (streams whose value was not a list of rows, from
    :func:`envelope_of`) that a projection reads, when selected. The returned ``tables`` are
    ordered as ``schema.TABLES``.
    """
    found: TableRows = {}
    out = EnvelopeRows(found)
    meta = envelope.meta
    for stream in bad_tables:
        if streams is not None and stream not in streams:
            continue
        if stream in projections:
            out.skipped += 1  # as if its projection raised: the envelope loses that projection's rows
            out.failures.append(f"{stream}: the table is not a list of rows")
        else:
            out.unknown_streams[stream] = out.unknown_streams.get(stream, 0) + 1
    for stream, rows in envelope.tables.items():
        if streams is not None and stream not in streams:
            continue
        projection = projections.get(stream)
        if projection is None:
            out.unknown_streams[stream] = out.unknown_streams.get(stream, 0) + len(rows)
            continue
        try:
            projected = projection(meta, rows, observed_ns)
        except Exception as exc:  # a projection bug loses this envelope's rows of its tables, counted once
            out.skipped += 1
            out.failures.append(f"{stream}: {type(exc).__name__}: {exc}")
            continue
        out.skipped += projected.skipped
        for table, table_rows in projected.tables.items():
            if table_rows:
                found.setdefault(table, []).extend(table_rows)
    if len(found) > 1:
        out.tables = in_writer_order(found)
    return out


@dataclass
class PayloadRows:
    """The rows of one payload: per table (payload order within a table) plus its losses.

    ``skipped`` is the 000 seed's count (bad items, raising projections, rows that did not fit);
    ``rows`` the number of table rows made; ``envelopes`` how many items normalised.
    """

    tables: TableRows
    rows: int = 0
    envelopes: int = 0
    skipped: int = 0
    unknown_streams: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def project_payload(
    payload: Any,
    *,
    observed_ns: int | None = None,
    projections: Mapping[str, Projection] = PROJECTIONS,
    streams: Collection[str] | None = None,
) -> PayloadRows:
    """Project one admitted telemetry payload (one envelope dict or a list of them) to table rows.

    Each envelope is stamped with ``observed_ns`` when given, else ``time.time_ns()`` once per
    envelope. An item that does not normalise (:func:`~traceml_ai.telemetry.envelope.normalise`)
    counts once in ``skipped``; see :func:`project_envelope` for the rest.

    Raises:
        TypeError: ``observed_ns`` is neither None nor an int (a bool is refused), before any
            item is looked at. Nothing else raises: losses are counted in ``skipped``.
    """
    if observed_ns is not None and (type(observed_ns) is not int):
        if not isinstance(observed_ns, int) or isinstance(observed_ns, bool):
            raise TypeError(f"observed_ns must be an int (ns since the Unix epoch) or None, "
                            f"not {type(observed_ns).__name__} {observed_ns!r}")
        observed_ns = int(observed_ns)
    tables: TableRows = {}
    out = PayloadRows(tables)
    for item in payload_items(payload):
        try:
            envelope, bad_tables = envelope_of(item)
        except EnvelopeError as exc:
            out.skipped += 1
            out.failures.append(f"envelope: {exc}")
            continue
        out.envelopes += 1
        env_rows = project_envelope(
            envelope,
            time.time_ns() if observed_ns is None else observed_ns,
            projections=projections,
            streams=streams,
            bad_tables=bad_tables,
        )
        out.skipped += env_rows.skipped
        out.failures.extend(env_rows.failures)
        for stream, count in env_rows.unknown_streams.items():
            out.unknown_streams[stream] = out.unknown_streams.get(stream, 0) + count
        for table, table_rows in env_rows.tables.items():
            out.rows += len(table_rows)
            have = tables.get(table)
            if have is None:
                tables[table] = table_rows
            else:
                have.extend(table_rows)
    if len(tables) > 1:
        out.tables = in_writer_order(tables)
    return out


def rank_log_lines(envelope: Envelope) -> list[tuple[int | None, str]]:
    """The lines of ``<run_dir>/aggregator/rank_<global_rank>.log`` in one envelope.

    Each stdout_stderr row with a non-empty str ``line`` gives ``(global_rank, text)`` where text is
    ``"stdout | <line>"`` or ``"stderr | <line>"`` after the row's extra ``stream`` key, and the bare
    line when the row does not say which stream. Trailing newlines are removed.
    """
    rows = envelope.tables.get(schema.STDOUT_STDERR)
    if not rows:
        return []
    rank = _int(envelope.meta.get("global_rank"))
    out: list[tuple[int | None, str]] = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        line = row.get("line")
        if not isinstance(line, str) or not line:
            continue
        text = line.rstrip("\r\n")
        which = row.get("stream")
        if which == "stdout" or which == "stderr":
            text = f"{which} | {text}"
        out.append((rank, text))
    return out
