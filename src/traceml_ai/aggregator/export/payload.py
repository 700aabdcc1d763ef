"""``records_from_payload``: one admitted telemetry payload → export records (000 seed, DESIGN §3.1, §3.4).

The records come from the same projection code as the SQLite rows
(:mod:`~traceml_ai.aggregator.projection`): each envelope is projected with
:func:`~traceml_ai.aggregator.projection.project_envelope` and each projected row becomes one
record of its table's class. The only difference is the step_time projection's last column: the
decoded events map (``encode_events=False``) where the SQLite row holds its JSON text.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from functools import partial
from itertools import starmap
from typing import Any, NamedTuple

from traceml_ai.aggregator.export.records import (
    BUILDERS,
    RECORD_STREAMS,
    RECORD_TYPE_BY_TABLE,
    ExportRecord,
)
from traceml_ai.aggregator.projection import (
    PROJECTIONS,
    Projection,
    envelope_of,
    project_envelope,
    project_step_time,
)
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import payload_items


class RecordBatch(NamedTuple):
    """What :func:`records_from_payload` made of one payload.

    ``records``: the records, in payload order and, within one envelope, in the writer's table
    order; ``skipped``: units lost (000 seed): items that do not normalise to an envelope or fail in
    any other way (1 each), projections that raised (1 each), rows that do not fit their record
    (1 each), and rows of a table that has no record (1 each).
    """

    records: list[ExportRecord]
    skipped: int


RECORD_PROJECTIONS: dict[str, Projection] = {
    **PROJECTIONS,
    schema.STEP_TIME: partial(project_step_time, encode_events=False),
}
"""The SQLite projections, except that step_time keeps the events map instead of its JSON text."""

_TABLE_OF_RECORD_STREAM: dict[str, str] = {t.record_stream: t.name for t in schema.TABLES}
_RANK_STREAM_OF_RECORD_STREAM: dict[str, str] = {t.record_stream: t.stream for t in schema.TABLES}


def check_record_streams(streams: Any) -> frozenset[str]:
    """``streams`` as a set of record ``STREAM`` names.

    Raises:
        ValueError: ``streams`` is a string (one name must still be in a collection), an empty
            collection, not a collection, or holds a name that is no record ``STREAM``; the message
            lists the valid names.
    """
    valid = ", ".join(RECORD_STREAMS)
    if isinstance(streams, (str, bytes)):
        raise ValueError(f"streams must be a collection of stream names, not the string {streams!r}; "
                         f"valid names: {valid}")
    if not isinstance(streams, Iterable):
        raise ValueError(f"streams must be a collection of stream names, not {type(streams).__name__}; "
                         f"valid names: {valid}")
    names = list(streams)
    if not names:
        raise ValueError(f"streams is empty: name at least one stream; valid names: {valid}")
    unknown = [n for n in names if n not in _TABLE_OF_RECORD_STREAM]
    if unknown:
        raise ValueError(f"unknown stream {unknown[0]!r} in streams; valid names: {valid}")
    return frozenset(names)


def records_from_payload(
    payload: Any,
    *,
    observed_timestamp_unix_ns: int | None = None,
    streams: Collection[str] | None = None,
) -> RecordBatch:
    """The export records of one admitted telemetry payload (one envelope dict or a list of them).

    Args:
        payload: what a rank sent in one frame (DESIGN §3.1), as decoded from msgpack.
        observed_timestamp_unix_ns: ns since the Unix epoch given to every envelope's records; when
            None each envelope is stamped with ``time.time_ns()`` when its records are built.
        streams: record ``STREAM`` names to build (e.g. ``{"step_time", "system_gpu"}``); the rows of
            every other stream are neither built nor counted in ``skipped`` (leaving them out is not
            a loss). None keeps every stream.

    Returns:
        A :class:`RecordBatch`. Duplicate rows are passed through; records are not sorted.

    Raises:
        TypeError: ``observed_timestamp_unix_ns`` is neither None nor an int (a bool is refused).
        ValueError: ``streams`` is a string, an empty collection or names an unknown stream.
        Both are raised before the payload is looked at. Nothing else raises: losses are counted
        in ``skipped``.
    """
    observed = check_observed_ns(observed_timestamp_unix_ns)
    selected = None if streams is None else check_record_streams(streams)
    return build_records(payload, observed, selected)


def check_observed_ns(value: Any) -> int | None:
    """``value`` as ns since the Unix epoch (an int; an int subclass becomes a plain int), or None.

    Raises:
        TypeError: ``value`` is not None and not an int, or is a bool (True is no timestamp).
    """
    if value is None or type(value) is int:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"observed_timestamp_unix_ns must be an int (ns since the Unix epoch) or None, "
                    f"not {type(value).__name__} {value!r}")


def build_records(
    payload: Any,
    observed_ns: int | None,
    streams: frozenset[str] | None,
    *,
    projections: Mapping[str, Projection] = RECORD_PROJECTIONS,
    record_types: Mapping[str, type[ExportRecord]] = RECORD_TYPE_BY_TABLE,
) -> RecordBatch:
    """:func:`records_from_payload` after its ``streams`` check (the export worker's hot path).

    ``projections`` and ``record_types`` (table name → record class) default to the real ones;
    tests substitute them to see how a table without a record, or a row of the wrong width, is counted.
    """
    rank_streams: set[str] | None = None
    tables: set[str] | None = None
    if streams is not None:
        rank_streams = {_RANK_STREAM_OF_RECORD_STREAM[s] for s in streams}
        tables = {_TABLE_OF_RECORD_STREAM[s] for s in streams}
    out: list[ExportRecord] = []
    skipped = 0
    for item in payload_items(payload):
        try:
            envelope, bad_tables = envelope_of(item)
            projected = project_envelope(
                envelope,
                time.time_ns() if observed_ns is None else observed_ns,
                projections=projections,
                streams=rank_streams,
                bad_tables=bad_tables,
            )
            lost = projected.skipped
            built: list[ExportRecord] = []
            for table, rows in projected.tables.items():
                if tables is not None and table not in tables:
                    continue  # the other table of a selected stream's projection (system / system_gpu)
                cls = record_types.get(table)
                if cls is None:
                    lost += len(rows)
                    continue
                builder = BUILDERS[cls]
                try:
                    made = list(starmap(builder, rows))  # one C loop for the rows that all fit
                except TypeError:  # some row has not one value per field: it does not fit its record
                    made = []
                    for row in rows:
                        try:
                            made.append(builder(*row))
                        except TypeError:
                            lost += 1
                for record in made:
                    record.__class__ = cls  # the frozen record (records module doc: why a twin)
                built += made
        except Exception:  # any other failure of this item loses the item, counted once
            skipped += 1
            continue
        out.extend(built)
        skipped += lost
    return RecordBatch(out, skipped)
