"""Typed decoding of a payload frame straight into table rows: the aggregator's hot path.

:func:`project_frame` decodes a frame body with msgspec into typed row structs (decoding and type
checking in C) and builds the same row tuples as :func:`~traceml_ai.aggregator.projection.project_payload`
would from the generically decoded payload, several times faster for the high-volume streams
(benchmarks/bench_aggregator.py). It handles only well-formed payloads: when any value in the frame
has a type the structs do not take (a bool where an int belongs, a float step, a row that is not a
map, ...) it returns None and the caller takes the generic path, whose rules are the reference.
The two paths give identical rows, counts and log lines (tests/aggregator/test_fastpath.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import astuple

from traceml_ai.aggregator.projection import PayloadRows, identity_columns, in_writer_order, int_or_none
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import EnvelopeError, normalise

# Field order of each row struct is the table's column order where the tuple is built with astuple.
# gc=False: decoded rows never form reference cycles, and untracked structs decode faster.


class _Stats(msgspec.Struct, gc=False):
    is_gpu: bool | None = None
    duration_ms: float | None = None
    cpu_ms: float | None = None
    gpu_ms: float | None = None
    n_calls: int | None = None


class _StepTimeRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: int | None = None
    seq: int | None = None
    step: int | None = None
    events: dict[str, dict[str, _Stats]] | None = None


class _StepMemoryRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: int | None = None
    seq: int | None = None
    device: str | None = None
    step: int | None = None
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
    timestamp_unix_ns: int | None = None
    seq: int | None = None
    cpu_percent: float | None = None
    ram_used_bytes: float | None = None
    ram_total_bytes: float | None = None
    gpu_available: bool | int | None = None
    gpu_count: int | None = None
    gpus: list[_Gpu] | None = None


class _ProcessRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: int | None = None
    seq: int | None = None
    cpu_percent: float | None = None
    cpu_logical_core_count: int | None = None
    ram_used_bytes: float | None = None
    ram_total_bytes: float | None = None
    gpu_available: bool | int | None = None
    gpu_count: int | None = None
    gpu_device_index: int | None = None
    gpu_mem_used_bytes: float | None = None
    gpu_mem_reserved_bytes: float | None = None
    gpu_mem_total_bytes: float | None = None


class _RuntimeRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: int | None = None
    seq: int | None = None
    topology: str | None = None
    distributed_initialized: bool | int | None = None
    distributed_backend: str | None = None
    training_strategy: str | None = None
    strategy_source: str | None = None
    strategy_confidence: str | None = None


class _StdoutRow(msgspec.Struct, gc=False):
    timestamp_unix_ns: int | None = None
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


def _flag(value: bool | int | None) -> int | None:
    if value is True:
        return 1
    if value is False:
        return 0
    return value


@dataclass
class FrameRows(PayloadRows):
    """:class:`~traceml_ai.aggregator.projection.PayloadRows` plus what the server needs from the frame.

    ``session_ids``: every ``meta.session_id`` the envelopes name (None: an envelope without one);
    ``log_lines``: ``(global_rank, text)`` lines for ``rank_<g>.log``, as
    :func:`~traceml_ai.aggregator.projection.rank_log_lines` makes them.
    """

    session_ids: set[Any] = field(default_factory=set)
    log_lines: list[tuple[int | None, str]] = field(default_factory=list)


class _NotTyped(Exception):
    """The frame is not a well-formed payload; the generic path must handle it."""


def project_frame(data: bytes | memoryview, *, observed_ns: int | None = None) -> FrameRows | None:
    """Rows of a payload frame body, or None when only the generic path can handle the frame.

    None is returned for control frames, bodies that are not msgpack, and payloads holding any
    value the typed rows do not take. Each envelope is stamped with ``observed_ns`` when given,
    else ``time.time_ns()`` once per envelope. Never raises.
    """
    try:
        decoded = _frame_decoder.decode(data)
        envelopes = decoded if isinstance(decoded, list) else [decoded]
        return _project(envelopes, observed_ns)
    except (msgspec.DecodeError, _NotTyped):
        return None


def _project(envelopes: list[_Envelope], observed_ns: int | None) -> FrameRows:
    tables: dict[str, list[tuple[Any, ...]]] = {}
    out = FrameRows(tables)
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
        for stream, raw in env.tables.items():
            decoder = _row_decoders.get(stream)
            if decoder is None:
                rows_any = _any_decoder.decode(raw)
                if not isinstance(rows_any, list):
                    raise _NotTyped
                out.unknown_streams[stream] = out.unknown_streams.get(stream, 0) + len(rows_any)
                continue
            rows = decoder.decode(raw)
            if stream == schema.STEP_TIME:
                head = (observed, ident[0], *ident)
                enc = _json.encode
                _add(tables, schema.STEP_TIME_SAMPLES.name, [
                    (*head, r.timestamp_unix_ns, r.seq, r.step,
                     "{}" if r.events is None else enc(r.events).decode("utf-8"))
                    for r in rows
                ])
            elif stream == schema.STEP_MEMORY:
                head = (observed, ident[0], *ident)
                _add(tables, schema.STEP_MEMORY_SAMPLES.name, [head + astuple(r) for r in rows])
            elif stream == schema.SYSTEM:
                _system(tables, (observed, *ident), rows)
            elif stream == schema.PROCESS:
                head = (observed, ident[0], *ident)
                _add(tables, schema.PROCESS_SAMPLES.name, [
                    (*head, r.timestamp_unix_ns, r.seq, r.cpu_percent, r.cpu_logical_core_count, r.ram_used_bytes,
                     r.ram_total_bytes, _flag(r.gpu_available), r.gpu_count, r.gpu_device_index,
                     r.gpu_mem_used_bytes, r.gpu_mem_reserved_bytes, r.gpu_mem_total_bytes)
                    for r in rows
                ])
            elif stream == schema.RUNTIME_ENVIRONMENT:
                head = (observed, ident[0], *ident, int_or_none(meta.get("pid")))
                _add(tables, schema.RUNTIME_ENVIRONMENT_TABLE.name, [
                    (*head, r.timestamp_unix_ns, r.seq, r.topology, _flag(r.distributed_initialized),
                     r.distributed_backend, r.training_strategy, r.strategy_source, r.strategy_confidence)
                    for r in rows
                ])
            else:
                _stdout(out, tables, observed, ident[0], rows)
    out.rows = sum(len(v) for v in tables.values())
    if len(tables) > 1:
        out.tables = in_writer_order(tables)
    return out


def _add(tables: dict[str, list[tuple[Any, ...]]], name: str, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    have = tables.get(name)
    if have is None:
        tables[name] = rows
    else:
        have.extend(rows)


def _system(tables: dict[str, list[tuple[Any, ...]]], head: tuple[Any, ...], rows: list[_SystemRow]) -> None:
    hosts: list[tuple[Any, ...]] = []
    gpus: list[tuple[Any, ...]] = []
    for r in rows:
        hosts.append((*head, r.timestamp_unix_ns, r.seq, r.cpu_percent, r.ram_used_bytes, r.ram_total_bytes,
                      _flag(r.gpu_available), r.gpu_count))
        for idx, g in enumerate(r.gpus or ()):
            gpus.append((*head, r.timestamp_unix_ns, r.seq, idx, g.util, g.mem_used_bytes, g.mem_total_bytes,
                         g.temperature_c, g.power_usage_w, g.power_limit_w))
    _add(tables, schema.SYSTEM_SAMPLES.name, hosts)
    _add(tables, schema.SYSTEM_GPU_SAMPLES.name, gpus)


def _stdout(
    out: FrameRows, tables: dict[str, list[tuple[Any, ...]]], observed: int, rank: int | None, rows: list[_StdoutRow]
) -> None:
    found: list[tuple[Any, ...]] = []
    for r in rows:
        line = r.line
        if line is None:
            out.skipped += 1  # the generic path: a line that is not a str does not fit
            continue
        if not line:
            continue
        found.append((observed, rank, r.timestamp_unix_ns, line))
        text = line.rstrip("\r\n")
        if r.stream == "stdout" or r.stream == "stderr":
            text = f"{r.stream} | {text}"
        out.log_lines.append((rank, text))
    _add(tables, schema.STDOUT_STDERR_SAMPLES.name, found)
