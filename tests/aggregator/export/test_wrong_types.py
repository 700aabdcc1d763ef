"""Every field of every record with a value its record cannot hold (000 seed, ``skipped``; issue 11,
item 6): the row is skipped and counts once, in the export records and in the SQLite projection
alike (one projection code), and a real aggregator reports the loss in finalization_warning.json.
Only a missing key or null is None; ``step`` and ``timestamp_unix_ns`` are None when not integers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.test_main import AggregatorProcess, count
from tests.aggregator.wire import RankClient, events, step_time_rows
from traceml_ai.aggregator.export import records_from_payload
from traceml_ai.aggregator.export.records import RECORD_TYPE_BY_STREAM
from traceml_ai.aggregator.projection import project_payload
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import make_envelope

META = {"session_id": "s", "global_rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1,
        "node_rank": 0, "hostname": "h", "pid": 7, "sampler": "t"}

GOOD: dict[str, dict[str, Any]] = {
    schema.STEP_TIME: {"seq": 1, "timestamp_unix_ns": 10, "step": 3, "events": events()},
    schema.STEP_MEMORY: {"seq": 1, "timestamp_unix_ns": 10, "device": "cuda:0", "step": 3,
                         "peak_alloc_bytes": 1.0e6, "peak_reserved_bytes": 2.0e6},
    schema.SYSTEM: {"seq": 1, "timestamp_unix_ns": 10, "cpu_percent": 50.0, "ram_used_bytes": 1e9,
                    "ram_total_bytes": 8e9, "gpu_available": 1, "gpu_count": 1,
                    "gpus": [{"util": 90.0, "mem_used_bytes": 1e9, "mem_total_bytes": 8e10, "temperature_c": 60.0,
                              "power_usage_w": 200.0, "power_limit_w": 400.0}]},
    schema.PROCESS: {"seq": 1, "timestamp_unix_ns": 10, "cpu_percent": 99.0, "cpu_logical_core_count": 8,
                     "ram_used_bytes": 1e9, "ram_total_bytes": 8e9, "gpu_available": 0, "gpu_count": 0,
                     "gpu_device_index": 0, "gpu_mem_used_bytes": 1.0, "gpu_mem_reserved_bytes": 2.0,
                     "gpu_mem_total_bytes": 3.0},
    schema.RUNTIME_ENVIRONMENT: {"seq": 1, "timestamp_unix_ns": 10, "topology": "single", "distributed_initialized": 0,
                                 "distributed_backend": "gloo", "training_strategy": "DDP",
                                 "strategy_source": "model", "strategy_confidence": "high"},
    schema.STDOUT_STDERR: {"timestamp_unix_ns": 10, "line": "hello", "stream": "stdout"},
}

INT_FIELDS = {"seq", "gpu_count", "cpu_logical_core_count", "gpu_device_index"}
FLAG_FIELDS = {"gpu_available", "distributed_initialized"}
TEXT_FIELDS = {"device", "topology", "distributed_backend", "training_strategy", "strategy_source",
               "strategy_confidence", "line"}
NONE_WHEN_NOT_INTEGER = {"step", "timestamp_unix_ns"}

WRONG_FOR_NUMBER = [{"an": "object"}, [1, 2], "7", True]
WIDE = [1 << 63, -(1 << 63) - 1, (1 << 64) - 1]  # beyond SQLite's INTEGER (review 11d)
WRONG_FOR_INT = [*WRONG_FOR_NUMBER, 1.5, *WIDE]
WRONG_FOR_FLAG = [{"an": "object"}, [1], "1", 1.5, 3, 2, -1]  # an integer boolean is 1 or 0 (000 seed)
WRONG_FOR_TEXT = [{"an": "object"}, ["x"], 7, 1.5, True]


def _wrong_values(field: str) -> list[Any]:
    if field in TEXT_FIELDS:
        return WRONG_FOR_TEXT
    if field in FLAG_FIELDS:
        return WRONG_FOR_FLAG
    if field in INT_FIELDS or field in NONE_WHEN_NOT_INTEGER:
        return WRONG_FOR_INT
    return WRONG_FOR_NUMBER  # REAL fields


def _cases() -> list[Any]:
    cases = []
    for stream, row in GOOD.items():
        for field in row:
            if field in ("events", "gpus", "stream"):
                continue  # nested maps below; "stream" is not a record field
            for value in _wrong_values(field):
                cases.append(pytest.param(stream, {**row, field: value}, field, id=f"{stream}.{field}={value!r}"))
    stats = events()[schema.STEP]["cpu"]
    for key in stats:
        wrong = [{"x": 1}, [1], "1.5", 2, 1, 0] if key == "is_gpu" else WRONG_FOR_INT if key == "n_calls" \
            else WRONG_FOR_NUMBER
        for value in wrong:
            bad_events = {**events(), schema.STEP: {"cpu": {**stats, key: value}}}
            cases.append(pytest.param(schema.STEP_TIME, {**GOOD[schema.STEP_TIME], "events": bad_events},
                                      f"events.{key}", id=f"step_time.events.{key}={value!r}"))
    for value in (["not", "a", "map"], "x", 5):
        cases.append(pytest.param(schema.STEP_TIME, {**GOOD[schema.STEP_TIME], "events": value}, "events",
                                  id=f"step_time.events={value!r}"))
    gpu = GOOD[schema.SYSTEM]["gpus"][0]
    for key in gpu:
        for value in WRONG_FOR_NUMBER:
            cases.append(pytest.param(schema.SYSTEM, {**GOOD[schema.SYSTEM], "gpus": [gpu, {**gpu, key: value}]},
                                      f"gpus.{key}", id=f"system.gpus.{key}={value!r}"))
    for value in ("2 GPUs", {"0": gpu}, 2, [gpu, "broken"]):
        cases.append(pytest.param(schema.SYSTEM, {**GOOD[schema.SYSTEM], "gpus": value}, "gpus",
                                  id=f"system.gpus={value!r}"))
    return cases


def _records_of(payload: Any) -> tuple[dict[str, int], int]:
    batch = records_from_payload(payload, observed_timestamp_unix_ns=1)
    counts: dict[str, int] = {}
    for record in batch.records:
        counts[record.STREAM] = counts.get(record.STREAM, 0) + 1
    return counts, batch.skipped


@pytest.mark.parametrize(("stream", "bad_row", "field"), _cases())
def test_a_field_its_record_cannot_hold_skips_the_row_once(stream: str, bad_row: dict[str, Any], field: str) -> None:
    good = GOOD[stream]
    payload = make_envelope(META, {stream: [good, bad_row, good]})
    expected_rows = {"system": 2, "system_gpu": 2} if stream == schema.SYSTEM else {stream: 2}
    if field in NONE_WHEN_NOT_INTEGER and bad_row[field] not in WIDE:
        # The 000 seed: None means "the row had no integer step / source time"; the row is kept.
        counts, skipped = _records_of(payload)
        assert skipped == 0
        kept = [r for r in records_from_payload(payload).records if r.STREAM == stream]
        assert len(kept) == 3 and getattr(kept[1], field) is None
        assert project_payload(payload, observed_ns=1).skipped == 0
        return
    counts, skipped = _records_of(payload)
    assert counts == expected_rows, field
    assert skipped == 1
    # The SQLite projection: the same rows and the same count.
    sqlite = project_payload(payload, observed_ns=1)
    assert sqlite.skipped == 1
    assert {name: len(rows) for name, rows in sqlite.tables.items()} == {
        RECORD_TYPE_BY_STREAM[name].TABLE: n for name, n in expected_rows.items()
    }


def test_missing_keys_and_nulls_are_none_and_no_loss() -> None:
    for stream, row in GOOD.items():
        if stream == schema.STDOUT_STDERR:
            continue  # a line is never None
        nulls = {key: None for key in row if key != "stream"}
        payload = make_envelope(META, {stream: [nulls, {}]})
        counts, skipped = _records_of(payload)
        assert skipped == 0 and counts.get(stream) == 2, stream


@pytest.mark.parametrize("field", sorted(FLAG_FIELDS))
def test_an_integer_boolean_takes_true_false_one_and_zero(field: str) -> None:
    stream = schema.RUNTIME_ENVIRONMENT if field == "distributed_initialized" else schema.PROCESS
    rows = [{**GOOD[stream], field: value} for value in (True, False, 1, 0, None)]
    batch = records_from_payload(make_envelope(META, {stream: rows}), observed_timestamp_unix_ns=1)
    assert batch.skipped == 0
    assert [getattr(r, field) for r in batch.records] == [1, 0, 1, 0, None]


@pytest.mark.timeout(60)
def test_the_loss_reaches_finalization_warning_json(tmp_path: Path) -> None:
    agg = AggregatorProcess(tmp_path, "--world-size", "1")  # the real aggregator process
    try:
        client = RankClient(agg.port, 0, world_size=1)
        client.hello()
        good = step_time_rows(0, 3)
        client.send({"step_time": [good[0], {**good[1], "seq": {"an": "object"}}, good[2]],
                     "step_memory": [{**GOOD[schema.STEP_MEMORY], "peak_alloc_bytes": {"dict": 1}}],
                     "system": [{**GOOD[schema.SYSTEM], "gpus": "2 GPUs"}]})
        # A frame well typed but for an integer boolean that is neither 1 nor 0 (the server's fast path).
        client.send({"process": [GOOD[schema.PROCESS], {**GOOD[schema.PROCESS], "gpu_available": 3}]})
        # msgpack carries integers up to 2**64 - 1, SQLite's INTEGER up to 2**63 - 1: skipped, not an error.
        wide = step_time_rows(0, 6)[3:]
        client.send({"step_time": [wide[0], {**wide[1], "seq": 1 << 63}, wide[2]]})
        client.finish()
        client.close()
        code, _, _ = agg.signal_and_wait()
    finally:
        agg.kill()
    assert code == 0
    assert count(agg.db, "step_time_samples") == 4
    assert count(agg.db, "process_samples") == 1
    report = json.loads((tmp_path / "aggregator" / "finalization_warning.json").read_text())
    assert report["projection"]["skipped"] == 5
    assert report["sqlite"]["errors"] == 0 and report["sqlite"]["lost_rows"] == 0
    assert "5 telemetry items or rows did not fit their table" in report["summary"]
