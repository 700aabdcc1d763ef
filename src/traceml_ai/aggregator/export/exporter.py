"""The exporter interface and what a factory is given (000 seed, "Custom exporters").

An exporter is any object with the four methods of :class:`Exporter`. The export worker
(:mod:`~traceml_ai.aggregator.export.worker`) calls them from its one background thread, never
overlapping: ``open`` once, then ``write`` and ``flush`` zero or more times, then ``close`` once
(not when ``open`` raised). A method that raises ends the export; the run goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from traceml_ai.aggregator.export.records import ExportRecord

EXPORT_DIR = "export"
"""``<session_root>/aggregator/export``: where the jsonl exporter writes."""


@runtime_checkable
class Exporter(Protocol):
    """What the export worker calls (000 seed, "Custom exporters").

    ``write(records)`` gets the records of the selected streams only, possibly of several types
    interleaved in payload order (dispatch on ``record.STREAM`` or ``type(record)``); the list is
    the exporter's to keep. ``close(dropped_batches=N)``: N payload batches were never handed to
    ``write`` (one count for the whole worker). Create connections, clients and files in
    ``open``, so they belong to the thread that uses them.
    """

    def open(self) -> None: ...

    def write(self, records: Sequence[ExportRecord]) -> None: ...

    def flush(self) -> None: ...

    def close(self, *, dropped_batches: int = 0) -> None: ...


@dataclass(frozen=True)
class ExporterContext:
    """What a ``module:factory`` exporter factory is called with: ``factory(context)``.

    Attributes:
        session_root: the run's folder, ``<logs-dir>/<run-name>``.
        export_dir: ``session_root / "aggregator" / "export"``, where ``jsonl`` writes; TraceML does
            not create it for a factory.
        include_hostname: whether to keep a record's ``hostname`` field (the ``exporter_hostname``
            setting).
        streams: the selected record ``STREAM`` names, in the order of the record table
            (``RECORD_STREAMS``), e.g. ``("step_time", "system", "system_gpu")``.
    """

    session_root: Path
    export_dir: Path
    include_hostname: bool
    streams: tuple[str, ...]

    @classmethod
    def for_run(cls, session_root: Path, *, include_hostname: bool, streams: tuple[str, ...]) -> ExporterContext:
        """The context of the run folder ``session_root`` (``export_dir`` derived from it)."""
        return cls(session_root, session_root / "aggregator" / EXPORT_DIR, include_hostname, streams)
