"""The seven record classes (000 seed, "What a record is", "Common fields", "Records")."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from tests.aggregator.export.sample import TS, full_envelope
from traceml_ai.aggregator.export import (
    RECORD_TYPES,
    SCHEMA_VERSION,
    ProcessRecord,
    RuntimeEnvironmentRecord,
    StdoutStderrRecord,
    StepMemoryRecord,
    StepTimeRecord,
    SystemGpuRecord,
    SystemRecord,
    records_from_payload,
)
from traceml_ai.aggregator.export.records import BUILDERS, from_row
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import make_envelope

SEED_TABLE = [
    (StepTimeRecord, "step_time", "step_time_samples"),
    (StepMemoryRecord, "step_memory", "step_memory_samples"),
    (SystemRecord, "system", "system_samples"),
    (SystemGpuRecord, "system_gpu", "system_gpu_samples"),
    (ProcessRecord, "process", "process_samples"),
    (RuntimeEnvironmentRecord, "runtime_environment", "runtime_environment"),
    (StdoutStderrRecord, "stdout_stderr", "stdout_stderr_samples"),
]


def test_each_record_class_names_its_stream_and_sqlite_table_as_the_seed_table_does() -> None:
    assert [(cls, cls.STREAM, cls.TABLE) for cls in RECORD_TYPES] == SEED_TABLE


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_a_record_is_frozen_and_carries_stream_schema_version_1_and_its_columns_in_order(cls: type) -> None:
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert cls.SCHEMA_VERSION == SCHEMA_VERSION == 1
    assert cls.COLUMNS == tuple(f.name for f in dataclasses.fields(cls))


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_record_fields_are_the_table_columns_in_table_order_without_id_and_events_for_events_json(
    cls: type,
) -> None:
    columns = schema.TABLES_BY_NAME[cls.TABLE].column_names
    assert "id" not in columns
    expected = tuple("events" if c == "events_json" else c for c in columns)
    assert cls.COLUMNS == expected
    differing = [c for c in columns if c not in cls.COLUMNS]
    assert differing == (["events_json"] if cls is StepTimeRecord else [])


def test_most_records_start_with_the_common_identity_and_time_fields_in_order() -> None:
    common = ("observed_timestamp_unix_ns", "rank", "global_rank", "local_rank", "world_size", "local_world_size",
              "node_rank", "hostname", "timestamp_unix_ns", "seq")
    for cls in (StepTimeRecord, StepMemoryRecord, ProcessRecord):
        assert cls.COLUMNS[: len(common)] == common
    # no rank field on the system records, because their rows have none
    for cls in (SystemRecord, SystemGpuRecord):
        assert "rank" not in cls.COLUMNS
        assert cls.COLUMNS[:9] == tuple(c for c in common if c != "rank")
    # pid between hostname and timestamp_unix_ns
    assert RuntimeEnvironmentRecord.COLUMNS[7:11] == ("hostname", "pid", "timestamp_unix_ns", "seq")
    assert StdoutStderrRecord.COLUMNS == ("observed_timestamp_unix_ns", "rank", "timestamp_unix_ns", "line")


def test_to_dict_gives_stream_then_schema_version_then_every_field_in_order() -> None:
    for record in records_from_payload(full_envelope()).records:
        data = record.to_dict()
        assert list(data) == ["stream", "schema_version", *type(record).COLUMNS]
        assert data["stream"] == record.STREAM and data["schema_version"] == 1
        assert all(data[name] == getattr(record, name) for name in record.COLUMNS)


def test_records_cannot_be_changed_after_they_are_built() -> None:
    record = records_from_payload(full_envelope()).records[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 5  # type: ignore[misc, union-attr]


def test_a_record_built_from_a_row_equals_one_built_by_its_constructor() -> None:
    row = (TS, 1, 1, 0, 2, 2, 0, "h", TS, 4, "cuda:0", 9, 1.0, None)
    built = from_row(StepMemoryRecord, row)
    assert type(built) is StepMemoryRecord and built == StepMemoryRecord(*row)
    assert repr(built) == repr(StepMemoryRecord(*row))
    with pytest.raises(ValueError, match="14 fields of StepMemoryRecord"):
        from_row(StepMemoryRecord, row[:-1])
    assert all(b is not cls for cls, b in BUILDERS.items())


def test_an_unavailable_value_stays_none_and_a_measured_zero_stays_zero() -> None:
    records = records_from_payload(full_envelope()).records
    memory = next(r for r in records if isinstance(r, StepMemoryRecord))
    assert memory.peak_reserved_bytes == 0.0 and memory.peak_reserved_bytes is not None
    system = next(r for r in records if isinstance(r, SystemRecord))
    assert system.cpu_percent == 0.0
    gpus = [r for r in records if isinstance(r, SystemGpuRecord)]
    assert gpus[1].util == 0.0 and gpus[1].mem_used_bytes is None and gpus[1].temperature_c is None
    process = next(r for r in records if isinstance(r, ProcessRecord))
    assert process.gpu_mem_used_bytes == 0.0
    steps = [r for r in records if isinstance(r, StepTimeRecord)]
    backward = steps[0].events[schema.BACKWARD]["cuda:0"]
    assert backward["gpu_ms"] == 0.0 and backward["cpu_ms"] == 0.0 and backward["duration_ms"] == 0.0


def test_rank_is_the_legacy_alias_of_global_rank_with_the_same_value() -> None:
    envelope = full_envelope(3)
    envelope["meta"] = {k: v for k, v in envelope["meta"].items() if k != "global_rank"} | {"rank": 3}
    for record in records_from_payload(envelope).records:
        assert getattr(record, "global_rank", 3) == 3
        if "rank" in record.COLUMNS:
            assert record.rank == 3  # type: ignore[union-attr]


def test_identity_the_rank_did_not_send_is_none_in_every_record() -> None:
    payload = make_envelope({"session_id": "s"}, {"step_memory": [{"seq": 1, "step": 2}],
                                                   "system": [{"seq": 1}], "stdout_stderr": [{"line": "x"}]})
    for record in records_from_payload(payload).records:
        for name in ("rank", "global_rank", "local_rank", "world_size", "local_world_size", "node_rank", "hostname"):
            assert getattr(record, name, None) is None
        assert record.timestamp_unix_ns is None
        assert isinstance(record.observed_timestamp_unix_ns, int)


def test_hostname_is_none_when_the_rank_sent_no_hostname() -> None:
    records = records_from_payload(full_envelope(hostname=None)).records
    assert all(r.hostname is None for r in records if "hostname" in r.COLUMNS)  # type: ignore[union-attr]
    named = records_from_payload(full_envelope(hostname="n7")).records
    assert all(r.hostname == "n7" for r in named if "hostname" in r.COLUMNS)  # type: ignore[union-attr]


def test_timestamp_unix_ns_is_none_for_a_row_with_only_a_legacy_float_timestamp() -> None:
    payload = make_envelope({"global_rank": 0}, {"step_memory": [{"timestamp": 1764500000.5, "step": 1}]})
    (record,) = records_from_payload(payload).records
    assert record.timestamp_unix_ns is None and record.step == 1  # type: ignore[union-attr]


def test_step_time_record_carries_the_decoded_events_map_with_the_five_stats_each_none_when_not_sent() -> None:
    steps = [r for r in records_from_payload(full_envelope()).records if isinstance(r, StepTimeRecord)]
    assert [s.step for s in steps] == [0, 1]
    forward = steps[0].events[schema.FORWARD]["cuda:0"]
    assert forward == {"is_gpu": True, "duration_ms": 2.5, "cpu_ms": 1.25, "gpu_ms": 2.5, "n_calls": 1}
    loader = steps[0].events[schema.DATALOADER_NEXT]["cuda:0"]
    assert loader == {"is_gpu": False, "duration_ms": 4.0, "cpu_ms": 4.0, "gpu_ms": None, "n_calls": None}
    assert steps[1].events[schema.FORWARD]["cuda:0"]["gpu_ms"] is None  # not every call measured the GPU


def test_events_is_an_empty_map_never_none_when_the_row_had_no_events() -> None:
    payload = make_envelope({"global_rank": 0}, {"step_time": [{"seq": 1, "step": 4}, {"step": 5, "events": None}]})
    records = records_from_payload(payload).records
    assert [r.events for r in records] == [{}, {}]  # type: ignore[union-attr]


def test_step_is_none_unless_the_row_had_an_integer_step() -> None:
    payload = make_envelope({"global_rank": 0}, {"step_time": [{"step": 4.0}, {"step": True}, {"step": 6}]})
    assert [r.step for r in records_from_payload(payload).records] == [None, None, 6]  # type: ignore[union-attr]


def test_one_system_gpu_record_per_gpu_with_gpu_idx_its_position_in_the_snapshot() -> None:
    gpus = [r for r in records_from_payload(full_envelope()).records if isinstance(r, SystemGpuRecord)]
    assert [g.gpu_idx for g in gpus] == [0, 1]
    assert gpus[0].util == 97.0 and gpus[0].power_usage_w == 512.5 and gpus[0].power_limit_w == 700.0
    assert gpus[1].power_limit_w is None


def test_integer_booleans_are_1_or_0() -> None:
    records = records_from_payload(full_envelope()).records
    system = next(r for r in records if isinstance(r, SystemRecord))
    runtime = next(r for r in records if isinstance(r, RuntimeEnvironmentRecord))
    process = next(r for r in records if isinstance(r, ProcessRecord))
    assert system.gpu_available == 1 and type(system.gpu_available) is int
    assert process.gpu_available == 1 and runtime.distributed_initialized == 1
    assert runtime.pid == 5000 and runtime.training_strategy == "ddp"


def test_stdout_stderr_records_hold_rank_time_and_the_line_and_skip_empty_lines() -> None:
    lines = [r for r in records_from_payload(full_envelope(1)).records if isinstance(r, StdoutStderrRecord)]
    assert [(r.rank, r.line) for r in lines] == [(1, "epoch 1 loss 0.25\n"), (1, "warning: slow\n")]


def test_non_finite_floats_stay_as_sent() -> None:
    payload = make_envelope({"global_rank": 0}, {"process": [{"cpu_percent": math.inf, "ram_used_bytes": math.nan}]})
    (record,) = records_from_payload(payload).records
    assert record.cpu_percent == math.inf and math.isnan(record.ram_used_bytes)  # type: ignore[union-attr, arg-type]


def test_the_envelope_example_of_docs_export_gives_the_records_it_says() -> None:
    """docs/export.md's envelope example is a real one: it gives the records the page names."""
    import json
    import re
    from pathlib import Path

    page = (Path(__file__).parents[3] / "docs" / "export.md").read_text()
    section = page.split("### The envelope", 1)[1].split("### From a payload yourself", 1)[0]
    (example,) = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    batch = records_from_payload(json.loads(example), observed_timestamp_unix_ns=TS)
    assert batch.skipped == 0
    step, memory = batch.records
    assert isinstance(step, StepTimeRecord) and (step.global_rank, step.step) == (0, 1)
    assert step.events["traceml:step"]["cpu"]["cpu_ms"] == 0.599
    assert isinstance(memory, StepMemoryRecord) and memory.device == "cpu"
    assert memory.peak_alloc_bytes is None and memory.peak_reserved_bytes is None


def test_the_exporter_example_of_docs_export_writes_json_even_for_nan(tmp_path: Path) -> None:
    """docs/export.md's "Writing an exporter" example, run as written: every line it writes is
    JSON, NaN and infinities as null (review 11d: with json.dumps it wrote ``NaN``)."""
    import json
    import re
    import types

    from traceml_ai.aggregator.export.exporter import ExporterContext

    page = (Path(__file__).parents[3] / "docs" / "export.md").read_text()
    section = page.split("## Writing an exporter", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    module = types.ModuleType("my_exporters")
    exec(compile(code, "my_exporters.py", "exec"), module.__dict__)
    context = ExporterContext(session_root=tmp_path, export_dir=tmp_path / "export", include_hostname=False,
                              streams=("process",))
    exporter = module.make_exporter(context)
    exporter.open()
    payload = make_envelope({"global_rank": 0}, {"process": [{"cpu_percent": math.inf, "ram_used_bytes": math.nan}]})
    exporter.write(records_from_payload(payload, observed_timestamp_unix_ns=TS).records)
    exporter.close()
    (line,) = (tmp_path / "export" / "records.jsonl").read_text().splitlines()
    data = json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert data["cpu_percent"] is None and data["ram_used_bytes"] is None and "hostname" not in data
