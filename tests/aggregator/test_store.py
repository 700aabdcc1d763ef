"""The SQLite writer (DESIGN §3.3): WAL, schema, flush rules, read-only readers, errors that never crash."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from traceml_ai.aggregator.store import (
    PAGE_SIZE,
    RowBlock,
    StoreError,
    TelemetryStore,
    create_schema,
    open_readonly,
)
from traceml_ai.telemetry import schema

MEM = schema.STEP_MEMORY_SAMPLES


def mem_row(step: int, rank: int = 0) -> tuple[Any, ...]:
    return (1_000 + step, rank, rank, 0, 2, 2, 0, "host", 10_000 + step, step, "cpu", step, 1e6 + step, None)


def count(db: Path, table: str = MEM.name) -> int:
    conn = open_readonly(db)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "aggregator" / "telemetry.sqlite"


def test_schema_wal_and_user_version_idempotently(db: Path) -> None:
    for _ in range(2):  # a restarted aggregator opens the same file again and keeps its rows
        store = TelemetryStore(db)
        store.start()
        store.put({MEM.name: [mem_row(1)]})
        store.close()
    conn = open_readonly(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_USER_VERSION
    for table in schema.TABLES:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table.name})")]
        assert columns == ["id", *table.column_names]
    assert conn.execute(f"SELECT count(*) FROM {MEM.name}").fetchone()[0] == 2
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE


def test_a_database_made_with_other_pages_is_appended_to_as_it_is(db: Path) -> None:
    db.parent.mkdir(parents=True)
    old = sqlite3.connect(db)
    old.execute("PRAGMA page_size=4096")
    old.execute("PRAGMA journal_mode=WAL")
    old.close()
    for step in range(2):
        store = TelemetryStore(db)
        store.start()
        store.put({MEM.name: [mem_row(step)]})
        assert store.close().rows_written == 1
    conn = open_readonly(db)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert conn.execute(f"SELECT step FROM {MEM.name} ORDER BY id").fetchall() == [(0,), (1,)]


def envelope_rows(steps: range, rank: int = 0) -> list[tuple[Any, ...]]:
    """step_memory rows of one envelope: the same observed time and identity, one row per step."""
    return [(1_000 + rank, *mem_row(s, rank)[1:]) for s in steps]


def block_of(rows: list[tuple[Any, ...]], shared: int = 8) -> RowBlock:
    """``rows`` (all with the same first ``shared`` values) as one RowBlock."""
    assert len({row[:shared] for row in rows}) == 1
    return RowBlock(rows[0][:shared], len(rows[0]) - shared, [v for row in rows for v in row[shared:]])


def test_row_blocks_and_row_tuples_are_written_in_arrival_order(db: Path) -> None:
    # Blocks of any length (statements of 512, 256, ... rows), tuples in between, several flushes.
    first = envelope_rows(range(1234), rank=1)
    second = envelope_rows(range(1234, 1237), rank=2)
    loose = [mem_row(s, rank=3) for s in range(1237, 1240)]
    third = envelope_rows(range(1240, 1241), rank=1)
    store = TelemetryStore(db, flush_rows=1000)
    store.start()
    store.put({MEM.name: [block_of(first), block_of(second)]})
    store.put({MEM.name: loose[:2]})
    store.put({MEM.name: loose[2:]})
    store.put({MEM.name: [block_of(third)]})
    stats = store.close()
    assert stats.rows_written == 1241 and stats.rows_by_table == {MEM.name: 1241}
    assert stats.lost_rows == 0 and stats.errors == 0
    conn = open_readonly(db)
    got = conn.execute(f"SELECT {', '.join(MEM.column_names)} FROM {MEM.name} ORDER BY id").fetchall()
    assert got == first + second + loose + third


def test_a_row_block_that_does_not_fit_loses_only_its_unfit_rows(db: Path) -> None:
    good = envelope_rows(range(3))
    too_big = [(*row[:9], 2**70 if row[9] == 11 else row[9], *row[10:]) for row in envelope_rows(range(10, 13))]
    store = TelemetryStore(db)
    store.start()
    store.put({MEM.name: [block_of(good),
                          block_of([r[:-1] for r in good]),  # rows one value short
                          block_of(too_big)]})              # one seq beyond 64-bit integers
    stats = store.close()
    assert stats.rows_written == 5 and stats.lost_rows == 4
    assert stats.errors == 1 and "4 of 9 rows could not be stored" in stats.messages[0]
    conn = open_readonly(db)
    assert [r[0] for r in conn.execute(f"SELECT seq FROM {MEM.name} ORDER BY id")] == [0, 1, 2, 10, 12]


def test_rows_keep_their_values_types_and_order(db: Path) -> None:
    store = TelemetryStore(db)
    store.start()
    rows = [mem_row(s) for s in range(1234)]  # not a multiple of the multi-row INSERT chunk
    store.put({MEM.name: rows[:700]})
    store.put({MEM.name: rows[700:]})
    stats = store.close()
    assert stats.rows_written == 1234 and stats.rows_by_table == {MEM.name: 1234}
    assert stats.errors == 0 and stats.lost_rows == 0
    conn = open_readonly(db)
    got = conn.execute(f"SELECT {', '.join(MEM.column_names)} FROM {MEM.name} ORDER BY id").fetchall()
    assert got == rows
    ids = [r[0] for r in conn.execute(f"SELECT id FROM {MEM.name} ORDER BY id")]
    assert ids == list(range(1, 1235))
    assert conn.execute(f"SELECT typeof(peak_alloc_bytes), typeof(peak_reserved_bytes) FROM {MEM.name}"
                        " LIMIT 1").fetchone() == ("real", "null")


def test_rows_are_committed_within_the_flush_interval_while_the_writer_runs(db: Path) -> None:
    store = TelemetryStore(db, flush_interval_s=0.2)
    store.start()
    try:
        store.put({MEM.name: [mem_row(1), mem_row(2)]})
        assert wait_for(lambda: count(db) == 2)
    finally:
        store.close()


def test_enough_waiting_rows_commit_before_the_interval(db: Path) -> None:
    store = TelemetryStore(db, flush_interval_s=3600, flush_rows=100)
    store.start()
    try:
        store.put({MEM.name: [mem_row(s) for s in range(150)]})
        assert wait_for(lambda: count(db) == 150)
    finally:
        store.close()


def test_a_reader_reads_while_the_writer_writes(db: Path) -> None:
    store = TelemetryStore(db, flush_interval_s=0.05, flush_rows=500)
    store.start()
    seen: list[int] = []
    problems: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            wait_for(db.exists)
            conn = open_readonly(db)
            while not done.is_set():
                seen.append(conn.execute(f"SELECT count(*) FROM {MEM.name}").fetchone()[0])
            conn.close()
        except BaseException as exc:
            problems.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for batch in range(40):
        store.put({MEM.name: [mem_row(batch * 100 + s) for s in range(100)]})
        time.sleep(0.01)
    store.close()
    done.set()
    reader.join()
    assert not problems
    assert seen == sorted(seen)                     # a reader never sees rows disappear
    assert any(0 < n < 4000 for n in seen)          # ... and saw the table while it was growing
    assert count(db) == 4000


def test_open_readonly_cannot_write_and_needs_the_file(db: Path, tmp_path: Path) -> None:
    store = TelemetryStore(db)
    store.start()
    store.close()
    conn = open_readonly(db)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute(f"DELETE FROM {MEM.name}")
    with pytest.raises(FileNotFoundError):
        open_readonly(tmp_path / "nope.sqlite")


def test_an_unbindable_row_loses_only_itself(db: Path) -> None:
    store = TelemetryStore(db)
    store.start()
    bad = (*mem_row(5)[:9], 2**70, *mem_row(5)[10:])  # seq beyond SQLite's 64-bit integers
    short = mem_row(6)[:-1]                            # one value missing
    store.put({MEM.name: [mem_row(1), bad, short, mem_row(2)], "no_such_table": [(1,)]})
    stats = store.close()
    assert count(db) == 2
    assert stats.rows_written == 2 and stats.lost_rows == 3
    assert stats.errors == 2 and any("could not be stored" in m for m in stats.messages)


def test_another_schema_version_is_an_error_not_a_crash(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError):
        create_schema(sqlite3.connect(db))
    store = TelemetryStore(db)
    store.start()
    store.put({MEM.name: [mem_row(1)]})
    stats = store.close()
    assert stats.lost_rows == 1 and stats.rows_written == 0
    assert any("schema version 99" in m for m in stats.messages)


def test_an_unwritable_database_path_is_counted(tmp_path: Path) -> None:
    blocked = tmp_path / "telemetry.sqlite"
    blocked.mkdir()  # a folder where the file should be
    store = TelemetryStore(blocked)
    store.start()
    store.put({MEM.name: [mem_row(1), mem_row(2)]})
    stats = store.close()
    assert stats.lost_rows == 2 and stats.errors >= 1 and stats.messages


def test_rank_log_files_get_the_lines_in_order(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "telemetry.sqlite")
    store.start()
    store.put({}, [(0, "stdout | epoch 1"), (1, "stderr | warning"), (0, "stderr | oops")])
    store.put({}, [(None, "no rank"), (0, "stdout | epoch 2")])
    stats = store.close()
    assert (tmp_path / "rank_0.log").read_text() == "stdout | epoch 1\nstderr | oops\nstdout | epoch 2\n"
    assert (tmp_path / "rank_1.log").read_text() == "stderr | warning\n"
    assert (tmp_path / "rank_unknown.log").read_text() == "no rank\n"
    assert stats.log_lines_written == 5 and stats.log_errors == 0


def test_work_runs_on_the_writer_thread_in_order_and_a_raising_work_is_counted(db: Path) -> None:
    threads: list[str] = []

    def work(step: int) -> Any:
        threads.append(threading.current_thread().name)
        return {MEM.name: [mem_row(step)]}, []

    def broken() -> Any:
        raise RuntimeError("bug")

    store = TelemetryStore(db)
    store.start()
    assert store.put_work(lambda: work(1))
    assert store.put_work(broken)
    assert store.put_work(lambda: work(2))
    stats = store.close()
    assert threads == ["traceml-sqlite-writer"] * 2
    conn = open_readonly(db)
    assert [r[0] for r in conn.execute(f"SELECT step FROM {MEM.name} ORDER BY id")] == [1, 2]
    assert stats.errors == 1 and "bug" in stats.messages[0]


def test_a_full_queue_refuses_instead_of_blocking(db: Path) -> None:
    release = threading.Event()
    store = TelemetryStore(db, max_queued=2)
    store.start()
    store.put_work(lambda: (release.wait(), ({}, []))[1])   # keeps the writer busy
    assert wait_for(lambda: store._queue.qsize() == 0)
    assert store.put({MEM.name: [mem_row(1)]}, block=False)
    assert store.put({MEM.name: [mem_row(2)]}, block=False)
    assert not store.put({MEM.name: [mem_row(3)]}, block=False)
    release.set()
    store.close()
    assert count(db) == 2
