"""Telemetry envelopes (DESIGN §3.1): ``{"meta": {identity}, "tables": {stream: [row, ...]}}``.

``meta`` holds ``session_id, global_rank, local_rank, world_size, local_world_size, node_rank,
hostname, pid, sampler``; every identity field may be missing or null (the record then holds None)
and ``meta.rank`` is accepted as the legacy name of ``global_rank``. An identity field of another
type (a rank that is a string, a float, a bool or a list; a hostname that is not a string) is not
read as None: the item does not normalise (:data:`INT_IDENTITY`, :data:`TEXT_IDENTITY`). ``tables`` maps a stream name
(:data:`traceml_ai.telemetry.schema.RANK_STREAMS`) to a list of row dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INT_IDENTITY = ("global_rank", "local_rank", "world_size", "local_world_size", "node_rank", "pid")
"""``meta`` fields that are ints (not bools) when present and not null."""
TEXT_IDENTITY = ("session_id", "hostname")
"""``meta`` fields that are strings when present and not null."""


class EnvelopeError(ValueError):
    """An item does not normalise to a telemetry envelope."""


@dataclass(frozen=True)
class Envelope:
    """A normalised envelope: identity ``meta`` (legacy ``rank`` resolved) and ``tables``."""

    meta: dict[str, Any]
    tables: dict[str, list[Any]]

    @property
    def global_rank(self) -> int | None:
        return as_int(self.meta.get("global_rank"))

    @property
    def session_id(self) -> str | None:
        value = self.meta.get("session_id")
        return value if isinstance(value, str) else None


def make_envelope(meta: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """A plain-dict envelope ready for :func:`traceml_ai.telemetry.frames.encode_frame`."""
    return {"meta": dict(meta), "tables": {k: [dict(r) for r in v] for k, v in tables.items()}}


def as_int(value: Any) -> int | None:
    """``value`` when it is an int (not a bool), else None: how identity and counters are read."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def normalise(item: Any) -> Envelope:
    """Check one payload item and return it as an :class:`Envelope`.

    ``meta`` must be a mapping when present (missing → empty); ``tables`` must be a mapping of
    stream name to list. ``meta["rank"]`` fills ``global_rank`` when that is absent.

    Raises:
        EnvelopeError: ``item`` is not a mapping, ``meta``/``tables`` have the wrong shape, or an
            identity field of ``meta`` has the wrong type (so an envelope is never read under a
            rank of None it did not send).
    """
    if not isinstance(item, Mapping):
        raise EnvelopeError(f"an envelope is a mapping, not {type(item).__name__}")
    meta = item.get("meta", {})
    tables = item.get("tables")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise EnvelopeError("envelope 'meta' is not a mapping")
    if not isinstance(tables, Mapping):
        raise EnvelopeError("envelope has no 'tables' mapping")
    out_tables: dict[str, list[Any]] = {}
    for name, rows in tables.items():
        if not isinstance(name, str) or not isinstance(rows, list):
            raise EnvelopeError(f"envelope table {name!r} is not a list of rows")
        out_tables[name] = rows
    out_meta = dict(meta)
    if "global_rank" not in out_meta and "rank" in out_meta:
        out_meta["global_rank"] = out_meta["rank"]
    for name in INT_IDENTITY:
        value = out_meta.get(name)
        if value is not None and (type(value) is not int and (not isinstance(value, int) or isinstance(value, bool))):
            raise EnvelopeError(f"envelope meta {name!r} is {type(value).__name__} {value!r}, not an int")
        if value is not None and not -(1 << 63) <= value < (1 << 63):
            raise EnvelopeError(f"envelope meta {name!r} is {value}, beyond 64 bits")
    for name in TEXT_IDENTITY:
        value = out_meta.get(name)
        if value is not None and not isinstance(value, str):
            raise EnvelopeError(f"envelope meta {name!r} is {type(value).__name__} {value!r}, not a string")
    return Envelope(out_meta, out_tables)


def payload_items(payload: Any) -> list[Any]:
    """The items of a telemetry payload: a list as is, anything else as a one-item list."""
    return list(payload) if isinstance(payload, list) else [payload]
