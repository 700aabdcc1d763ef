"""Export records and exporters: ``traceml_ai.aggregator.export`` (000 seed, DESIGN §3.4).

- :mod:`~traceml_ai.aggregator.export.records`: the seven frozen record dataclasses.
- :mod:`~traceml_ai.aggregator.export.payload`: :func:`records_from_payload` and :class:`RecordBatch`.
- :mod:`~traceml_ai.aggregator.export.streams`: the ``export_streams`` setting.
- :mod:`~traceml_ai.aggregator.export.exporter`: the :class:`Exporter` interface and :class:`ExporterContext`.
- :mod:`~traceml_ai.aggregator.export.worker`: the :class:`ExportWorker` thread.
- :mod:`~traceml_ai.aggregator.export.jsonl`: the built-in ``jsonl`` exporter.
- :mod:`~traceml_ai.aggregator.export.otlp`: the built-in ``otlp`` exporter (``traceml-ai[otlp]``).
- :mod:`~traceml_ai.aggregator.export.factory`: the ``exporter`` setting (``jsonl``, ``otlp``, ``module:factory``).
"""

from traceml_ai.aggregator.export.exporter import Exporter, ExporterContext
from traceml_ai.aggregator.export.factory import (
    ExporterLoadError,
    check_exporter_form,
    load_exporter,
    make_export_worker,
)
from traceml_ai.aggregator.export.jsonl import JsonlExporter
from traceml_ai.aggregator.export.payload import RecordBatch, records_from_payload
from traceml_ai.aggregator.export.records import (
    RECORD_STREAMS,
    RECORD_TYPES,
    SCHEMA_VERSION,
    ExportRecord,
    ProcessRecord,
    RuntimeEnvironmentRecord,
    StdoutStderrRecord,
    StepMemoryRecord,
    StepTimeRecord,
    SystemGpuRecord,
    SystemRecord,
)
from traceml_ai.aggregator.export.streams import EXPORT_STREAM_NAMES, parse_export_streams
from traceml_ai.aggregator.export.worker import ExportWorker

__all__ = [
    "EXPORT_STREAM_NAMES",
    "RECORD_STREAMS",
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "ExportRecord",
    "ExportWorker",
    "Exporter",
    "ExporterContext",
    "ExporterLoadError",
    "JsonlExporter",
    "ProcessRecord",
    "RecordBatch",
    "RuntimeEnvironmentRecord",
    "StdoutStderrRecord",
    "StepMemoryRecord",
    "StepTimeRecord",
    "SystemGpuRecord",
    "SystemRecord",
    "check_exporter_form",
    "load_exporter",
    "make_export_worker",
    "parse_export_streams",
    "records_from_payload",
]
