"""``records_from_payload`` (000 seed: "What a record is", ``skipped``, "Ordering and duplicates")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.export.sample import (
    RECORDS_PER_FULL_ENVELOPE,
    SESSION,
    full_envelope,
    full_tables,
    meta,
)
from tests.aggregator.wire import AggregatorThread, RankClient
from traceml_ai.aggregator.export import (
    RECORD_STREAMS,
    RecordBatch,
    StepMemoryRecord,
    StepTimeRecord,
    SystemGpuRecord,
    SystemRecord,
    records_from_payload,
)
from traceml_ai.aggregator.export.payload import RECORD_PROJECTIONS, build_records
from traceml_ai.aggregator.export.records import RECORD_TYPE_BY_TABLE
from traceml_ai.aggregator.projection import PROJECTION_TABLES, PROJECTIONS, Projected, project_payload
from traceml_ai.aggregator.store import open_readonly
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import make_envelope

OBSERVED = 1_764_500_000_999_000_000


def streams_of(batch: RecordBatch) -> list[str]:
    return [r.STREAM for r in batch.records]


# -- the same projection code as the SQLite rows --------------------------------------------------------


def test_one_payload_gives_records_whose_every_shared_field_equals_its_sqlite_row(tmp_path: Path) -> None:
    """The records and the rows the real aggregator writes to SQLite come from the same projection:
    every field a record shares with its row holds the same value, and step_time's events map is
    the row's events_json decoded. Only the observed stamp is taken separately."""
    payload = [full_envelope(0), full_envelope(1, hostname=None, first_step=5)]
    server = AggregatorThread(tmp_path, session_id=SESSION, world_size=2, flush_interval_s=0.05)
    client = RankClient(server.port, 0, session_id=SESSION)
    assert client.hello()["control"] == "welcome"
    client.send_body(payload)
    client.finish(sent_batches=1)
    client.close()
    server.stop()
    records = records_from_payload(payload).records
    conn = open_readonly(tmp_path / "aggregator" / "telemetry.sqlite")
    try:
        for table in schema.TABLES:
            cls = RECORD_TYPE_BY_TABLE[table.name]
            mine = [r for r in records if type(r) is cls]
            names = table.column_names
            rows = conn.execute(f"SELECT {', '.join(names)} FROM {table.name} ORDER BY id").fetchall()
            assert len(rows) == len(mine) > 0, table.name
            for record, row in zip(mine, rows, strict=True):
                stored = dict(zip(names, row, strict=True))
                assert isinstance(stored.pop("observed_timestamp_unix_ns"), int)
                if cls is StepTimeRecord:
                    assert json.loads(stored.pop("events_json")) == record.events  # type: ignore[union-attr]
                for name, value in stored.items():
                    assert getattr(record, name) == value, (table.name, name)
    finally:
        conn.close()


def test_with_one_observed_stamp_records_and_projected_rows_are_equal_field_for_field() -> None:
    payload = [full_envelope(0), full_envelope(1)]
    rows = project_payload(payload, observed_ns=OBSERVED).tables
    records = records_from_payload(payload, observed_timestamp_unix_ns=OBSERVED).records
    for table, table_rows in rows.items():
        cls = RECORD_TYPE_BY_TABLE[table]
        mine = [r for r in records if type(r) is cls]
        for record, row in zip(mine, table_rows, strict=True):
            values = dict(zip(schema.TABLES_BY_NAME[table].column_names, row, strict=True))
            if "events_json" in values:
                values["events"] = json.loads(values.pop("events_json"))
            assert {name: getattr(record, name) for name in cls.COLUMNS} == values


def test_every_table_a_projection_writes_has_a_record() -> None:
    """Rule: a table written by a projection without a record would be skipped; this keeps none."""
    declared = {table for tables in PROJECTION_TABLES.values() for table in tables}
    written: set[str] = set()
    envelope = full_envelope(0)
    for projections in (PROJECTIONS, RECORD_PROJECTIONS):
        assert set(projections) == set(schema.RANK_STREAMS)
        for stream, projection in projections.items():
            written.update(projection(envelope["meta"], envelope["tables"][stream], OBSERVED).tables)
    assert written == declared == {t.name for t in schema.TABLES}
    assert set(RECORD_TYPE_BY_TABLE) == written


# -- the payload and its envelopes ---------------------------------------------------------------------


def test_a_payload_is_one_envelope_dict_or_a_list_of_them() -> None:
    one = records_from_payload(full_envelope(0))
    many = records_from_payload([full_envelope(0), full_envelope(1)])
    assert one.skipped == many.skipped == 0
    assert len(one.records) == sum(RECORDS_PER_FULL_ENVELOPE.values())
    assert len(many.records) == 2 * len(one.records)


def test_a_given_observed_stamp_goes_to_every_envelope() -> None:
    batch = records_from_payload([full_envelope(0), full_envelope(1)], observed_timestamp_unix_ns=OBSERVED)
    assert {r.observed_timestamp_unix_ns for r in batch.records} == {OBSERVED}


class SlowEnvelope(Mapping[str, Any]):
    """An envelope that takes a few milliseconds to be read, so it is built visibly later."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        self._envelope = envelope

    def __getitem__(self, key: str) -> Any:
        if key == "meta":
            time.sleep(0.005)
        return self._envelope[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._envelope)

    def __len__(self) -> int:
        return len(self._envelope)


def test_without_a_given_stamp_each_envelope_is_stamped_once_when_its_records_are_built() -> None:
    before = time.time_ns()
    batch = records_from_payload([full_envelope(0), SlowEnvelope(full_envelope(1))])
    after = time.time_ns()
    by_rank: dict[int | None, set[int]] = {}
    for record in batch.records:
        by_rank.setdefault(getattr(record, "global_rank", getattr(record, "rank", None)),
                           set()).add(record.observed_timestamp_unix_ns)
    (first,), (second,) = by_rank[0], by_rank[1]  # one stamp per envelope
    assert before <= first < second <= after
    assert second - first >= 4_000_000  # the second envelope's stamp was taken after its slow read


def test_records_keep_payload_order_and_the_writer_table_order_within_an_envelope() -> None:
    batch = records_from_payload([full_envelope(1), full_envelope(0)])
    per_envelope = sum(RECORDS_PER_FULL_ENVELOPE.values())
    order = [s for s in RECORD_STREAMS for _ in range(RECORDS_PER_FULL_ENVELOPE[s])]
    assert streams_of(batch) == order + order
    ranks = [getattr(r, "global_rank", getattr(r, "rank", None)) for r in batch.records]
    assert ranks == [1] * per_envelope + [0] * per_envelope
    # a system snapshot gives its SystemRecord before its SystemGpuRecord entries
    kinds = [type(r) for r in batch.records[:per_envelope] if isinstance(r, (SystemRecord, SystemGpuRecord))]
    assert kinds == [SystemRecord, SystemGpuRecord, SystemGpuRecord]


def test_records_are_not_sorted_by_step_or_time() -> None:
    rows = [{"step": 9, "timestamp_unix_ns": 30}, {"step": 2, "timestamp_unix_ns": 10}]
    batch = records_from_payload(make_envelope(meta(0), {"step_memory": rows}))
    assert [r.step for r in batch.records] == [9, 2]  # type: ignore[union-attr]


def test_duplicate_rows_are_passed_through_not_removed() -> None:
    envelope = full_envelope(0)
    batch = records_from_payload([envelope, envelope])
    steps = [(r.global_rank, r.step) for r in batch.records if isinstance(r, StepTimeRecord)]
    assert steps == [(0, 0), (0, 1), (0, 0), (0, 1)]


def test_one_sampler_tick_can_carry_several_steps_with_the_same_seq() -> None:
    steps = [r for r in records_from_payload(full_envelope(0)).records if isinstance(r, StepTimeRecord)]
    assert {r.seq for r in steps} == {7} and [r.step for r in steps] == [0, 1]


# -- streams --------------------------------------------------------------------------------------------


def test_with_streams_only_records_of_those_streams_are_built() -> None:
    batch = records_from_payload(full_envelope(0), streams={"step_memory", "system_gpu"})
    assert streams_of(batch) == ["step_memory", "system_gpu", "system_gpu"] and batch.skipped == 0
    assert streams_of(records_from_payload(full_envelope(0), streams=["system"])) == ["system"]


def test_none_keeps_every_stream() -> None:
    assert set(streams_of(records_from_payload(full_envelope(0), streams=None))) == set(RECORD_STREAMS)


def test_rows_of_unselected_streams_are_neither_built_nor_counted_in_skipped() -> None:
    tables = full_tables(0)
    tables["process"] = ["not a row", 7]
    tables["stdout_stderr"].append({"line": 42})
    payload = {"meta": meta(0), "tables": tables}
    assert records_from_payload(payload).skipped == 3
    batch = records_from_payload(payload, streams={"step_time"})
    assert batch.skipped == 0 and set(streams_of(batch)) == {"step_time"}


class ExplodingPayload(list[Any]):
    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the payload was read before the streams were checked")


@pytest.mark.parametrize("streams", ["step_time", "", b"step_time", [], set(), ("step_time", "steps"), ["system", 3]])
def test_a_string_an_empty_collection_or_an_unknown_name_in_streams_raises_before_the_payload_is_read(
    streams: Any,
) -> None:
    with pytest.raises(ValueError, match="valid names: step_time, step_memory, system, system_gpu"):
        records_from_payload(ExplodingPayload([full_envelope(0)]), streams=streams)


# -- skipped ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("item", ["text", 42, None, {"meta": {}}, {"meta": [], "tables": {}},
                                  {"tables": {3: []}}, {"tables": []}])
def test_an_item_that_does_not_normalise_to_an_envelope_counts_once(item: Any) -> None:
    batch = records_from_payload([full_envelope(0), item, full_envelope(1)])
    assert batch.skipped == 1
    assert len(batch.records) == 2 * sum(RECORDS_PER_FULL_ENVELOPE.values())


class BrokenTables(Mapping[str, Any]):
    """A tables mapping that fails while it is read: an item that fails in another way."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield "step_time"
        raise RuntimeError("lost connection to the shared memory")

    def __len__(self) -> int:
        return 2


def test_an_item_that_fails_in_any_other_way_counts_once_and_gives_no_records() -> None:
    batch = records_from_payload([{"meta": meta(0), "tables": BrokenTables()}, full_envelope(1)])
    assert batch.skipped == 1
    assert {getattr(r, "global_rank", getattr(r, "rank", None)) for r in batch.records} == {1}


class ExplodingRow(Mapping[str, Any]):
    """A row whose values cannot be read: the projection that reads it raises."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("row storage gone")

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("row storage gone")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_a_projection_that_raises_counts_once_and_its_envelope_loses_every_row_of_its_tables() -> None:
    tables = full_tables(0)
    good_host = dict(tables["system"][0])
    tables["system"] = [good_host, good_host, ExplodingRow(), good_host]  # would have been 4 hosts, 8 GPUs
    batch = records_from_payload([{"meta": meta(0), "tables": tables}, full_envelope(1)])
    assert batch.skipped == 1
    system_of_rank = [(r.STREAM, r.global_rank) for r in batch.records if isinstance(r, (SystemRecord,
                                                                                           SystemGpuRecord))]
    assert system_of_rank == [("system", 1), ("system_gpu", 1), ("system_gpu", 1)]
    others = [r for r in batch.records if isinstance(r, StepMemoryRecord)]
    assert [r.global_rank for r in others] == [0, 1]  # the envelope keeps its other tables


BAD_TABLE = {"meta": {"global_rank": 0},
             "tables": {"step_time": "notalist", "process": [{"seq": 1, "cpu_percent": 1.0}]}}


def test_a_table_that_is_not_a_list_loses_only_its_projections_rows_and_the_other_streams_are_kept() -> None:
    """A bad table is a loss of the projection that reads it (counted once), not of the envelope."""
    batch = records_from_payload(BAD_TABLE)
    assert batch.skipped == 1
    assert [(r.STREAM, r.global_rank, r.seq, r.cpu_percent) for r in batch.records] == [("process", 0, 1, 1.0)]


def test_a_bad_table_of_an_unselected_stream_is_neither_built_nor_counted() -> None:
    """The repro of the review: a malformed step_time table must not drop the selected process row."""
    batch = records_from_payload(BAD_TABLE, streams={"process"})
    assert batch.skipped == 0 and streams_of(batch) == ["process"]
    batch = records_from_payload(BAD_TABLE, streams={"step_time"})
    assert batch == RecordBatch([], 1)


@pytest.mark.parametrize("selected", [{"system"}, {"system_gpu"}, {"system", "system_gpu"}, None])
def test_a_bad_system_table_counts_once_for_both_tables_its_projection_writes(selected: Any) -> None:
    tables: dict[str, Any] = full_tables(0)
    tables["system"] = {"cpu_percent": 5.0}  # a row where the list of rows belongs
    batch = records_from_payload({"meta": meta(0), "tables": tables}, streams=selected)
    assert batch.skipped == 1
    assert "system" not in streams_of(batch) and "system_gpu" not in streams_of(batch)
    if selected is None:
        assert len(batch.records) == sum(RECORDS_PER_FULL_ENVELOPE.values()) - RECORDS_PER_FULL_ENVELOPE["system"] \
            - RECORDS_PER_FULL_ENVELOPE["system_gpu"]


def test_the_sqlite_projection_treats_a_bad_table_the_same_way() -> None:
    projected = project_payload(BAD_TABLE, observed_ns=OBSERVED)
    assert projected.skipped == 1 and projected.failures == ["step_time: the table is not a list of rows"]
    assert list(projected.tables) == ["process_samples"] and projected.rows == 1
    assert list(projected.tables["process_samples"][0]) == [
        v for k, v in records_from_payload(BAD_TABLE, observed_timestamp_unix_ns=OBSERVED).records[0].__dict__.items()
    ]


def test_the_real_aggregator_keeps_the_other_streams_of_an_envelope_with_a_bad_table(tmp_path: Path) -> None:
    """Over a real socket (the server's generic path): the process row and the stdout line reach
    SQLite and the rank log; the bad step_time table is one projection loss."""
    envelope = {"meta": {**meta(0), "session_id": SESSION},
                "tables": {**BAD_TABLE["tables"], "stdout_stderr": [{"line": "epoch 1", "stream": "stdout"}]}}
    server = AggregatorThread(tmp_path, session_id=SESSION, world_size=1, flush_interval_s=0.05)
    client = RankClient(server.port, 0, session_id=SESSION, world_size=1)
    assert client.hello()["control"] == "welcome"
    client.send_body(envelope)
    client.finish(sent_batches=1)
    client.close()
    server.stop()
    assert server.agg.stats.projection_skipped == 1
    conn = open_readonly(tmp_path / "aggregator" / "telemetry.sqlite")
    try:
        assert conn.execute("SELECT global_rank, seq, cpu_percent FROM process_samples").fetchall() == [(0, 1, 1.0)]
        assert conn.execute("SELECT line FROM stdout_stderr_samples").fetchall() == [("epoch 1",)]
        assert conn.execute("SELECT COUNT(*) FROM step_time_samples").fetchone() == (0,)
    finally:
        conn.close()
    assert "stdout | epoch 1" in (tmp_path / "aggregator" / "rank_0.log").read_text()


@pytest.mark.parametrize("observed", ["x", 1.5, True, False, b"1", [1]])
def test_an_observed_stamp_that_is_not_an_int_raises_type_error_before_the_payload_is_read(observed: Any) -> None:
    with pytest.raises(TypeError, match="observed_timestamp_unix_ns must be an int"):
        records_from_payload(ExplodingPayload([full_envelope(0)]), observed_timestamp_unix_ns=observed)
    with pytest.raises(TypeError, match="observed_ns must be an int"):
        project_payload(ExplodingPayload([full_envelope(0)]), observed_ns=observed)


@pytest.mark.parametrize(("stream", "bad_rows", "kept"), [
    ("step_memory", ["not a row", 3, None], 1),
    ("step_time", [{"step": 1, "events": ["forward"]}, {"step": 2, "events": {"traceml:forward": 3}}], 2),
    ("stdout_stderr", [{"line": 42}, {"line": None}], 2),
])
def test_a_row_that_does_not_fit_its_record_counts_once_and_the_other_rows_are_kept(
    stream: str, bad_rows: list[Any], kept: int,
) -> None:
    tables = full_tables(0)
    tables[stream] = tables[stream] + bad_rows
    batch = records_from_payload({"meta": meta(0), "tables": tables}, streams={stream})
    assert batch.skipped == len(bad_rows)
    assert len(batch.records) == kept


def test_a_gpu_item_that_is_not_a_mapping_skips_its_snapshot_once_never_half_kept() -> None:
    tables = full_tables(0)
    tables["system"][0]["gpus"].append("GPU 2 vanished")
    batch = records_from_payload({"meta": meta(0), "tables": tables}, streams={"system", "system_gpu"})
    assert batch.skipped == 1
    assert streams_of(batch) == []  # the snapshot's SystemRecord and its GPUs are one row


def test_a_projected_row_of_the_wrong_width_does_not_fit_its_record_and_counts_once() -> None:
    def short_rows(meta_: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
        good = PROJECTIONS[schema.STEP_MEMORY](meta_, rows, observed_ns).tables["step_memory_samples"]
        return Projected({"step_memory_samples": [good[0], good[0][:-1], (*good[0], "extra")]}, 0)

    projections = {**RECORD_PROJECTIONS, schema.STEP_MEMORY: short_rows}
    batch = build_records(full_envelope(0), OBSERVED, frozenset({"step_memory"}), projections=projections)
    assert batch.skipped == 2 and len(batch.records) == 1


def test_rows_of_a_table_that_has_no_record_are_skipped_one_by_one() -> None:
    def with_extra_table(meta_: Mapping[str, Any], rows: list[Any], observed_ns: int) -> Projected:
        found = PROJECTIONS[schema.PROCESS](meta_, rows, observed_ns)
        return Projected({**found.tables, "process_threads": [(1,), (2,), (3,)]}, found.skipped)

    projections = {**RECORD_PROJECTIONS, schema.PROCESS: with_extra_table}
    batch = build_records(full_envelope(0), OBSERVED, None, projections=projections)
    assert batch.skipped == 3
    assert streams_of(batch).count("process") == 1


def test_rows_of_a_stream_no_projection_knows_are_not_records_and_not_skipped() -> None:
    """Unknown streams are no unit of skipped; the aggregator reports them in finalization_warning.json."""
    batch = records_from_payload(make_envelope(meta(0), {"gpu_kernels": [{"name": "gemm"}], **full_tables(0)}))
    assert batch.skipped == 0 and len(batch.records) == sum(RECORDS_PER_FULL_ENVELOPE.values())


def test_the_seeds_internal_mapping_example_works_unchanged() -> None:
    namespace: dict[str, Any] = {}
    exec(  # the 000 seed's "Internal mapping example", verbatim
        'from traceml_ai.aggregator.export import StepTimeRecord, records_from_payload\n'
        'FORWARD = "_traceml_internal:forward_time"\n'
        'def forward_cpu_ms(payload):\n'
        '    """Yield (global_rank, step, forward CPU ms) for each step record."""\n'
        '    for record in records_from_payload(payload).records:\n'
        '        if isinstance(record, StepTimeRecord):\n'
        '            for stats in record.events.get(FORWARD, {}).values():\n'
        '                yield record.global_rank, record.step, stats.get("cpu_ms")\n',
        namespace,
    )
    rows = [{"step": 4, "events": {"_traceml_internal:forward_time": {"cuda:0": {"cpu_ms": 1.5}}}},
            {"step": 5, "events": {"traceml:forward": {"cuda:0": {"cpu_ms": 2.0}}}}]
    payload = make_envelope(meta(2), {"step_time": rows, "process": [{"seq": 1}]})
    assert list(namespace["forward_cpu_ms"](payload)) == [(2, 4, 1.5)]


@pytest.mark.parametrize("field", ["global_rank", "local_rank", "world_size", "local_world_size", "node_rank",
                                   "pid", "hostname", "session_id"])
@pytest.mark.parametrize("value", [{"a": 1}, [1], "12", True, 1.5])
def test_an_identity_field_of_the_wrong_type_loses_its_envelope_once_never_reads_none(field: str, value: Any) -> None:
    """Issue 11 review: a ``meta`` rank that was a dict, a list, "12", True or 1.5 gave records whose
    rank read None, with nothing counted."""
    if field in ("hostname", "session_id") and isinstance(value, str):
        value = 12  # a string is right there; a number is not
    bad = full_envelope(0)
    bad["meta"] = {**bad["meta"], field: value}
    batch = records_from_payload([full_envelope(1), bad, full_envelope(2)])
    assert batch.skipped == 1
    assert len(batch.records) == 2 * sum(RECORDS_PER_FULL_ENVELOPE.values())
    assert 0 not in {getattr(r, "global_rank", None) for r in batch.records}  # nothing of the bad envelope


@pytest.mark.parametrize("how", ["missing", "null"])
def test_a_missing_or_null_identity_field_is_none_without_loss(how: str) -> None:
    env = full_envelope(0)
    if how == "missing":
        del env["meta"]["node_rank"]
    else:
        env["meta"]["node_rank"] = None
    batch = records_from_payload(env)
    assert batch.skipped == 0 and len(batch.records) == sum(RECORDS_PER_FULL_ENVELOPE.values())
    assert {getattr(r, "node_rank", "absent") for r in batch.records} <= {None, "absent"}
