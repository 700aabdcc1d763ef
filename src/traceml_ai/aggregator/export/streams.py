"""The ``export_streams`` setting: which records reach the exporter (000 seed, "Stream selection").

Accepted names, comma separated: ``step_time`` (the default), ``step_memory``, ``process``,
``system`` (system snapshots and their GPUs) and ``all`` (every record, the only way to the
runtime environment and the stdout/stderr lines).
"""

from __future__ import annotations

from traceml_ai.aggregator.export.records import RECORD_STREAMS

DEFAULT_EXPORT_STREAMS = "step_time"

EXPORT_STREAM_NAMES: dict[str, tuple[str, ...]] = {
    "step_time": ("step_time",),
    "step_memory": ("step_memory",),
    "process": ("process",),
    "system": ("system", "system_gpu"),
    "all": RECORD_STREAMS,
}
"""Each accepted name and the record ``STREAM`` names it selects."""

SUPPORTED = ", ".join(EXPORT_STREAM_NAMES)


def parse_export_streams(value: str) -> tuple[str, ...]:
    """The record ``STREAM`` names selected by an ``export_streams`` value, in record table order.

    Names are separated by commas; spaces around a name are ignored; a name may repeat.

    Example: ``parse_export_streams("system, step_time") == ("step_time", "system", "system_gpu")``.

    Raises:
        ValueError: the value names no stream (empty, only spaces or commas), or holds a name that
            is not one of the five; the one-line message lists the supported names.
    """
    if not isinstance(value, str):
        raise ValueError(f"export_streams must be text like 'step_time,system', not {type(value).__name__}; "
                         f"supported names: {SUPPORTED}")
    names = [part.strip() for part in value.split(",")]
    if not any(names):
        raise ValueError(f"export_streams {value!r} names no stream; supported names: {SUPPORTED}")
    selected: set[str] = set()
    for name in names:
        found = EXPORT_STREAM_NAMES.get(name)
        if found is None:
            what = "an empty name" if not name else f"unknown name {name!r}"
            raise ValueError(f"export_streams {value!r} has {what}; supported names: {SUPPORTED}")
        selected.update(found)
    return tuple(s for s in RECORD_STREAMS if s in selected)
