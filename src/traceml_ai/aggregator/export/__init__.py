"""Export records and exporters (000 seed, DESIGN §3.4).

- :mod:`~traceml_ai.aggregator.export.records`: the seven frozen record dataclasses.
- :mod:`~traceml_ai.aggregator.export.payload`: :func:`records_from_payload` and :class:`RecordBatch`.
- :mod:`~traceml_ai.aggregator.export.streams`: the ``export_streams`` setting.
"""

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

__all__ = [
    "EXPORT_STREAM_NAMES",
    "RECORD_STREAMS",
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "ExportRecord",
    "ProcessRecord",
    "RecordBatch",
    "RuntimeEnvironmentRecord",
    "StdoutStderrRecord",
    "StepMemoryRecord",
    "StepTimeRecord",
    "SystemGpuRecord",
    "SystemRecord",
    "parse_export_streams",
    "records_from_payload",
]
