"""Polls that cost what changed (issue 16 item 1): a root whose directory stamp did not change is
not listed again; finished runs wait for Refresh; running runs are read on every poll."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.runs.test_store import NOW, _append, _rewrite, _row, _store, write_run
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.watch import RELIST_EVERY_POLLS

OLD_NS = int((NOW - 86_400) * 1e9)  # a day before the fake clock; far older than RACY_S of the real one


def _age(root: Path) -> None:
    """Give the root an old mtime, as a root nobody touched for a while has."""
    os.utime(root, ns=(OLD_NS, OLD_NS))


def _listings(store: RunStore) -> int:
    return store._watch.listings


def test_a_no_change_poll_does_not_list_an_old_root_again(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_done_0001")
    write_run(tmp_path, "20260921-120000_live_0002", status="running")
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    listed = _listings(store)
    for _ in range(3):
        assert store.poll().changed == []
    assert _listings(store) == listed


def test_a_new_run_folder_appears_at_the_next_poll(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_done_0001")
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    store.poll()
    new = write_run(tmp_path, "20260921-130000_new_0002", status="running")
    assert store.poll().changed == [os.path.realpath(new)]
    assert [r.name for r in store.runs()] == ["done", "new"]


def test_a_removed_run_folder_goes_at_the_next_poll(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_done_0001")
    gone = write_run(tmp_path, "20260921-120000_gone_0002")
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    for name in ("run.json", "params.yaml", "metrics.json"):
        (gone / name).unlink()
    gone.rmdir()
    assert store.poll().removed == [os.path.realpath(gone)]


def test_a_change_the_root_stamp_hides_shows_within_relist_every_polls(tmp_path: Path) -> None:
    # A caching network file system can serve an unchanged directory mtime: the run folder renamed
    # here keeps the root's link count and size, and the old mtime is put back.
    old = write_run(tmp_path, "20260921-120000_old_0001")
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    renamed = tmp_path / "20260921-120000_renamed_0001"
    os.rename(old, renamed)
    _age(tmp_path)
    seen_at = None
    for n in range(1, RELIST_EVERY_POLLS + 1):
        if store.poll().removed:
            seen_at = n
            break
    assert seen_at is not None, f"not seen in {RELIST_EVERY_POLLS} polls"
    assert [r.key for r in store.runs()] == [os.path.realpath(renamed)]


def test_a_running_runs_new_rows_appear_while_the_root_is_unchanged(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running", metrics={}, jsonl="")
    write_run(tmp_path, "20260921-120000_done_0002")
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    _append(live / "metrics.jsonl", _row(0, **{"train/loss": 2.0}))
    assert store.poll().changed == [os.path.realpath(live)]
    assert store.get(os.path.realpath(live)).start == {"train/loss": 2.0}  # type: ignore[union-attr]
    _rewrite(live / "metrics.json", json.dumps({"step": 3, "last": {"train/loss": 1.5}}))
    assert store.poll().changed == [os.path.realpath(live)]
    assert store.get(os.path.realpath(live)).last == {"train/loss": 1.5}  # type: ignore[union-attr]


def test_a_finished_runs_change_appears_after_refresh_only(tmp_path: Path) -> None:
    done = write_run(tmp_path, "20260921-120000_done_0001", metrics={"step": 9, "last": {"val/auc": 0.8}})
    key = os.path.realpath(done)
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    _rewrite(done / "metrics.json", json.dumps({"step": 9, "last": {"val/auc": 0.9}}))
    for _ in range(RELIST_EVERY_POLLS + 1):  # (a re-listing of the root does not re-read it either)
        assert store.poll().changed == []
    assert store.refresh().changed == [key]
    assert store.get(key).last == {"val/auc": 0.9}  # type: ignore[union-attr]


def test_a_run_that_finishes_is_no_longer_read_by_polls(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running")
    key = os.path.realpath(live)
    _age(tmp_path)
    store = _store(tmp_path)
    store.poll()
    run = json.loads((live / "run.json").read_text())
    _rewrite(live / "run.json", json.dumps({**run, "status": "completed"}))
    _age(tmp_path)
    assert store.poll().changed == [key]
    _rewrite(live / "metrics.json", json.dumps({"step": 5, "last": {"val/auc": 0.99}}))
    _age(tmp_path)
    assert store.poll().changed == []
    assert store.refresh().changed == [key]


# -- a start from the run database (issue 16 item 2) -------------------------------------------


def _restart(root: Path, tmp_path: Path) -> RunStore:
    """A store seeded from a run database written by a first store over ``root``."""
    from traceml_ai.runs.rundb import load_db, write_db

    first = _store(root)
    first.poll()
    db = tmp_path / "runs.sqlite"
    write_db(db, first.runs(), first.stamps(), written_at="2026-09-21T14:13:20Z")
    loaded, reason = load_db(db)
    assert loaded is not None, reason
    store = _store(root)
    assert store.seed(dict(loaded.runs)) == len(first.runs())
    return store


def test_a_start_from_the_database_re_reads_a_finished_run_whose_file_was_replaced(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    done = write_run(root, "20260921-120000_done_0001", metrics={"step": 9, "last": {"val/auc": 0.8}})
    write_run(root, "20260921-120000_other_0002")
    store = _restart(root, tmp_path)
    _rewrite(done / "metrics.json", json.dumps({"step": 9, "last": {"val/auc": 0.9}}))  # by rename
    assert store.poll().changed == [os.path.realpath(done)]
    assert store.get(os.path.realpath(done)).last == {"val/auc": 0.9}  # type: ignore[union-attr]


def test_a_start_from_the_database_checks_a_finished_run_by_its_folder_and_refresh_by_its_files(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    done = write_run(root, "20260921-120000_done_0001", metrics={"step": 9, "last": {"val/auc": 0.8}})
    store = _restart(root, tmp_path)
    # Written in place (no rename): the folder's stamp stays, so the start keeps the cached summary...
    folder = os.stat(done)
    with open(done / "metrics.json", "r+", encoding="utf-8") as f:
        f.write(json.dumps({"schema_version": 1, "step": 9, "last": {"val/auc": 0.7}}))
    os.utime(done, ns=(folder.st_atime_ns, folder.st_mtime_ns))
    assert store.poll().changed == []
    assert store.get(os.path.realpath(done)).last == {"val/auc": 0.8}  # type: ignore[union-attr]
    # ...and Refresh compares every file.
    assert store.refresh().changed == [os.path.realpath(done)]
    assert store.get(os.path.realpath(done)).last == {"val/auc": 0.7}  # type: ignore[union-attr]


def test_a_start_from_the_database_reads_an_unfinished_run_file_by_file(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    live = write_run(root, "20260921-120000_live_0001", status="running", metrics={}, jsonl="")
    store = _restart(root, tmp_path)
    folder = os.stat(live)
    _append(live / "metrics.jsonl", _row(0, **{"train/loss": 2.0}))
    os.utime(live, ns=(folder.st_atime_ns, folder.st_mtime_ns))
    assert store.poll().changed == [os.path.realpath(live)]
    assert store.get(os.path.realpath(live)).start == {"train/loss": 2.0}  # type: ignore[union-attr]
