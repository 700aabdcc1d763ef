"""The built-in ``otlp`` exporter: records as OpenTelemetry logs, step and system figures as metrics.

DESIGN §3.4; needs the optional extra ``pip install 'traceml-ai[otlp]'`` (``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http``). Where the data goes is set the standard way, by the
``OTEL_EXPORTER_OTLP_*`` variables the OpenTelemetry exporters read (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``..._LOGS_ENDPOINT``, ``..._METRICS_ENDPOINT``, ``..._HEADERS``, ``..._TIMEOUT``,
``..._COMPRESSION``); ``OTEL_SERVICE_NAME`` (default ``traceml``) and ``OTEL_RESOURCE_ATTRIBUTES``
name the resource. Protocol: OTLP/HTTP with protobuf.

Logs: one log record per export record. Its body is the record's ``to_dict()`` (a map; None
values are empty values; ``hostname`` dropped unless ``exporter_hostname`` is on), its
``event_name`` ``traceml.<STREAM>``, its timestamp the record's ``timestamp_unix_ns`` (unset when
None) and its observed timestamp the record's ``observed_timestamp_unix_ns``. Attributes:
``traceml.stream``, ``traceml.global_rank`` (when known) and ``host.name`` (only with
``exporter_hostname``). ``close`` emits one last log, event ``traceml.export.closing``, whose body
holds ``written_records`` and the worker's ``dropped_batches``.

Metrics (attributes ``traceml.global_rank`` and, where they apply, ``traceml.phase``,
``traceml.device``, ``traceml.gpu_idx``; a value that was not measured is not recorded):

=====================================  =========  ======  ========================================
name                                   kind       unit    from
=====================================  =========  ======  ========================================
``traceml.step.phase.duration``        histogram  ms      StepTimeRecord ``events[phase][device]
                                                          .duration_ms``
``traceml.step.memory.peak_allocated`` gauge      By      StepMemoryRecord ``peak_alloc_bytes``
``traceml.step.memory.peak_reserved``  gauge      By      StepMemoryRecord ``peak_reserved_bytes``
``traceml.system.cpu.utilization``     gauge      %       SystemRecord ``cpu_percent``
``traceml.system.memory.used``         gauge      By      SystemRecord ``ram_used_bytes``
``traceml.gpu.utilization``            gauge      %       SystemGpuRecord ``util``
``traceml.gpu.memory.used``            gauge      By      SystemGpuRecord ``mem_used_bytes``
``traceml.gpu.temperature``            gauge      Cel     SystemGpuRecord ``temperature_c``
``traceml.gpu.power.usage``            gauge      W       SystemGpuRecord ``power_usage_w``
``traceml.process.cpu.utilization``    gauge      %       ProcessRecord ``cpu_percent``
``traceml.process.memory.used``        gauge      By      ProcessRecord ``ram_used_bytes``
=====================================  =========  ======  ========================================

Nothing is dropped quietly: logs are handed to OpenTelemetry's batch processor in chunks it can
hold and flushed after each chunk, and an export the collector refuses (or that cannot reach it
after OpenTelemetry's own retries) makes ``write``/``flush`` raise, which ends the export and is
reported in ``finalization_warning.json``. Records count as written there only once a flush has
confirmed their delivery, so a refused batch is never counted as written. OpenTelemetry's own
warnings about it are kept off stderr (the ``opentelemetry`` loggers are routed to the exporter
from ``open`` on); the first of them, when OpenTelemetry logged one (it leaves out a repeat within
20 s), ends the one ``[TraceML]`` failure line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExportResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from traceml_ai.aggregator.export.exporter import ExporterContext
from traceml_ai.aggregator.export.records import (
    ExportRecord,
    ProcessRecord,
    StepMemoryRecord,
    StepTimeRecord,
    SystemGpuRecord,
    SystemRecord,
)

SCOPE = "traceml_ai.aggregator.export"
CHUNK = 2048
"""Logs handed to the batch processor between two flushes (its queue holds twice as many)."""
_FLUSH_TIMEOUT_MS = 30_000


class OtlpExportError(RuntimeError):
    """The collector refused or could not be reached for a batch of logs or metrics."""


class _OtelMessages(logging.Handler):
    """Keeps OpenTelemetry's own warnings ("Failed to export logs batch code: 500", "Transient
    error ... retrying") instead of letting them reach stderr: the user gets one ``[TraceML]`` line
    from the worker, and the first message becomes part of that line (:meth:`OtlpExporter.flush`)."""

    KEEP = 8

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < self.KEEP:
            try:
                text = record.getMessage()
            except Exception:  # a message that cannot be formatted is not worth a traceback
                text = str(record.msg)
            self.messages.append(text.strip().splitlines()[0] if text.strip() else record.levelname)


def _route_otel_logs() -> _OtelMessages:
    """Route the ``opentelemetry`` loggers to a new :class:`_OtelMessages`, in place of the one of an
    exporter opened before (one export per aggregator; tests open several)."""
    otel = logging.getLogger("opentelemetry")
    for old in [h for h in otel.handlers if isinstance(h, _OtelMessages)]:
        otel.removeHandler(old)
    handler = _OtelMessages()
    otel.addHandler(handler)
    otel.propagate = False  # not to the root logger, nor to logging's last-resort stderr handler
    return handler


class _CheckedLogExporter(OTLPLogExporter):
    """The OTLP/HTTP log exporter, counting the batches it could not deliver."""

    failures: list[str]

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        result = super().export(batch)
        if result != LogRecordExportResult.SUCCESS:
            self.failures.append(f"{len(batch)} logs not delivered")
        return result


class _CheckedMetricExporter(OTLPMetricExporter):
    """The OTLP/HTTP metric exporter, counting the exports it could not deliver."""

    failures: list[str]

    def export(self, metrics_data: Any, timeout_millis: float | None = 10_000, **kwargs: Any) -> MetricExportResult:
        result = super().export(metrics_data, timeout_millis, **kwargs)
        if result != MetricExportResult.SUCCESS:
            self.failures.append("metrics not delivered")
        return result


class OtlpExporter:
    """Sends records to an OpenTelemetry collector over OTLP/HTTP (see the module doc for the mapping).

    Args:
        include_hostname: keep ``hostname`` in log bodies and add the ``host.name`` attribute.
        session_root: the run folder, recorded as the resource attribute ``traceml.session_root``.

    Raises (from ``write``, ``flush``, ``close``):
        OtlpExportError: logs or metrics could not be delivered.
    """

    def __init__(self, *, include_hostname: bool = False, session_root: str | None = None) -> None:
        self.include_hostname = include_hostname
        self.session_root = session_root
        self.written_records = 0
        self._logs: LoggerProvider | None = None
        self._metrics: MeterProvider | None = None
        self._log_exporter: _CheckedLogExporter | None = None
        self._metric_exporter: _CheckedMetricExporter | None = None
        self._logger: Any = None
        self._instruments: dict[str, Any] = {}
        self._pending = 0
        self._otel_messages: _OtelMessages | None = None

    @classmethod
    def from_context(cls, context: ExporterContext) -> OtlpExporter:
        return cls(include_hostname=context.include_hostname, session_root=str(context.session_root))

    def open(self) -> None:
        self._otel_messages = _route_otel_logs()
        attributes: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "traceml"
        if self.session_root is not None:
            attributes["traceml.session_root"] = self.session_root
        resource = Resource.create(attributes)
        self._log_exporter = _CheckedLogExporter()
        self._log_exporter.failures = []
        # No exit hooks: close() shuts both providers down; after a failure nobody waits on a dead collector.
        self._logs = LoggerProvider(resource=resource, shutdown_on_exit=False)
        self._logs.add_log_record_processor(
            BatchLogRecordProcessor(self._log_exporter, max_queue_size=2 * CHUNK, max_export_batch_size=512)
        )
        self._logger = self._logs.get_logger(SCOPE)
        self._metric_exporter = _CheckedMetricExporter()
        self._metric_exporter.failures = []
        reader = PeriodicExportingMetricReader(self._metric_exporter)
        self._metrics = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        self._instruments = _instruments(self._metrics.get_meter(SCOPE))

    def write(self, records: Sequence[ExportRecord]) -> None:
        assert self._logger is not None, "open() was not called"
        emit = self._logger.emit
        for record in records:
            body = record.to_dict()
            attributes: dict[str, Any] = {"traceml.stream": record.STREAM}
            rank = body.get("global_rank", body.get("rank"))
            if rank is not None:
                attributes["traceml.global_rank"] = rank
            if self.include_hostname:
                if body.get("hostname") is not None:
                    attributes["host.name"] = body["hostname"]
            else:
                body.pop("hostname", None)
            emit(LogRecord(timestamp=record.timestamp_unix_ns, observed_timestamp=record.observed_timestamp_unix_ns,
                           body=body, attributes=attributes, event_name=f"traceml.{record.STREAM}"))
            self._record_metrics(record, rank)
            self._pending += 1
            if self._pending >= CHUNK:
                self._flush_logs()
        self.written_records += len(records)

    def _record_metrics(self, record: ExportRecord, rank: Any) -> None:
        base = {} if rank is None else {"traceml.global_rank": rank}
        gauges = self._instruments
        if isinstance(record, StepTimeRecord):
            histogram: Histogram = gauges["traceml.step.phase.duration"]
            for phase, devices in record.events.items():
                for device, stats in devices.items():
                    value = stats.get("duration_ms")
                    if value is not None:
                        histogram.record(value, {**base, "traceml.phase": phase, "traceml.device": device})
            return
        values: list[tuple[str, Any, dict[str, Any]]] = []
        if isinstance(record, StepMemoryRecord):
            attrs = {**base, "traceml.device": record.device} if record.device is not None else base
            values = [("traceml.step.memory.peak_allocated", record.peak_alloc_bytes, attrs),
                      ("traceml.step.memory.peak_reserved", record.peak_reserved_bytes, attrs)]
        elif isinstance(record, SystemRecord):
            values = [("traceml.system.cpu.utilization", record.cpu_percent, base),
                      ("traceml.system.memory.used", record.ram_used_bytes, base)]
        elif isinstance(record, SystemGpuRecord):
            attrs = {**base, "traceml.gpu_idx": record.gpu_idx}
            values = [("traceml.gpu.utilization", record.util, attrs),
                      ("traceml.gpu.memory.used", record.mem_used_bytes, attrs),
                      ("traceml.gpu.temperature", record.temperature_c, attrs),
                      ("traceml.gpu.power.usage", record.power_usage_w, attrs)]
        elif isinstance(record, ProcessRecord):
            values = [("traceml.process.cpu.utilization", record.cpu_percent, base),
                      ("traceml.process.memory.used", record.ram_used_bytes, base)]
        for name, value, attrs in values:
            if value is not None:
                gauges[name].set(value, attrs)

    def _flush_logs(self) -> None:
        assert self._logs is not None and self._log_exporter is not None
        self._logs.force_flush(_FLUSH_TIMEOUT_MS)
        self._pending = 0
        if self._log_exporter.failures:
            raise OtlpExportError(f"OTLP logs: {self._log_exporter.failures[0]} "
                                  f"({len(self._log_exporter.failures)} failed exports){self._otel_said()}")

    def _otel_said(self) -> str:
        messages = self._otel_messages.messages if self._otel_messages is not None else []
        return f"; OpenTelemetry: {messages[0]}" if messages else ""

    def flush(self) -> None:
        assert self._metrics is not None and self._metric_exporter is not None
        self._flush_logs()
        self._metrics.force_flush(_FLUSH_TIMEOUT_MS)
        if self._metric_exporter.failures:
            raise OtlpExportError(f"OTLP metrics: {self._metric_exporter.failures[0]}{self._otel_said()}")

    def close(self, *, dropped_batches: int = 0) -> None:
        assert self._logger is not None and self._logs is not None and self._metrics is not None
        self._logger.emit(LogRecord(body={"closing": True, "written_records": self.written_records,
                                          "dropped_batches": dropped_batches},
                                    attributes={"traceml.stream": "closing"}, event_name="traceml.export.closing"))
        try:
            self.flush()
        finally:
            self._logs.shutdown()
            self._metrics.shutdown()


def _instruments(meter: Meter) -> dict[str, Any]:
    gauges = {
        "traceml.step.memory.peak_allocated": ("By", "PyTorch's peak allocated memory during the step"),
        "traceml.step.memory.peak_reserved": ("By", "PyTorch's peak reserved memory during the step"),
        "traceml.system.cpu.utilization": ("%", "host CPU utilization"),
        "traceml.system.memory.used": ("By", "host RAM in use"),
        "traceml.gpu.utilization": ("%", "GPU utilization"),
        "traceml.gpu.memory.used": ("By", "GPU memory in use"),
        "traceml.gpu.temperature": ("Cel", "GPU temperature"),
        "traceml.gpu.power.usage": ("W", "GPU power draw"),
        "traceml.process.cpu.utilization": ("%", "training process CPU, percent of one core"),
        "traceml.process.memory.used": ("By", "training process resident memory"),
    }
    out: dict[str, Any] = {name: meter.create_gauge(name, unit=unit, description=text)
                           for name, (unit, text) in gauges.items()}
    out["traceml.step.phase.duration"] = meter.create_histogram(
        "traceml.step.phase.duration", unit="ms", description="effective duration of a step phase on a device")
    return out
