"""Projection of envelopes into the seven tables (DESIGN §3.1, 000 seed value rules and ``skipped``)."""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import pytest

from traceml_ai.aggregator.projection import (
    PROJECTION_TABLES,
    PROJECTIONS,
    project_envelope,
    project_payload,
    project_step_time,
    rank_log_lines,
)
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import make_envelope, normalise

OBSERVED = 1_764_500_000_123_456_789
META = {
    "session_id": "s1",
    "global_rank": 3,
    "local_rank": 1,
    "world_size": 4,
    "local_world_size": 2,
    "node_rank": 1,
    "hostname": "gpu-node-7",
    "pid": 4242,
    "sampler": "test",
}


def rows_of(payload: Any, table: str) -> list[dict[str, Any]]:
    """The projected rows of ``table`` as column → value dicts."""
    result = project_payload(payload, observed_ns=OBSERVED)
    names = schema.TABLES_BY_NAME[table].column_names
    out = []
    for row in result.tables.get(table, []):
        assert len(row) == len(names), f"{table} row has {len(row)} values for {len(names)} columns"
        out.append(dict(zip(names, row, strict=True)))
    return out


def one(payload: Any, table: str) -> dict[str, Any]:
    found = rows_of(payload, table)
    assert len(found) == 1
    return found[0]


IDENTITY = {
    "observed_timestamp_unix_ns": OBSERVED,
    "global_rank": 3,
    "local_rank": 1,
    "world_size": 4,
    "local_world_size": 2,
    "node_rank": 1,
    "hostname": "gpu-node-7",
}


def test_step_time_row_and_normalised_events() -> None:
    events = {
        "traceml:forward": {"cuda:0": {"is_gpu": True, "duration_ms": 2, "cpu_ms": 0.5, "gpu_ms": 0.0,
                                       "n_calls": 3, "extra": "dropped"}},
        "my_region": {"cpu": {"cpu_ms": 1.25}},
    }
    env = make_envelope(META, {"step_time": [{"seq": 9, "timestamp_unix_ns": 1234, "step": 17, "events": events}]})
    row = one(env, "step_time_samples")
    assert {k: row[k] for k in IDENTITY} == IDENTITY
    assert row["rank"] == 3
    assert (row["timestamp_unix_ns"], row["seq"], row["step"]) == (1234, 9, 17)
    assert json.loads(row["events_json"]) == {
        # an int duration becomes a float; a measured 0.0 stays 0.0; unknown keys are dropped
        "traceml:forward": {"cuda:0": {"is_gpu": True, "duration_ms": 2.0, "cpu_ms": 0.5, "gpu_ms": 0.0,
                                       "n_calls": 3}},
        # every stat the rank did not send is None
        "my_region": {"cpu": {"is_gpu": None, "duration_ms": None, "cpu_ms": 1.25, "gpu_ms": None,
                              "n_calls": None}},
    }
    assert " " not in row["events_json"]  # compact


def test_stats_of_five_keys_but_one_unknown_are_normalised_not_kept() -> None:
    # Five entries, one of them not a stats key: the missing key is None and the stranger is
    # dropped, in the record's map as in the row's JSON.
    stats = {"is_gpu": False, "duration_ms": 1.5, "cpu_ms": 1.5, "n_calls": 1, "gpu_time": 9.0}
    env = make_envelope(META, {"step_time": [{"seq": 1, "step": 1, "events": {"p": {"cpu": stats}}}]})
    want = {"p": {"cpu": {"is_gpu": False, "duration_ms": 1.5, "cpu_ms": 1.5, "gpu_ms": None, "n_calls": 1}}}
    assert json.loads(one(env, "step_time_samples")["events_json"]) == want
    projections = {**PROJECTIONS, "step_time": partial(project_step_time, encode_events=False)}
    got = project_envelope(normalise(env), OBSERVED, projections=projections)
    assert got.tables["step_time_samples"][0][-1] == want


def test_step_time_without_events_stores_an_empty_map_and_nan_as_null() -> None:
    env = make_envelope(META, {"step_time": [
        {"seq": 1, "timestamp_unix_ns": 5, "step": 1},
        {"seq": 2, "timestamp_unix_ns": 6, "step": 2, "events": {"x": {"cpu": {"cpu_ms": math.nan}}}},
    ]})
    first, second = rows_of(env, "step_time_samples")
    assert first["events_json"] == "{}"
    assert json.loads(second["events_json"])["x"]["cpu"]["cpu_ms"] is None


def test_records_can_keep_the_events_map_instead_of_json() -> None:
    projections = {**PROJECTIONS, "step_time": partial(project_step_time, encode_events=False)}
    env = normalise(make_envelope(META, {"step_time": [{"seq": 1, "step": 1, "events": {"a": {"cpu": {}}}}]}))
    got = project_envelope(env, OBSERVED, projections=projections)
    (row,) = got.tables["step_time_samples"]
    assert row[-1] == {"a": {"cpu": {"is_gpu": None, "duration_ms": None, "cpu_ms": None, "gpu_ms": None,
                                     "n_calls": None}}}


def test_none_stays_none_and_a_measured_zero_stays_zero() -> None:
    env = make_envelope(META, {
        "step_memory": [{"seq": 1, "timestamp_unix_ns": 7, "device": "cuda:0", "step": 0,
                         "peak_alloc_bytes": 0, "peak_reserved_bytes": None}],
        "process": [{"seq": 1, "timestamp_unix_ns": 7, "cpu_percent": 0.0, "cpu_logical_core_count": 8,
                     "ram_used_bytes": 0, "ram_total_bytes": 16e9, "gpu_available": 0, "gpu_count": 0,
                     "gpu_device_index": None}],
    })
    mem = one(env, "step_memory_samples")
    assert mem["step"] == 0 and mem["peak_alloc_bytes"] == 0.0 and mem["peak_reserved_bytes"] is None
    assert isinstance(mem["peak_alloc_bytes"], float)
    proc = one(env, "process_samples")
    assert proc["cpu_percent"] == 0.0 and proc["ram_used_bytes"] == 0.0
    assert proc["gpu_available"] == 0 and proc["gpu_count"] == 0
    # keys the rank did not send at all are None, never 0
    assert proc["gpu_device_index"] is None and proc["gpu_mem_used_bytes"] is None
    assert proc["gpu_mem_reserved_bytes"] is None and proc["gpu_mem_total_bytes"] is None


def test_legacy_rank_and_legacy_timestamp() -> None:
    meta = {"rank": 2, "hostname": "old-node"}  # an old rank: legacy 'rank', no other identity
    env = make_envelope(meta, {"step_memory": [{"seq": 4, "timestamp": 1764500000.25, "step": 4,
                                                "device": "cpu", "peak_alloc_bytes": 10.0}]})
    row = one(env, "step_memory_samples")
    assert row["rank"] == 2 and row["global_rank"] == 2
    assert row["local_rank"] is None and row["world_size"] is None and row["node_rank"] is None
    assert row["timestamp_unix_ns"] is None  # a float timestamp alone is not an integer source time
    assert row["seq"] == 4


def test_ints_are_ints_not_bools_and_step_must_be_an_integer() -> None:
    env = make_envelope(META, {"step_time": [
        {"seq": True, "timestamp_unix_ns": 1.5e18, "step": 3.0},
        {"seq": 2, "timestamp_unix_ns": 10, "step": "7"},
        {"seq": 3, "timestamp_unix_ns": 11, "step": False},
    ]})
    rows = rows_of(env, "step_time_samples")
    # A bool seq is a value the record cannot hold: that row is skipped and counted once. step and
    # timestamp_unix_ns are None when not integers (000 seed).
    assert [r["seq"] for r in rows] == [2, 3]
    assert [r["step"] for r in rows] == [None, None]
    assert project_payload(env, observed_ns=OBSERVED).skipped == 1
    floats = make_envelope(META, {"step_time": [{"seq": 1, "timestamp_unix_ns": 1.5e18, "step": 3.0}]})
    (row,) = rows_of(floats, "step_time_samples")
    assert row["step"] is None and row["timestamp_unix_ns"] is None


@pytest.mark.parametrize("identity", [{"global_rank": True}, {"world_size": 4.0}, {"hostname": 7}])
def test_identity_of_the_wrong_type_loses_the_envelope_once_instead_of_reading_none(identity: dict[str, Any]) -> None:
    """Issue 11: only a missing or null identity field is None; a bool rank, a float world_size or a
    numeric hostname loses that envelope's rows, counted once (the rows are not filed under None)."""
    env = make_envelope({**META, **identity}, {"step_time": [{"seq": 1, "timestamp_unix_ns": 10, "step": 1}]})
    result = project_payload([env, make_envelope(META, {"step_time": [{"seq": 2, "timestamp_unix_ns": 11,
                                                                                "step": 2}]})],
                             observed_ns=OBSERVED)
    assert result.skipped == 1
    assert [row[schema.TABLES_BY_NAME["step_time_samples"].column_names.index("step")]
            for row in result.tables["step_time_samples"]] == [2]


def test_integer_booleans_become_one_and_zero() -> None:
    env = make_envelope(META, {
        "system": [{"seq": 1, "timestamp_unix_ns": 1, "gpu_available": True, "gpu_count": 1}],
        "runtime_environment": [{"seq": 1, "timestamp_unix_ns": 1, "distributed_initialized": False}],
    })
    assert one(env, "system_samples")["gpu_available"] == 1
    assert type(one(env, "system_samples")["gpu_available"]) is int
    assert one(env, "runtime_environment")["distributed_initialized"] == 0


def test_system_gives_one_gpu_row_per_gpu_with_its_position() -> None:
    gpus = [
        {"util": 97.0, "mem_used_bytes": 30e9, "mem_total_bytes": 80e9, "temperature_c": 71,
         "power_usage_w": 350.5, "power_limit_w": 400},
        {"util": 0.0, "mem_used_bytes": None},
    ]
    env = make_envelope(META, {"system": [{"seq": 8, "timestamp_unix_ns": 99, "cpu_percent": 12.5,
                                           "ram_used_bytes": 4e9, "ram_total_bytes": 64e9,
                                           "gpu_available": 1, "gpu_count": 2, "gpus": gpus}]})
    host = one(env, "system_samples")
    assert "rank" not in host  # system rows have no rank column
    assert {k: host[k] for k in IDENTITY} == IDENTITY
    assert (host["seq"], host["cpu_percent"], host["gpu_count"]) == (8, 12.5, 2)
    first, second = rows_of(env, "system_gpu_samples")
    assert (first["gpu_idx"], first["seq"], first["timestamp_unix_ns"]) == (0, 8, 99)
    assert first["temperature_c"] == 71.0 and first["power_limit_w"] == 400.0
    assert second["gpu_idx"] == 1 and second["util"] == 0.0
    assert second["mem_used_bytes"] is None and second["power_usage_w"] is None
    # the writer's order within one envelope: the host row's table before the GPU rows' table
    assert list(project_payload(env).tables) == ["system_samples", "system_gpu_samples"]


def test_a_gpu_list_or_item_of_the_wrong_type_skips_its_whole_snapshot_once() -> None:
    env = make_envelope(META, {"system": [{"seq": 1, "gpus": [{"util": 5.0}, "broken", {"util": 6.0}]},
                                          {"seq": 2, "gpus": "not a list"},
                                          {"seq": 3, "gpus": [{"util": {"not": "a number"}}]},
                                          {"seq": 4, "gpus": [{"util": 5.0}, {"util": 6.0}]}]})
    result = project_payload(env, observed_ns=OBSERVED)
    assert result.skipped == 3  # one per snapshot that does not fit, never half kept
    assert [r[8] for r in result.tables["system_samples"]] == [4]
    assert [dict(zip(schema.SYSTEM_GPU_SAMPLES.column_names, r, strict=True))["gpu_idx"]
            for r in result.tables["system_gpu_samples"]] == [0, 1]


def test_runtime_environment_takes_pid_from_meta() -> None:
    env = make_envelope(META, {"runtime_environment": [{
        "seq": 0, "timestamp_unix_ns": 3, "topology": "single_node", "distributed_initialized": 1,
        "distributed_backend": "gloo", "training_strategy": "ddp", "strategy_source": "torch.distributed",
        "strategy_confidence": "high", "pid": 1}]})
    row = one(env, "runtime_environment")
    assert row["pid"] == 4242
    assert (row["topology"], row["distributed_backend"], row["training_strategy"]) == ("single_node", "gloo", "ddp")
    assert (row["strategy_source"], row["strategy_confidence"]) == ("torch.distributed", "high")


def test_stdout_stderr_rank_is_global_rank_and_empty_lines_are_not_recorded() -> None:
    env = make_envelope(META, {"stdout_stderr": [
        {"timestamp_unix_ns": 1, "line": "epoch 1 loss 0.5", "stream": "stdout"},
        {"timestamp_unix_ns": 2, "line": ""},
        {"timestamp_unix_ns": 3, "line": "Traceback (most recent call last):", "stream": "stderr"},
        {"timestamp_unix_ns": 4, "line": 42},
    ]})
    result = project_payload(env, observed_ns=OBSERVED)
    assert result.skipped == 1  # the non-text line; the empty line is no loss
    assert result.tables["stdout_stderr_samples"] == [
        (OBSERVED, 3, 1, "epoch 1 loss 0.5"),
        (OBSERVED, 3, 3, "Traceback (most recent call last):"),
    ]
    assert rank_log_lines(normalise(env)) == [
        (3, "stdout | epoch 1 loss 0.5"),
        (3, "stderr | Traceback (most recent call last):"),
    ]


def test_unknown_streams_are_counted_and_the_rest_is_kept() -> None:
    env = make_envelope(META, {"gpu_kernels": [{"a": 1}, {"a": 2}], "step_memory": [{"seq": 1}]})
    result = project_payload(env)
    assert result.unknown_streams == {"gpu_kernels": 2}
    assert result.rows == 1 and result.skipped == 0


def test_skipped_counts_items_rows_and_raising_projections_once_each() -> None:
    def broken(meta: Any, rows: list[Any], observed_ns: int) -> Any:
        raise RuntimeError("projection bug")

    projections = {**PROJECTIONS, "process": broken}
    payload = [
        "not an envelope",
        {"meta": {}, "tables": "not a mapping"},
        {"meta": META, "tables": {
            "process": [{"seq": i} for i in range(50)],     # 50 rows, one raising projection: counts 1
            "step_memory": [{"seq": 1}, "not a row", {"seq": 2}],
        }},
    ]
    result = project_payload(payload, projections=projections)
    assert result.skipped == 2 + 1 + 1
    assert "process_samples" not in result.tables
    assert len(result.tables["step_memory_samples"]) == 2
    assert any("projection bug" in f for f in result.failures)


def test_unselected_streams_are_neither_projected_nor_counted() -> None:
    env = {"meta": META, "tables": {"process": ["bad"], "step_memory": [{"seq": 1}]}}
    result = project_payload(env, streams={"step_memory"})
    assert result.skipped == 0 and list(result.tables) == ["step_memory_samples"]


def test_every_table_is_written_by_a_projection_in_the_writers_order() -> None:
    tables = {
        "stdout_stderr": [{"timestamp_unix_ns": 1, "line": "x"}],
        "runtime_environment": [{"seq": 1}],
        "process": [{"seq": 1}],
        "system": [{"seq": 1, "gpus": [{}]}],
        "step_memory": [{"seq": 1}],
        "step_time": [{"seq": 1}],
    }
    result = project_payload([make_envelope(META, tables)] * 2, observed_ns=OBSERVED)
    assert list(result.tables) == [t.name for t in schema.TABLES]
    for table in schema.TABLES:
        assert all(len(r) == len(table.columns) for r in result.tables[table.name])
        assert len(result.tables[table.name]) == 2
    assert set(PROJECTIONS) == set(schema.RANK_STREAMS)
    assert {t for names in PROJECTION_TABLES.values() for t in names} == set(schema.TABLES_BY_NAME)


def test_each_envelope_is_stamped_when_no_observed_time_is_given() -> None:
    env = make_envelope(META, {"step_memory": [{"seq": 1}]})
    result = project_payload([env, env])
    stamps = [r[0] for r in result.tables["step_memory_samples"]]
    assert all(isinstance(s, int) and s > 1_700_000_000 * 10**9 for s in stamps)


@pytest.mark.parametrize("stream", schema.RANK_STREAMS)
def test_a_row_that_is_not_a_mapping_counts_once_in_every_stream(stream: str) -> None:
    env = make_envelope(META, {stream: []})
    env["tables"][stream] = [7, None]
    result = project_payload(env)
    assert result.skipped == 2 and result.rows == 0
