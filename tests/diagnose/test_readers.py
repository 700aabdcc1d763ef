"""Reading telemetry.sqlite read-only: statuses for bad files, event times, duplicates, live reads."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tests.diagnose.telemetry_db import T0_NS, TelemetryDB, cpu_events
from traceml_ai.diagnose.readers import event_ms, read_telemetry
from traceml_ai.telemetry import schema


def test_missing_file_is_reported_and_not_created(tmp_path: Path) -> None:
    db = tmp_path / "aggregator" / "telemetry.sqlite"
    tel = read_telemetry(db)
    assert tel.status == "missing"
    assert "no telemetry database" in (tel.detail or "")
    assert not db.exists() and not db.parent.exists()


def test_zero_byte_file_and_tables_without_rows_are_empty(tmp_path: Path) -> None:
    blank = tmp_path / "blank.sqlite"
    blank.write_bytes(b"")
    assert read_telemetry(blank).status == "empty"
    TelemetryDB(tmp_path / "t.sqlite").close()
    tel = read_telemetry(tmp_path / "t.sqlite")
    assert tel.status == "empty" and tel.steps == ()


def test_a_file_that_is_not_sqlite_is_corrupt(tmp_path: Path) -> None:
    bad = tmp_path / "telemetry.sqlite"
    bad.write_bytes(b"this is not a database, just text that happens to be here\n" * 100)
    tel = read_telemetry(bad)
    assert tel.status == "corrupt"
    assert (tel.detail or "").startswith("telemetry database is damaged: ")


def test_a_database_the_writer_has_not_filled_yet_reads_as_empty(tmp_path: Path) -> None:
    # The aggregator creates tables lazily: a database with only one table must not break anything.
    db = TelemetryDB(tmp_path / "t.sqlite", tables=(schema.SYSTEM_SAMPLES,))
    db.system(0, ts_ns=T0_NS, cpu=50.0, ram_used=1e9)
    db.close()
    tel = read_telemetry(tmp_path / "t.sqlite")
    assert tel.status == "ok"
    assert len(tel.system) == 1 and tel.steps == () and tel.gpus == ()


def test_phase_time_prefers_gpu_then_cpu_then_duration_and_null_stays_none() -> None:
    assert event_ms({"cuda:0": {"gpu_ms": 5.0, "cpu_ms": 1.0, "duration_ms": 5.0}}) == 5.0
    assert event_ms({"cpu": {"gpu_ms": None, "cpu_ms": 3.0, "duration_ms": 9.0}}) == 3.0
    assert event_ms({"cpu": {"gpu_ms": None, "cpu_ms": None, "duration_ms": 2.5}}) == 2.5
    assert event_ms({"cpu": {"gpu_ms": None, "cpu_ms": None, "duration_ms": None}}) is None
    assert event_ms({"cpu": {"gpu_ms": None, "cpu_ms": 0.0}}) == 0.0  # a measured zero stays 0
    # Two devices timing the same region: the longer counts, they are not added.
    assert event_ms({"cpu": {"cpu_ms": 2.0}, "cuda:0": {"gpu_ms": 7.0}}) == 7.0
    assert event_ms("garbage") is None


def test_rows_are_read_with_duplicates_and_bad_rows_handled(tmp_path: Path) -> None:
    db = TelemetryDB(tmp_path / "t.sqlite")
    db.step(0, 1, cpu_events({schema.STEP: 10.0, schema.FORWARD: None}), ts_ns=T0_NS)
    db.step(0, 1, cpu_events({schema.STEP: 12.0}), ts_ns=T0_NS + 1)  # duplicate key: the last one wins
    db.step(0, None, cpu_events({schema.STEP: 1.0}), ts_ns=T0_NS)
    db.step(0, 2, "{not json", ts_ns=T0_NS)
    db.step(None, 3, cpu_events({schema.STEP: 4.0}), ts_ns=None)
    db.close()
    tel = read_telemetry(tmp_path / "t.sqlite")
    assert [(s.rank, s.step, s.phases.get(schema.STEP)) for s in tel.steps] == [(0, 1, 12.0), (None, 3, 4.0)]
    assert any("without an integer step" in p for p in tel.problems)
    assert any("unreadable events_json" in p for p in tel.problems)


def test_the_forward_phase_reported_as_null_is_none_not_zero(tmp_path: Path) -> None:
    db = TelemetryDB(tmp_path / "t.sqlite")
    db.step(0, 1, cpu_events({schema.STEP: 10.0, schema.FORWARD: None}), ts_ns=T0_NS)
    db.close()
    (sample,) = read_telemetry(tmp_path / "t.sqlite").steps
    assert schema.FORWARD in sample.phases and sample.phases[schema.FORWARD] is None


def test_reading_a_finished_run_writes_nothing_beside_the_database(tmp_path: Path) -> None:
    db = TelemetryDB(tmp_path / "t.sqlite")
    db.step(0, 0, cpu_events({schema.STEP: 10.0}), ts_ns=T0_NS)
    db.close()
    before = sorted(os.listdir(tmp_path))
    assert read_telemetry(tmp_path / "t.sqlite").status == "ok"
    assert sorted(os.listdir(tmp_path)) == before == ["t.sqlite"]


def test_a_live_run_is_read_while_the_writer_holds_it(tmp_path: Path) -> None:
    db = TelemetryDB(tmp_path / "t.sqlite")
    db.step(0, 0, cpu_events({schema.STEP: 10.0}), ts_ns=T0_NS)
    db.commit()
    try:
        assert len(read_telemetry(tmp_path / "t.sqlite").steps) == 1
        db.step(0, 1, cpu_events({schema.STEP: 11.0}), ts_ns=T0_NS + 10)
        db.commit()
        db.step(0, 2, cpu_events({schema.STEP: 11.0}), ts_ns=T0_NS + 20)  # not committed: not visible
        assert [s.step for s in read_telemetry(tmp_path / "t.sqlite").steps] == [0, 1]
    finally:
        db.close()


def test_a_reader_cannot_write(tmp_path: Path) -> None:
    from traceml_ai.diagnose.readers import open_readonly

    TelemetryDB(tmp_path / "t.sqlite").close()
    with open_readonly(tmp_path / "t.sqlite") as conn:
        try:
            conn.execute("CREATE TABLE x (a)")
        except sqlite3.OperationalError as e:
            assert "readonly" in str(e)
        else:
            raise AssertionError("a read-only connection created a table")


def test_a_run_folder_named_with_uri_characters_is_read_and_nothing_is_created(tmp_path: Path) -> None:
    """``traceml run --name "exp#1"``: the database path holds ``#`` (and may hold ``?``, ``%``, spaces);
    both read-only openers (the diagnosis reader, the aggregator store's) read that file and create none."""
    from tests.diagnose.telemetry_db import RunSpec, write_run
    from traceml_ai.aggregator.store import open_readonly

    for name in ("exp#1", "why?", "50%", "a b"):
        db = write_run(tmp_path / "runs" / f"20261201-101500_{name}_ab12", RunSpec(ranks=1, steps=8, noise=0.0))
        before = set(tmp_path.rglob("*"))
        tel = read_telemetry(db)
        assert tel.status == "ok" and len(tel.steps) == 8, (name, tel.status, tel.detail)
        conn = open_readonly(db)
        assert conn.execute("SELECT COUNT(*) FROM step_time_samples").fetchone()[0] == 8
        conn.close()
        assert set(tmp_path.rglob("*")) - before <= {Path(f"{db}-wal"), Path(f"{db}-shm")}, name
