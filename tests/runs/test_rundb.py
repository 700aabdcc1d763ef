"""The run database runs.sqlite and the start-up it makes fast (003 seed, "The run database", "Live
refresh")."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from traceml_ai.runs.fake import generate
from traceml_ai.runs.model import BestValue, RunSummary
from traceml_ai.runs.rundb import SCHEMA_VERSION, RunDbError, load_db, update_db, update_db_in_place, write_db
from traceml_ai.runs.store import RunStore

WHEN = "2026-11-30T12:00:00Z"


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake") / "runs"
    generate(root, runs=24, seed=0)
    return root


@pytest.fixture
def store(fake_root: Path) -> RunStore:
    s = RunStore([fake_root])
    s.poll()
    return s


def test_round_trip_gives_back_the_summaries_and_stamps(store: RunStore, tmp_path: Path) -> None:
    runs, stamps = store.runs(), store.stamps()
    write_db(tmp_path / "runs.sqlite", runs, stamps, written_at=WHEN)
    db, reason = load_db(tmp_path / "runs.sqlite")
    assert reason is None and db is not None
    assert db.written_at == WHEN
    assert list(db.runs) == [r.key for r in runs]
    for r in runs:
        assert db.runs[r.key].summary == r
        assert db.runs[r.key].stamps == stamps[r.key]
    assert set(stamps[runs[0].key]) >= {"run.json", "params.yaml", "metrics.json", "metrics.jsonl"}


def test_the_tables_answer_the_seed_example_query(store: RunStore, tmp_path: Path) -> None:
    write_db(tmp_path / "runs.sqlite", store.runs(), store.stamps(), written_at=WHEN)
    con = sqlite3.connect(tmp_path / "runs.sqlite")
    rows = con.execute(
        """SELECT r.name, c.value AS lr, m.value AS best_auc
           FROM runs r
           JOIN metrics m ON m.run_key = r.key AND m.metric = 'val/auc' AND m.kind = 'best'
           LEFT JOIN config c ON c.run_key = r.key AND c.key = 'optim.lr'
           ORDER BY best_auc DESC LIMIT 5"""
    ).fetchall()
    assert len(rows) == 5 and rows == sorted(rows, key=lambda row: -row[2])
    best = max(store.runs(), key=lambda r: r.best["val/auc"].value if "val/auc" in r.best else -1)
    assert rows[0][0] == best.name
    stale = con.execute("SELECT status, display_status, tags, legacy FROM runs WHERE name = 'stale-run'").fetchone()
    assert stale[0] == "running" and stale[1] == "stale" and ";" in stale[2] and stale[3] == 0
    mode = con.execute("SELECT step, mode FROM metrics WHERE kind = 'best' AND metric = 'val/loss' LIMIT 1").fetchone()
    assert isinstance(mode[0], int) and mode[1] == "min"
    con.close()


def test_booleans_are_stored_as_one_and_zero(store: RunStore, tmp_path: Path) -> None:
    run = store.runs()[0]
    run.params["flag.on"] = True
    run.params["flag.off"] = False
    write_db(tmp_path / "runs.sqlite", [run], {}, written_at=WHEN)
    con = sqlite3.connect(tmp_path / "runs.sqlite")
    values = dict(con.execute("SELECT key, value FROM config WHERE key LIKE 'flag.%'").fetchall())
    assert values == {"flag.on": 1, "flag.off": 0}
    con.close()
    db, _ = load_db(tmp_path / "runs.sqlite")
    assert db is not None and db.runs[run.key].summary.params["flag.on"] is True


def test_missing_file_is_no_database_and_no_problem(tmp_path: Path) -> None:
    assert load_db(tmp_path / "runs.sqlite") == (None, None)


def test_garbage_bytes_are_refused(tmp_path: Path) -> None:
    (tmp_path / "runs.sqlite").write_bytes(os.urandom(4096))
    db, reason = load_db(tmp_path / "runs.sqlite")
    assert db is None and reason


def _written(store: RunStore, folder: Path) -> Path:
    path = folder / "runs.sqlite"
    write_db(path, store.runs(), store.stamps(), written_at=WHEN)
    return path


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        (f"PRAGMA user_version = {SCHEMA_VERSION + 1}", f"schema version {SCHEMA_VERSION + 1}"),
        ("PRAGMA user_version = 1", "schema version 1"),  # before run_json left the summaries
        ("UPDATE meta SET value = '7' WHERE key = 'schema_version'", "schema_version"),
        ("UPDATE runs SET step = 'abc' WHERE name = 'baseline'", "edited"),
        ("UPDATE runs SET name = 'renamed' WHERE name = 'baseline'", "edited"),
        ("UPDATE config SET value = 'x' WHERE key = 'optim.lr'", "edited"),
        ("DELETE FROM metrics WHERE kind = 'best'", "edited"),
        ("INSERT INTO metrics VALUES ('/nowhere', 'val/auc', 'best', 1.0, 1, 'max')", "edited"),
        ("UPDATE meta SET value = '1' WHERE key = 'change_counter'", "edited"),
        ("UPDATE run_cache SET summary = replace(summary, '\"notes\":\"\"', '\"notes\":\"x\"')", "run_cache"),
        ("DELETE FROM meta WHERE key = 'change_counter'", "older TraceML"),
        ("PRAGMA journal_mode = WAL", "WAL"),
        ("UPDATE run_cache SET stamps = '{\"run.json\": [\"a\", 1]}'", "run_cache was edited"),
        ("UPDATE run_cache SET summary = replace(summary, '\"legacy\":false', '\"legacy\":\"no\"')", "wrong type"),
        ("ALTER TABLE runs ADD COLUMN extra TEXT", "columns"),
        ("PRAGMA application_id = 1", "not a TraceML"),
    ],
)
def test_an_edited_or_other_version_file_is_refused(store: RunStore, tmp_path: Path, sql: str, fragment: str) -> None:
    path = _written(store, tmp_path)
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    db, reason = load_db(path)
    assert db is None and reason is not None and fragment in reason
    assert "\n" not in reason


def test_an_edit_that_bypasses_sqlite_is_found_in_the_run_cache(store: RunStore, tmp_path: Path) -> None:
    # A byte-level edit (a hex editor, a disk error) leaves SQLite's change counter as it was; the
    # run_cache rows TraceML reads no longer match meta.cache_digest.
    path = _written(store, tmp_path)
    data = path.read_bytes()
    assert b'"name":"baseline"' in data
    path.write_bytes(data.replace(b'"name":"baseline"', b'"name":"baselinx"', 1))
    db, reason = load_db(path)
    assert db is None and reason is not None and "run_cache was edited" in reason


def test_a_database_read_in_chunks_is_the_same_and_an_edit_in_a_later_chunk_is_found(
    store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # load_db decodes run_cache a chunk of rows at a time (4,096; 5 here, so 24 runs take 5 chunks):
    # the digest, the duplicate check and the order span the chunks.
    import traceml_ai.runs.rundb as rundb

    monkeypatch.setattr(rundb, "_LOAD_CHUNK", 5)
    path = _written(store, tmp_path)
    db, reason = load_db(path)
    assert reason is None and db is not None
    assert list(db.runs) == [r.key for r in store.runs()]
    assert all(db.runs[r.key].summary == r for r in store.runs())

    # An edit of the last run's row that leaves SQLite's change counter as TraceML sealed it (as a
    # byte-level edit would): only the digest, carried across the chunks, can find it.
    sealed = path.read_bytes()[24:28]
    con = sqlite3.connect(path)
    con.execute("UPDATE run_cache SET summary = summary || ' ' WHERE rowid = (SELECT max(rowid) FROM run_cache)")
    con.commit()
    con.close()
    data = bytearray(path.read_bytes())
    data[24:28] = data[92:96] = sealed
    path.write_bytes(bytes(data))
    db, reason = load_db(path)
    assert db is None and reason is not None and "run_cache was edited" in reason


def test_long_integers_nan_infinity_and_lone_surrogates_come_back_exactly(store: RunStore, tmp_path: Path) -> None:
    run = store.runs()[0]
    run.params.update({"seed.big": 2**70, "seed.low": -(2**63) - 1, "seed.max": 2**64 - 1})
    run.last["val/loss"] = float("nan")
    run.start["val/loss"] = float("inf")
    run.notes = "δ and a lone \ud800 surrogate"
    run.summary["note"] = "x" * 30 + "1234567890123456789012"  # long digits inside a string
    write_db(tmp_path / "runs.sqlite", [run], {}, written_at=WHEN)
    con = sqlite3.connect(tmp_path / "runs.sqlite")
    # Beyond 64 bits: REAL in the SQL table, as SQLite stores such a literal; exact in the bookkeeping.
    assert con.execute("SELECT value FROM config WHERE key = 'seed.big'").fetchone() == (float(2**70),)
    con.close()
    db, reason = load_db(tmp_path / "runs.sqlite")
    assert reason is None and db is not None
    back = db.runs[run.key].summary
    assert back.params == run.params and all(type(back.params[k]) is int for k in ("seed.big", "seed.low", "seed.max"))
    assert math.isnan(back.last["val/loss"]) and back.start["val/loss"] == float("inf")
    assert back.notes == run.notes and back.summary == run.summary and back.best == run.best


def _odd_value(run: RunSummary, case: str) -> None:
    if case == "nan_perf":
        run.perf["share.dataloader"] = float("nan")
    elif case == "inf_best":
        run.best["val/auc"] = BestValue(float("-inf"), 3, None, "max")
    elif case == "nan_exit":
        run.exit = {"code": 1, "error": {"loss": float("nan")}}
    elif case == "nan_duration":
        run.duration_s = float("nan")
    elif case == "surrogate":
        run.tags = ["ok", "lone \udc80"]
    elif case == "big_int":
        run.summary["tokens"] = 2**64
    elif case == "non_ascii":
        run.name, run.params["data.path"] = "δέλτα-運行", "/données/ü"


@pytest.mark.parametrize("case", ["nan_perf", "inf_best", "nan_exit", "nan_duration", "surrogate", "big_int",
                                  "non_ascii"])
def test_each_value_orjson_cannot_write_alone_still_comes_back_exactly(store: RunStore, tmp_path: Path,
                                                                         case: str) -> None:
    # summary_json writes with orjson and falls back to the standard library for what orjson would
    # change or refuse (issue 16): each such value alone in an otherwise plain run must round-trip.
    run = store.runs()[0]
    _odd_value(run, case)
    write_db(tmp_path / "runs.sqlite", [run], {}, written_at=WHEN)
    db, reason = load_db(tmp_path / "runs.sqlite")
    assert reason is None and db is not None
    back = db.runs[run.key].summary
    assert repr(dataclasses.astuple(back)) == repr(dataclasses.astuple(run))  # NaN compared by its text


def test_update_rewrites_only_the_changed_runs(store: RunStore, tmp_path: Path) -> None:
    base = _written(store, tmp_path)
    runs = store.runs()
    changed, unchanged_but_edited, removed = runs[0], runs[1], runs[2]
    changed.notes = "changed"
    unchanged_but_edited.notes = "not rewritten"  # not listed as changed: the old row must stay
    keep = [r for r in runs if r is not removed]
    update_db(base, tmp_path / "next.sqlite", keep, store.stamps(), changed=[changed.key], written_at="later")
    db, reason = load_db(tmp_path / "next.sqlite")
    assert reason is None and db is not None
    assert db.written_at == "later"
    assert db.runs[changed.key].summary.notes == "changed"
    assert db.runs[unchanged_but_edited.key].summary.notes != "not rewritten"
    assert removed.key not in db.runs and len(db.runs) == len(runs) - 1


def test_an_update_in_place_rewrites_only_the_changed_runs_in_the_same_file(store: RunStore, tmp_path: Path) -> None:
    """Issue 16: a save of a few changed runs out of 100,000 must not copy a 1.1 GB file."""
    path = _written(store, tmp_path)
    inode = os.stat(path).st_ino
    runs = store.runs()
    changed, unchanged_but_edited, removed = runs[0], runs[1], runs[2]
    changed.notes = "changed in place"
    unchanged_but_edited.notes = "not rewritten"
    keep = [r for r in runs if r is not removed]
    update_db_in_place(path, keep, store.stamps(), changed={changed.key}, gone={removed.key}, written_at="later")
    assert os.stat(path).st_ino == inode and not (tmp_path / "runs.sqlite-journal").exists()
    db, reason = load_db(path)  # the digest and the change counter were kept right
    assert reason is None and db is not None and db.written_at == "later"
    assert db.runs[changed.key].summary.notes == "changed in place"
    assert db.runs[unchanged_but_edited.key].summary.notes != "not rewritten"
    assert removed.key not in db.runs and len(db.runs) == len(runs) - 1
    con = sqlite3.connect(path)  # the SQL tables follow too
    assert con.execute("SELECT notes FROM runs WHERE key = ?", (changed.key,)).fetchone() == ("changed in place",)
    assert con.execute("SELECT count(*) FROM config WHERE run_key = ?", (removed.key,)).fetchone() == (0,)
    con.close()
    # Many updates in a row: still one valid file.
    for i in range(5):
        changed.notes = f"round {i}"
        update_db_in_place(path, keep, store.stamps(), changed={changed.key}, gone=set(), written_at=f"r{i}")
    db, reason = load_db(path)
    assert reason is None and db is not None and db.runs[changed.key].summary.notes == "round 4"
    for run in (changed, unchanged_but_edited):
        run.notes = ""


def test_an_update_in_place_refuses_a_file_another_program_wrote(store: RunStore, tmp_path: Path) -> None:
    path = _written(store, tmp_path)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET notes = 'by hand'")
    con.commit()
    con.close()
    before = path.read_bytes()
    runs = store.runs()
    with pytest.raises(RunDbError, match="another program"):
        update_db_in_place(path, runs, store.stamps(), changed={runs[0].key}, gone=set(), written_at="later")
    assert path.read_bytes() == before  # nothing written


def test_an_update_in_place_waits_for_a_reader_then_gives_up(store: RunStore, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import traceml_ai.runs.rundb as rundb

    path = _written(store, tmp_path)
    monkeypatch.setattr(rundb, "IN_PLACE_BUSY_TIMEOUT_S", 0.2)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM run_cache").fetchone()  # holds the shared lock
    runs = store.runs()
    runs[0].notes = "after the reader"
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        update_db_in_place(path, runs, store.stamps(), changed={runs[0].key}, gone=set(), written_at="later")
    reader.execute("COMMIT")
    reader.close()
    update_db_in_place(path, runs, store.stamps(), changed={runs[0].key}, gone=set(), written_at="later")
    db, reason = load_db(path)
    assert reason is None and db is not None and db.runs[runs[0].key].summary.notes == "after the reader"
    runs[0].notes = ""


@pytest.mark.timeout(120)
def test_a_reader_never_sees_half_an_update_in_place(store: RunStore, tmp_path: Path) -> None:
    """A start reading the file while a viewer saves in place gets the runs before or after a save,
    never a mix and never a refusal (SQLite's locks; a reader that started just before a save reads
    again)."""
    runs = store.runs()
    for run in runs:
        run.notes = "before"
    path = _written(store, tmp_path)
    seen: list[tuple[str | None, set[str]]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            db, reason = load_db(path)
            seen.append((reason, set() if db is None else {c.summary.notes for c in db.runs.values()}))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        i, deadline = 0, time.monotonic() + 60
        # Until the reader saw at least two saves' runs (and 40 saves were made), or a minute.
        while (i < 40 or len({frozenset(notes) for _, notes in seen}) < 3) and time.monotonic() < deadline:
            i += 1
            for run in runs:
                run.notes = f"save {i}"
            update_db_in_place(path, runs, store.stamps(), changed={r.key for r in runs}, gone=set(),
                               written_at=f"s{i}")
    finally:
        done.set()
        reader.join(60)
    assert len({frozenset(notes) for _, notes in seen}) >= 3, seen  # reads between saves
    assert all(reason is None and len(notes) == 1 for reason, notes in seen), seen  # one save's runs, not a mix
    for run in runs:
        run.notes = ""


# -- start-up from the database ---------------------------------------------------------------------


def _seeded(fake_root: Path, tmp_path: Path, *, rename: str | None = None) -> tuple[RunStore, str]:
    """A new store seeded from a database in which the baseline's cached name is ``rename``."""
    first = RunStore([fake_root])
    first.poll()
    runs = first.runs()
    baseline = next(r for r in runs if r.name == "baseline")
    if rename:
        baseline.name = rename
    path = tmp_path / "runs.sqlite"
    write_db(path, runs, first.stamps(), written_at=WHEN)
    db, reason = load_db(path)
    assert db is not None, reason
    second = RunStore([fake_root])
    assert second.seed(db.runs) == len(runs)
    return second, baseline.key


def test_seeded_store_fills_the_table_before_any_poll(fake_root: Path, tmp_path: Path) -> None:
    store, key = _seeded(fake_root, tmp_path)
    assert len(store.runs()) == 24 and store.get(key) is not None and store.version == 1
    assert store.get(key).display_status == "completed"  # type: ignore[union-attr]


def test_first_poll_after_seeding_keeps_unchanged_runs_and_reparses_changed_ones(
    fake_root: Path, tmp_path: Path
) -> None:
    work = tmp_path / "runs"
    shutil.copytree(fake_root, work, symlinks=True)
    store, key = _seeded(work, tmp_path, rename="from-the-cache")
    result = store.poll()
    # Same stamps: the cached summary stands (a re-parse would have said "baseline").
    assert store.get(key).name == "from-the-cache"  # type: ignore[union-attr]
    assert key not in result.changed
    stale = next(r for r in store.runs() if r.name == "stale-run")
    assert stale.display_status == "stale"
    # A changed file: the run is parsed again.
    run_json = Path(key) / "run.json"
    st = os.stat(run_json)
    os.utime(run_json, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    result = store.refresh()
    assert store.get(key).name == "baseline"  # type: ignore[union-attr]
    assert key in result.changed
    assert store.details(key).summary.name == "baseline"


def test_the_listing_not_the_cache_decides_which_runs_exist(fake_root: Path, tmp_path: Path) -> None:
    work = tmp_path / "runs"
    shutil.copytree(fake_root, work, symlinks=True)
    store, key = _seeded(work, tmp_path)
    shutil.rmtree(key)
    result = store.poll()
    assert key in result.removed and store.get(key) is None
    # A cached run outside the store's roots is never taken.
    other = RunStore([tmp_path / "elsewhere"])
    db, _ = load_db(tmp_path / "runs.sqlite")
    assert db is not None and other.seed(db.runs) == 0


def test_seeding_after_a_poll_is_a_programming_error(store: RunStore) -> None:
    with pytest.raises(RuntimeError):
        store.seed({})


def test_the_perf_table_holds_the_facts_of_captured_runs(store: RunStore, tmp_path: Path) -> None:
    runs = store.runs()
    captured, plain = runs[0], runs[1]
    assert store.set_perf(captured.key, {"telemetry": "ok", "verdict": "input_bound", "share.dataloader": 0.7})
    assert not store.set_perf(captured.key, {"telemetry": "ok", "verdict": "input_bound", "share.dataloader": 0.7})
    path = tmp_path / "runs.sqlite"
    write_db(path, store.runs(), store.stamps(), written_at=WHEN)
    con = sqlite3.connect(path)
    try:
        got = con.execute("SELECT run_key FROM perf WHERE column = 'perf.share.dataloader' AND value > 0.3").fetchall()
        assert got == [(captured.key,)]
        assert con.execute("SELECT COUNT(*) FROM perf WHERE run_key = ?", (plain.key,)).fetchone() == (0,)
        assert dict(con.execute("SELECT column, value FROM perf WHERE run_key = ?", (captured.key,))) == {
            "perf.telemetry": "ok", "perf.verdict": "input_bound", "perf.share.dataloader": 0.7}
    finally:
        con.close()
    db, reason = load_db(path)
    assert reason is None and db is not None  # the perf table does not make the file look edited
    # A change of the facts alone rewrites the run in an update.
    store.set_perf(captured.key, {"telemetry": "ok", "verdict": "healthy"})
    out = tmp_path / "runs2.sqlite"
    update_db(path, out, store.runs(), store.stamps(), changed={captured.key}, written_at=WHEN)
    con = sqlite3.connect(out)
    try:
        assert dict(con.execute("SELECT column, value FROM perf WHERE run_key = ?", (captured.key,))) == {
            "perf.telemetry": "ok", "perf.verdict": "healthy"}
    finally:
        con.close()


@pytest.mark.parametrize("text", [b'{"run.json": [-1, 5]}', b'{"notes.txt": [1, 5]}', b'{"run.json": [1]}',
                                  b'{"run.json": [1.5, 5]}', b'[]', b'not json'])
def test_stored_stamps_decode_at_each_look_and_a_text_that_is_not_stamps_reads_as_none(text: bytes) -> None:
    # Kept as the database's text and decoded when a poll or a save asks (issue 16: 80 MB less at
    # 100,000 runs); a text that is not {core file: [mtime_ns, size]} is no stamps, never an error.
    from traceml_ai.runs.rundb import StoredStamps, stamps_json

    good = StoredStamps(b'{".":[7,1],"run.json":[1,5]}')
    assert dict(good) == {".": (7, 1), "run.json": (1, 5)} == good
    assert good.get("run.json") == (1, 5) and good.get("params.yaml") is None and len(good) == 2
    assert stamps_json(good) == '{".":[7,1],"run.json":[1,5]}' == stamps_json(dict(good))
    bad = StoredStamps(text)
    assert dict(bad) == {} and bad.get("run.json") is None and len(bad) == 0


def test_a_seeded_run_whose_stored_stamps_are_not_stamps_is_read_again_from_its_files(
    fake_root: Path, tmp_path: Path
) -> None:
    from traceml_ai.runs.rundb import StoredStamps, stamps_json

    first = RunStore([fake_root])
    first.poll()
    runs = first.runs()
    texts = {r.key: stamps_json(first.stamps()[r.key]).encode() for r in runs}
    baseline = next(r for r in runs if r.name == "baseline")
    baseline.name = "from-the-cache"
    texts[baseline.key] = b'{"run.json": "garbage"}'
    second = RunStore([fake_root])
    assert second.seed({r.key: (r, StoredStamps(texts[r.key])) for r in runs}) == len(runs)
    second.poll()
    assert second.get(baseline.key).name == "baseline"  # type: ignore[union-attr]  # (read from its files)
    assert dict(second.stamps()[baseline.key])  # (its stamps now: those of the files it was read from)
    assert sorted(r.name for r in second.runs()) == sorted(["baseline" if r.key == baseline.key else r.name
                                                             for r in runs])


def test_forgetting_the_parse_state_keeps_what_a_seed_keeps_and_refresh_still_reads_a_changed_run(
    fake_root: Path, tmp_path: Path
) -> None:
    # After a first scan the viewer keeps finished runs as a start from runs.sqlite holds them
    # (review 16c: the parsed files of 100,000 runs stayed in memory after a cold start).
    work = tmp_path / "runs"
    shutil.copytree(fake_root, work, symlinks=True)
    store = RunStore([work])
    store.poll()
    before = {r.key: (r.name, r.display_status) for r in store.runs()}
    stamps = {k: dict(v) for k, v in store.stamps().items()}
    finished = [r for r in store.runs() if r.finished]
    assert store.forget_parse_state() == len(finished) > 0
    assert {k: dict(v) for k, v in store.stamps().items()} == stamps
    assert store.poll().changed == [] and {r.key: (r.name, r.display_status) for r in store.runs()} == before
    run = finished[0]
    assert store.details(run.key).summary.name == run.name
    # a finished run rewritten (as every writer does: a new file renamed into place) is read again
    run_json = Path(run.key) / "run.json"
    tmp = run_json.with_name(".run.json.tmp")
    tmp.write_text(json.dumps({**json.loads(run_json.read_text()), "name": "renamed"}))
    os.replace(tmp, run_json)
    assert run.key in store.refresh().changed
    assert store.get(run.key).name == "renamed"  # type: ignore[union-attr]
