"""The ``jsonl`` exporter (DESIGN §3.4, 000 seed "What a record is" and "Custom exporters")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.export.sample import RECORDS_PER_FULL_ENVELOPE, full_envelope
from traceml_ai.aggregator.export import (
    ExportWorker,
    JsonlExporter,
    parse_export_streams,
    records_from_payload,
)
from traceml_ai.telemetry.envelope import make_envelope

ALL = parse_export_streams("all")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def export(tmp_path: Path, payloads: list[Any], streams: tuple[str, ...] = ALL, *, include_hostname: bool = False,
           dropped: int = 0) -> JsonlExporter:
    exporter = JsonlExporter(tmp_path / "aggregator" / "export", streams, include_hostname=include_hostname)
    exporter.open()
    for payload in payloads:
        exporter.write(records_from_payload(payload, streams=streams).records)
    exporter.flush()
    exporter.close(dropped_batches=dropped)
    return exporter


def test_one_file_per_selected_stream_each_ending_with_its_closing_line(tmp_path: Path) -> None:
    exporter = export(tmp_path, [full_envelope(0), full_envelope(1)], dropped=4)
    folder = tmp_path / "aggregator" / "export"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{s}.jsonl" for s in ALL)
    for stream in ALL:
        found = lines(exporter.path(stream))
        written = 2 * RECORDS_PER_FULL_ENVELOPE[stream]
        assert found[-1] == {"closing": True, "stream": stream, "written_records": written, "dropped_batches": 4}
        assert len(found) - 1 == 2 * RECORDS_PER_FULL_ENVELOPE[stream]
        assert all(line["stream"] == stream and line["schema_version"] == 1 for line in found[:-1])


def test_each_line_is_the_records_to_dict_without_hostname_by_default(tmp_path: Path) -> None:
    exporter = export(tmp_path, [full_envelope(0)], ("step_time",))
    expected = [r.to_dict() for r in records_from_payload(full_envelope(0), streams={"step_time"}).records]
    found = lines(exporter.path("step_time"))[:-1]
    for line, want in zip(found, expected, strict=True):
        assert list(line) == [k for k in want if k != "hostname"]
        want.pop("hostname")
        assert {**line, "observed_timestamp_unix_ns": 0} == {**want, "observed_timestamp_unix_ns": 0}


def test_with_exporter_hostname_the_hostname_is_kept_and_null_when_the_rank_sent_none(tmp_path: Path) -> None:
    exporter = export(tmp_path, [full_envelope(0, hostname="gpu-node-9"), full_envelope(1, hostname=None)],
                      ("process", "stdout_stderr"), include_hostname=True)
    assert [line["hostname"] for line in lines(exporter.path("process"))[:-1]] == ["gpu-node-9", None]
    assert all("hostname" not in line for line in lines(exporter.path("stdout_stderr")))  # the record has none


def test_a_selected_stream_without_records_still_gets_its_file_and_closing_line(tmp_path: Path) -> None:
    cpu_only = make_envelope({"global_rank": 0}, {"system": [{"seq": 1, "gpus": []}]})
    exporter = export(tmp_path, [cpu_only], parse_export_streams("system"))
    assert lines(exporter.path("system_gpu")) == [
        {"closing": True, "stream": "system_gpu", "written_records": 0, "dropped_batches": 0}]
    assert len(lines(exporter.path("system"))) == 2


def test_none_is_null_a_measured_zero_is_0_and_non_finite_floats_are_null(tmp_path: Path) -> None:
    payload = make_envelope({"global_rank": 0}, {"process": [{"seq": 1, "cpu_percent": 0.0, "ram_used_bytes": math.nan,
                                                             "gpu_count": 0}]})
    (line, _closing) = lines(export(tmp_path, [payload], ("process",)).path("process"))
    assert line["cpu_percent"] == 0.0 and line["gpu_count"] == 0 and line["ram_used_bytes"] is None
    assert line["gpu_mem_total_bytes"] is None and line["timestamp_unix_ns"] is None


def test_an_existing_export_is_never_overwritten(tmp_path: Path) -> None:
    export(tmp_path, [full_envelope(0)], ("step_time",))
    again = JsonlExporter(tmp_path / "aggregator" / "export", ("step_time",))
    with pytest.raises(FileExistsError):
        again.open()


def test_the_closing_line_carries_the_workers_single_dropped_batches_count_in_every_file(tmp_path: Path) -> None:
    exporter = JsonlExporter(tmp_path / "export", ALL)
    worker = ExportWorker(exporter, name="jsonl", streams=ALL, max_queued_batches=1)
    worker.dropped_batches = 2  # as counted by submit() when the queue was full twice
    worker.start()
    worker.submit(full_envelope(0))
    worker.close()
    closings = [lines(exporter.path(s))[-1] for s in ALL]
    assert {c["dropped_batches"] for c in closings} == {2}
    assert [c["written_records"] for c in closings] == [RECORDS_PER_FULL_ENVELOPE[s] for s in ALL]
