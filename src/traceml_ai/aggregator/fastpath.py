"""Typed decoding of a payload frame straight into table rows: the aggregator's hot path.

:func:`project_frame` decodes a frame body with msgspec into typed row structs (decoding and type
checking in C) and makes the same rows as :func:`~traceml_ai.aggregator.projection.project_payload`
would from the generically decoded payload, several times faster for the high-volume streams
(benchmarks/bench_aggregator.py). The rows come as one :class:`~traceml_ai.aggregator.store.RowBlock`
per envelope and table (the envelope's observed time and identity once, the rest of each row flat),
which is how the store writes them fastest; :meth:`FrameRows.table_rows` gives them as tuples.

It handles only well-formed payloads: when any value in the frame has a type the structs do not
take (a bool where an int belongs, a float step, a row that is not a map, ...) it returns None and
the caller takes the generic path, whose rules are the reference. The two paths give identical
rows, counts and log lines (tests/aggregator/test_fastpath.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from msgspec.structs import astuple

from traceml_ai.aggregator.projection import TableRows, identity_columns, in_writer_order, int_or_none
from traceml_ai.aggregator.store import RowBlock
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import EnvelopeError, normalise

Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
"""An int an INTEGER column holds; a wider one fails the typed decode, and the reference projection
then skips its row (msgpack itself decodes up to 2**64 - 1)."""

# Field order of each row struct is the table's column order where the tuple is built with astuple.
# gc=False: decoded rows never form reference cycles, and untracked structs decode faster.


class _Stats(msgspec.Struct, gc=False):
    is_gpu: bool | None = None
    duration_ms: float | None = None
    cpu_ms: float | None = None
    gpu_ms: float | None = None
    n_calls: Int64 | None = None


class _StepTimeRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    seq: Int64 | None = None
    step: Int64 | None = None
    events: dict[str, dict[str, _Stats]] | None = None


class _StepMemoryRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    seq: Int64 | None = None
    device: str | None = None
    step: Int64 | None = None
    peak_alloc_bytes: float | None = None
    peak_reserved_bytes: float | None = None


class _Gpu(msgspec.Struct, gc=False):
    util: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    temperature_c: float | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None


class _SystemRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    seq: Int64 | None = None
    cpu_percent: float | None = None
    ram_used_bytes: float | None = None
    ram_total_bytes: float | None = None
    gpu_available: bool | int | None = None
    gpu_count: Int64 | None = None
    gpus: list[_Gpu] | None = None


class _ProcessRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    seq: Int64 | None = None
    cpu_percent: float | None = None
    cpu_logical_core_count: Int64 | None = None
    ram_used_bytes: float | None = None
    ram_total_bytes: float | None = None
    gpu_available: bool | int | None = None
    gpu_count: Int64 | None = None
    gpu_device_index: Int64 | None = None
    gpu_mem_used_bytes: float | None = None
    gpu_mem_reserved_bytes: float | None = None
    gpu_mem_total_bytes: float | None = None


class _RuntimeRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    seq: Int64 | None = None
    topology: str | None = None
    distributed_initialized: bool | int | None = None
    distributed_backend: str | None = None
    training_strategy: str | None = None
    strategy_source: str | None = None
    strategy_confidence: str | None = None


class _StdoutRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: Int64 | None = None
    line: str | None = None
    stream: Any = None


class _Envelope(msgspec.Struct, gc=False):
    tables: dict[str, msgspec.Raw]
    meta: dict[str, Any] | None = None
    # A map with both "control" and "tables" is ambiguous; the generic path decides what it is.
    control: Any = msgspec.UNSET


_frame_decoder = msgspec.msgpack.Decoder(list[_Envelope] | _Envelope)
_any_decoder = msgspec.msgpack.Decoder()
_row_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
    schema.STEP_TIME: msgspec.msgpack.Decoder(list[_StepTimeRow]),
    schema.STEP_MEMORY: msgspec.msgpack.Decoder(list[_StepMemoryRow]),
    schema.SYSTEM: msgspec.msgpack.Decoder(list[_SystemRow]),
    schema.PROCESS: msgspec.msgpack.Decoder(list[_ProcessRow]),
    schema.RUNTIME_ENVIRONMENT: msgspec.msgpack.Decoder(list[_RuntimeRow]),
    schema.STDOUT_STDERR: msgspec.msgpack.Decoder(list[_StdoutRow]),
}
_json = msgspec.json.Encoder()

# -- step_time rows whose phases all ran on one device -------------------------------------------------
# A rank times every phase of a step on the step's device, so its events map is
# {phase: {device: stats}} with the same single device throughout. Decoding the inner map into a
# struct whose one field is named after that device (instead of a dict with a str key) makes the
# step_time rows decode in about two thirds of the time, and encodes to the same JSON text. A row
# of any other shape fails that decoder and the rows are decoded again with the general one.

_MAX_DEVICE_DECODERS = 64  # device names come from the ranks: bound the classes made for them
_device_decoders: dict[str, msgspec.msgpack.Decoder[Any] | None] = {}
_device_frame_decoders: dict[str, msgspec.msgpack.Decoder[Any] | None] = {}
_recent_devices: list[str] = []  # most recent first, a few

# The rows of every known stream, for a frame decoded in one pass (_device_frame_decoder).
_TYPED_STREAMS: tuple[tuple[str, Any], ...] = (
    (schema.STEP_MEMORY, _StepMemoryRow),
    (schema.SYSTEM, _SystemRow),
    (schema.PROCESS, _ProcessRow),
    (schema.RUNTIME_ENVIRONMENT, _RuntimeRow),
    (schema.STDOUT_STDERR, _StdoutRow),
)


def _device_frame_decoder(device: str) -> msgspec.msgpack.Decoder[Any] | None:
    """A decoder of whole payload frames whose step_time rows all hold ``device`` only, and whose
    tables are all known streams; None when ``device`` has no single-device row decoder.

    One pass over the frame: the envelope decoder keeps each table as raw bytes and decodes
    them again, which costs about a fifth of a mixed frame's decoding (benchmarks/bench_aggregator.py).
    A frame of any other shape fails it (an unknown stream, another device, a table that is not a
    list of rows) and takes the two-pass decoding.
    """
    if device in _device_frame_decoders:
        return _device_frame_decoders[device]
    rows = _device_decoder(device)
    decoder: msgspec.msgpack.Decoder[Any] | None = None
    if rows is not None:
        row_type = rows.type.__args__[0]  # list[row]
        tables = msgspec.defstruct(
            "_TypedTables",
            [(name, list[row] | msgspec.UnsetType, msgspec.UNSET)  # type: ignore[valid-type]
             for name, row in ((schema.STEP_TIME, row_type), *_TYPED_STREAMS)],
            forbid_unknown_fields=True, gc=False,
        )
        envelope = msgspec.defstruct(
            "_TypedEnvelope",
            [("tables", tables), ("meta", dict[str, Any] | None, None), ("control", Any, msgspec.UNSET)],
            gc=False,
        )
        decoder = msgspec.msgpack.Decoder(list[envelope] | envelope)  # type: ignore[valid-type]
    _device_frame_decoders[device] = decoder
    return decoder


def _device_decoder(device: str) -> msgspec.msgpack.Decoder[Any] | None:
    """A decoder of step_time rows whose every phase holds exactly ``device``; None when there is none."""
    if device in _device_decoders:
        return _device_decoders[device]
    if len(_device_decoders) >= _MAX_DEVICE_DECODERS:
        return None
    decoder: msgspec.msgpack.Decoder[Any] | None = None
    try:
        one = msgspec.defstruct(
            "_OnDevice", [("stats", _Stats)], rename={"stats": device}, forbid_unknown_fields=True, gc=False
        )
        probe = _Stats(True, 1.5, 0.25, None, 1)
        # The field name is encoded by msgspec's struct code, a dict key by its dict code: use the
        # struct only where both give the same text.
        if _json.encode(one(probe)) == _json.encode({device: probe}):
            row = msgspec.defstruct(
                "_StepTimeRowOnDevice",
                [("timestamp_unix_ns", Int64 | None, None), ("seq", Int64 | None, None), ("step", Int64 | None, None),
                 ("events", dict[str, one] | None, None)],  # type: ignore[valid-type]
                gc=False,
            )
            decoder = msgspec.msgpack.Decoder(list[row])  # type: ignore[valid-type]
    except (TypeError, ValueError):  # a name msgspec does not take as a field name
        decoder = None
    _device_decoders[device] = decoder
    return decoder


def _step_time_rows(raw: msgspec.Raw, local_rank: int | None) -> tuple[list[Any], str | None]:
    """The step_time rows of ``raw``: typed rows whose ``events`` encode to the generic JSON text,
    and the one device all their phases hold when a single-device decoder read them (else None).

    Tries the single-device decoders of the devices seen last and of the rank's own device
    (``cuda:<local_rank>``, else ``cpu``), at most :data:`_MAX_GUESSES`, then the general decoder.
    A failed try stops at the first row that does not fit, so it costs little.

    Raises:
        msgspec.DecodeError: the rows do not fit even the general decoder.
    """
    guesses = list(_recent_devices)
    own = f"cuda:{local_rank}" if local_rank is not None else "cpu"
    if own not in guesses:
        guesses.insert(1, own)
    for device in guesses[:_MAX_GUESSES]:
        decoder = _device_decoder(device)
        if decoder is None:
            continue
        try:
            rows: list[Any] = decoder.decode(raw)
        except msgspec.ValidationError:
            continue
        _remember(device)
        return rows, device
    rows = _row_decoders[schema.STEP_TIME].decode(raw)
    # Learn a device the guesses missed (a rank on "cuda:0" whatever its local rank, "mps", ...)
    # from the first row that has one, so the next frame of that rank takes the fast decoder.
    events = next((r.events for r in rows if r.events), None)
    if events:
        devices = next(iter(events.values()))
        learnt: str | None = next(iter(devices)) if len(devices) == 1 else None
        if learnt is not None and _device_decoder(learnt) is not None:
            _remember(learnt)
    return rows, None


_MAX_GUESSES = 3


def _remember(device: str) -> None:
    if _recent_devices[:1] != [device]:
        _recent_devices[:] = [device, *(d for d in _recent_devices if d != device)][:_MAX_GUESSES]


def _flag(value: bool | int | None) -> int | None:
    """An integer-boolean field: 1/0 for True/False, 1, 0 or None; another int (3) is the generic
    path's to count as a row that does not fit."""
    if value is True:
        return 1
    if value is False:
        return 0
    if value is None or value == 0 or value == 1:
        return value
    raise _NotTyped


@dataclass
class FrameRows:
    """The rows of a payload frame, as :class:`~traceml_ai.aggregator.projection.PayloadRows` counts
    them, plus what the server needs from the frame.

    ``tables``: per table name (writer's order), one :class:`~traceml_ai.aggregator.store.RowBlock`
    per envelope that has rows for it (head: observed time and identity columns);
    ``rows``, ``envelopes``, ``skipped``, ``unknown_streams``, ``failures``: as in ``PayloadRows``;
    ``session_ids``: every ``meta.session_id`` the envelopes name (None: an envelope without one);
    ``log_lines``: ``(global_rank, text)`` lines for ``rank_<g>.log``, as
    :func:`~traceml_ai.aggregator.projection.rank_log_lines` makes them;
    ``device``: the one device of the frame's step_time rows when a single-device decoder read
    them all (give it back as ``project_frame(..., device=)`` for the rank's next frame).
    """

    tables: dict[str, list[RowBlock]]
    rows: int = 0
    envelopes: int = 0
    skipped: int = 0
    unknown_streams: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    session_ids: set[Any] = field(default_factory=set)
    log_lines: list[tuple[int | None, str]] = field(default_factory=list)
    device: str | None = None

    def table_rows(self) -> TableRows:
        """``tables`` with each block's rows as full tuples: what ``project_payload`` gives."""
        return {name: [row for block in blocks for row in block.rows()] for name, blocks in self.tables.items()}


class _NotTyped(Exception):
    """The frame is not a well-formed payload; the generic path must handle it."""


def project_frame(
    data: bytes | memoryview, *, observed_ns: int | None = None, device: str | None = None
) -> FrameRows | None:
    """Rows of a payload frame body, or None when only the generic path can handle the frame.

    None is returned for control frames, bodies that are not msgpack, and payloads holding any
    value the typed rows do not take. Each envelope is stamped with ``observed_ns`` when given,
    else ``time.time_ns()`` once per envelope. ``device``: the step_time device of the rank's
    previous frame (its :attr:`FrameRows.device`), so that a frame like it is decoded in one
    pass; the rows are the same with or without it. Never raises.
    """
    try:
        if device is not None:
            typed = _device_frame_decoder(device)
            if typed is not None:
                try:
                    decoded = typed.decode(data)
                except msgspec.ValidationError:
                    pass  # another shape: the two-pass decoding below decides
                else:
                    envelopes = decoded if isinstance(decoded, list) else [decoded]
                    out = _project(envelopes, observed_ns, device)
                    if out.device is not None:
                        _remember(out.device)
                    return out
        decoded = _frame_decoder.decode(data)
        envelopes = decoded if isinstance(decoded, list) else [decoded]
        return _project(envelopes, observed_ns, None)
    except (msgspec.DecodeError, _NotTyped, RecursionError):  # too deep: the generic path rejects it
        return None


def _decoded_tables(env: Any, typed_device: str | None) -> list[tuple[str, Any]]:
    """``(stream, rows)`` of an envelope: typed rows from a one-pass decoder (``typed_device`` set),
    else each table's raw bytes."""
    if typed_device is None:
        return list(env.tables.items())
    tables = env.tables
    return [(name, rows) for name in tables.__struct_fields__ if (rows := getattr(tables, name)) is not msgspec.UNSET]


def _project(envelopes: list[Any], observed_ns: int | None, typed_device: str | None) -> FrameRows:
    """The rows of decoded envelopes: ``_Envelope`` objects (tables as raw bytes) when
    ``typed_device`` is None, else those of :func:`_device_frame_decoder` for that device."""
    tables: dict[str, list[RowBlock]] = {}
    out = FrameRows(tables)
    chain = itertools.chain.from_iterable
    buffer = bytearray(4096)  # events_json is encoded here, row after row, then copied into a str
    step_devices: set[str | None] = set()
    for env in envelopes:
        if env.control is not msgspec.UNSET:
            raise _NotTyped
        try:
            meta = normalise({"meta": env.meta, "tables": {}}).meta
        except EnvelopeError as exc:  # pragma: no cover - meta is typed as a map already
            raise _NotTyped from exc
        out.envelopes += 1
        out.session_ids.add(meta.get("session_id"))
        observed = time.time_ns() if observed_ns is None else observed_ns
        ident = identity_columns(meta)
        for stream, raw in _decoded_tables(env, typed_device):
            decoder = _row_decoders.get(stream)
            if decoder is None:
                rows_any = _any_decoder.decode(raw)
                if not isinstance(rows_any, list):
                    raise _NotTyped
                out.unknown_streams[stream] = out.unknown_streams.get(stream, 0) + len(rows_any)
                continue
            if stream == schema.STEP_TIME:
                if typed_device is None:
                    step_rows, step_device = _step_time_rows(raw, int_or_none(meta.get("local_rank")))
                else:
                    step_rows, step_device = raw, typed_device
                step_devices.add(step_device)
                _add(tables, schema.STEP_TIME_SAMPLES.name, (observed, ident[0], *ident), 4,
                     _step_time_values(step_rows, buffer))
                continue
            rows = raw if typed_device is not None else decoder.decode(raw)
            if stream == schema.STEP_MEMORY:
                _add(tables, schema.STEP_MEMORY_SAMPLES.name, (observed, ident[0], *ident), 6,
                     list(chain(map(astuple, rows))))
            elif stream == schema.SYSTEM:
                _system(tables, (observed, *ident), rows)
            elif stream == schema.PROCESS:
                _add(tables, schema.PROCESS_SAMPLES.name, (observed, ident[0], *ident), 12, list(chain([
                    (r.timestamp_unix_ns, r.seq, r.cpu_percent, r.cpu_logical_core_count, r.ram_used_bytes,
                     r.ram_total_bytes, _flag(r.gpu_available), r.gpu_count, r.gpu_device_index,
                     r.gpu_mem_used_bytes, r.gpu_mem_reserved_bytes, r.gpu_mem_total_bytes)
                    for r in rows
                ])))
            elif stream == schema.RUNTIME_ENVIRONMENT:
                _add(tables, schema.RUNTIME_ENVIRONMENT_TABLE.name,
                     (observed, ident[0], *ident, int_or_none(meta.get("pid"))), 8, list(chain([
                         (r.timestamp_unix_ns, r.seq, r.topology, _flag(r.distributed_initialized),
                          r.distributed_backend, r.training_strategy, r.strategy_source, r.strategy_confidence)
                         for r in rows
                     ])))
            else:
                _stdout(out, tables, observed, ident[0], rows)
    out.rows = sum(len(block) for blocks in tables.values() for block in blocks)
    if len(step_devices) == 1:
        out.device = step_devices.pop()
    if len(tables) > 1:
        out.tables = in_writer_order(tables)
    return out


def _step_time_values(rows: list[Any], buffer: bytearray) -> list[Any]:
    """``timestamp_unix_ns, seq, step, events_json`` of each row, flat."""
    values: list[Any] = []
    add = values.extend
    encode_into = _json.encode_into
    for r in rows:
        events = r.events
        if events is None:
            add((r.timestamp_unix_ns, r.seq, r.step, "{}"))
        else:
            # Encoding into one reused buffer saves allocating and growing a bytes object per row.
            encode_into(events, buffer)
            add((r.timestamp_unix_ns, r.seq, r.step, buffer.decode("utf-8")))
    return values


def _add(tables: dict[str, list[RowBlock]], name: str, head: tuple[Any, ...], width: int, values: list[Any]) -> None:
    if values:
        tables.setdefault(name, []).append(RowBlock(head, width, values))


def _system(tables: dict[str, list[RowBlock]], head: tuple[Any, ...], rows: list[_SystemRow]) -> None:
    hosts: list[Any] = []
    gpus: list[Any] = []
    for r in rows:
        hosts += (r.timestamp_unix_ns, r.seq, r.cpu_percent, r.ram_used_bytes, r.ram_total_bytes,
                  _flag(r.gpu_available), r.gpu_count)
        for idx, g in enumerate(r.gpus or ()):
            gpus += (r.timestamp_unix_ns, r.seq, idx, g.util, g.mem_used_bytes, g.mem_total_bytes,
                     g.temperature_c, g.power_usage_w, g.power_limit_w)
    _add(tables, schema.SYSTEM_SAMPLES.name, head, 7, hosts)
    _add(tables, schema.SYSTEM_GPU_SAMPLES.name, head, 9, gpus)


def _stdout(out: FrameRows, tables: dict[str, list[RowBlock]], observed: int, rank: int | None,
            rows: list[_StdoutRow]) -> None:
    found: list[Any] = []
    for r in rows:
        line = r.line
        if line is None:
            out.skipped += 1  # the generic path: a line that is not a str does not fit
            continue
        if not line:
            continue
        found += (r.timestamp_unix_ns, line)
        text = line.rstrip("\r\n")
        if r.stream == "stdout" or r.stream == "stderr":
            text = f"{r.stream} | {text}"
        out.log_lines.append((rank, text))
    _add(tables, schema.STDOUT_STDERR_SAMPLES.name, (observed, rank), 2, found)
