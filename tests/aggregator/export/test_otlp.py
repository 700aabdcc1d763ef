"""The ``otlp`` exporter against a local OTLP/HTTP receiver on 127.0.0.1 (DESIGN §3.4, issue 5 item 5)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from tests.aggregator.export.sample import RECORDS_PER_FULL_ENVELOPE, full_envelope
from traceml_ai.aggregator.export import (
    ExporterContext,
    load_exporter,
    make_export_worker,
    parse_export_streams,
    records_from_payload,
)
from traceml_ai.aggregator.export.otlp import OtlpExporter

ALL = parse_export_streams("all")
PER_ENVELOPE = sum(RECORDS_PER_FULL_ENVELOPE.values())


class Receiver:
    """A minimal OTLP/HTTP collector: decodes what it is sent with the OTLP protobuf messages."""

    def __init__(self) -> None:
        self.logs: list[ExportLogsServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/logs":
                    receiver.logs.append(ExportLogsServiceRequest.FromString(body))
                    answer = ExportLogsServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for request in self.logs:
            for resource_logs in request.resource_logs:
                for scope_logs in resource_logs.scope_logs:
                    out.extend(MessageToDict(r) for r in scope_logs.log_records)
        return out

    def metric_points(self) -> dict[str, list[dict[str, Any]]]:
        """The last data point of each series (metrics are cumulative: each export repeats them)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for request in self.metrics:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        data = MessageToDict(metric)
                        kind = "gauge" if "gauge" in data else "histogram"
                        for point in data[kind]["dataPoints"]:
                            out.setdefault(metric.name, {})[repr(sorted(attributes(point).items()))] = point
        return {name: list(series.values()) for name, series in out.items()}

    def resource_attributes(self) -> dict[str, Any]:
        resource = self.logs[0].resource_logs[0].resource
        return {a.key: a.value.string_value for a in resource.attributes}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    found = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.endpoint)  # the standard variable, nothing else
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    yield found
    found.close()


def plain(value: dict[str, Any]) -> Any:
    """An OTLP AnyValue (as MessageToDict gives it) as a Python value; an empty value is None."""
    if "kvlistValue" in value:
        return {kv["key"]: plain(kv.get("value", {})) for kv in value["kvlistValue"].get("values", [])}
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    return None


def attributes(item: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: plain(a["value"]) for a in item.get("attributes", [])}


def test_records_arrive_as_logs_whose_body_is_the_record_without_hostname(tmp_path: Path, receiver: Receiver) -> None:
    worker = make_export_worker("otlp", tmp_path, export_streams="all")
    worker.start()
    worker.submit([full_envelope(0), full_envelope(1, hostname=None)])
    worker.close()
    assert not worker.failed, worker.failure
    logs = receiver.log_records()
    *records, closing = logs
    expected = records_from_payload([full_envelope(0), full_envelope(1, hostname=None)]).records
    assert len(records) == len(expected) == 2 * PER_ENVELOPE
    for log, record in zip(records, expected, strict=True):
        body = plain(log["body"])
        want = record.to_dict()
        want.pop("hostname", None)
        assert body == {**want, "observed_timestamp_unix_ns": body["observed_timestamp_unix_ns"]}
        assert log["eventName"] == f"traceml.{record.STREAM}"
        assert int(log["observedTimeUnixNano"]) == body["observed_timestamp_unix_ns"]
        if record.timestamp_unix_ns is not None:
            assert int(log["timeUnixNano"]) == record.timestamp_unix_ns
        attrs = attributes(log)
        assert attrs["traceml.stream"] == record.STREAM and "host.name" not in attrs
    assert plain(closing["body"]) == {"closing": True, "written_records": 2 * PER_ENVELOPE, "dropped_batches": 0}
    assert receiver.resource_attributes()["service.name"] == "traceml"
    assert receiver.resource_attributes()["traceml.session_root"] == str(tmp_path)


def test_a_measured_zero_stays_0_and_a_missing_value_is_an_empty_value(receiver: Receiver, tmp_path: Path) -> None:
    exporter = OtlpExporter()
    exporter.open()
    exporter.write(records_from_payload(full_envelope(0), streams={"step_memory", "system_gpu"}).records)
    exporter.close()
    bodies = [plain(log["body"]) for log in receiver.log_records()[:-1]]
    memory, _gpu0, gpu1 = bodies
    assert memory["peak_reserved_bytes"] == 0.0
    assert gpu1["util"] == 0.0 and gpu1["mem_used_bytes"] is None and "mem_used_bytes" in gpu1


def test_with_exporter_hostname_the_hostname_stays_and_becomes_host_name(receiver: Receiver, tmp_path: Path) -> None:
    exporter = load_exporter("otlp", ExporterContext.for_run(tmp_path, include_hostname=True, streams=ALL))
    exporter.open()
    exporter.write(records_from_payload(full_envelope(0, hostname="gpu-node-4"), streams={"process"}).records)
    exporter.close(dropped_batches=2)
    process, closing = receiver.log_records()
    assert plain(process["body"])["hostname"] == "gpu-node-4"
    assert attributes(process)["host.name"] == "gpu-node-4" and attributes(process)["traceml.global_rank"] == 0
    assert plain(closing["body"])["dropped_batches"] == 2


def test_step_and_system_figures_arrive_as_metrics(receiver: Receiver, tmp_path: Path) -> None:
    exporter = OtlpExporter()
    exporter.open()
    exporter.write(records_from_payload([full_envelope(0), full_envelope(1)]).records)
    exporter.close()
    points = receiver.metric_points()
    phases = points["traceml.step.phase.duration"]
    forward = {"traceml.global_rank": 0, "traceml.phase": "traceml:forward", "traceml.device": "cuda:0"}
    forward_rank0 = [p for p in phases if attributes(p) == forward]
    assert len(forward_rank0) == 1 and int(forward_rank0[0]["count"]) == 2 and forward_rank0[0]["sum"] == 5.0
    gpu_util = {(attributes(p)["traceml.global_rank"], attributes(p)["traceml.gpu_idx"]): p["asDouble"]
                for p in points["traceml.gpu.utilization"]}
    assert gpu_util == {(0, 0): 97.0, (0, 1): 0.0, (1, 0): 97.0, (1, 1): 0.0}
    # a value that was not measured is not recorded
    assert {attributes(p)["traceml.gpu_idx"] for p in points["traceml.gpu.temperature"]} == {0}
    cpu = {attributes(p)["traceml.global_rank"]: p["asDouble"] for p in points["traceml.process.cpu.utilization"]}
    assert cpu == {0: 131.5, 1: 131.5}
    assert {p["asDouble"] for p in points["traceml.step.memory.peak_allocated"]} == {1.5e9}
    assert {p["asDouble"] for p in points["traceml.system.cpu.utilization"]} == {0.0}


def test_a_collector_that_refuses_the_data_is_an_exporter_failure_recorded_by_the_worker(
    receiver: Receiver, tmp_path: Path,
) -> None:
    receiver.status = 400
    logged: list[str] = []
    worker = make_export_worker("otlp", tmp_path, export_streams="step_time", log=logged.append)
    worker.start()
    worker.submit(full_envelope(0))
    worker.close()
    assert worker.failed and len(logged) == 1 and "OtlpExportError: OTLP logs" in logged[0]
    assert worker.report()["failed_records"] == RECORDS_PER_FULL_ENVELOPE["step_time"]


@pytest.mark.parametrize("status", [500, 400])
def test_records_a_collector_refused_are_not_counted_as_written_and_opentelemetry_prints_nothing_itself(
    receiver: Receiver, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    status: int,
) -> None:
    """written_records counts only what a flush confirmed delivered, so it agrees with the failure
    ("N logs not delivered"); OpenTelemetry's own warnings do not reach stderr beside the one line."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # bounds the retries of a 500
    receiver.status = status
    logged: list[str] = []
    worker = make_export_worker("otlp", tmp_path, export_streams="step_time", log=logged.append)
    worker.start()
    worker.submit(full_envelope(0))
    worker.close()
    report = worker.report()
    admitted = RECORDS_PER_FULL_ENVELOPE["step_time"]
    assert report["exporter_failed"] is True and report["written_records"] == 0
    assert report["failed_records"] == report["admitted_records"] == admitted
    assert f"OTLP logs: {admitted} logs not delivered" in report["failure"]
    assert len(logged) == 1
    out, err = capfd.readouterr()
    assert out == "" and err == ""
