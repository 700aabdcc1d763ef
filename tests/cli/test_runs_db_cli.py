"""`traceml runs ls` starts from the run database `runs.sqlite` and falls back to a full scan when it
is missing, of another schema version or corrupt, then writes it again (issue 16 item 2)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_traceml
from traceml_ai.runs.fake import generate
from traceml_ai.runs.rundb import SCHEMA_VERSION


@pytest.fixture
def root(tmp_path: Path) -> Path:
    runs = tmp_path / "traceml" / "runs"
    generate(runs, runs=4, seed=3)
    # A cache folder (as the viewer leaves one): ls keeps a database there however few the runs.
    (tmp_path / "traceml" / ".cache").mkdir()
    return runs


def _db(root: Path) -> Path:
    return root.parent / ".cache" / "runs.sqlite"


def _ls(root: Path) -> tuple[dict[str, dict], str]:
    proc = run_traceml("runs", "ls", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return {row["id"]: row for row in rows}, proc.stderr


def _schema(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("PRAGMA user_version").fetchone()[0])


def test_without_a_database_ls_scans_and_writes_one_and_the_next_ls_answers_the_same(root: Path) -> None:
    assert not _db(root).exists()
    cold, _ = _ls(root)
    assert _db(root).is_file() and _schema(_db(root)) == SCHEMA_VERSION
    written = os.stat(_db(root))
    warm, stderr = _ls(root)
    assert warm == cold and "runs.sqlite" not in stderr
    assert os.stat(_db(root)).st_mtime_ns == written.st_mtime_ns  # nothing changed: not rewritten
    assert not any(p.name.startswith(".") for p in root.iterdir())  # nothing written into the root


def test_a_warm_ls_shows_a_new_run_and_a_rewritten_finished_run(root: Path) -> None:
    cold, _ = _ls(root)
    done = next(r for r in cold.values() if r["display_status"] == "completed")
    folder = root / done["id"]
    meta = json.loads((folder / "run.json").read_text())
    tmp = folder / ".run.json.tmp"
    tmp.write_text(json.dumps({**meta, "name": "renamed-after-the-run"}))
    os.replace(tmp, folder / "run.json")  # as every writer of the run format replaces a file
    new = root / "20261201-120000_newcomer_beef"
    new.mkdir()
    (new / "run.json").write_text(json.dumps({"schema_version": 1, "name": "newcomer", "status": "completed"}))
    warm, _ = _ls(root)
    assert warm[done["id"]]["name"] == "renamed-after-the-run"
    assert warm[new.name]["name"] == "newcomer"
    assert set(warm) == set(cold) | {new.name}


def test_a_database_of_another_schema_version_is_rebuilt_from_the_runs(root: Path) -> None:
    cold, _ = _ls(root)
    with sqlite3.connect(_db(root)) as con:
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    warm, stderr = _ls(root)
    assert warm == cold
    assert f"schema version {SCHEMA_VERSION - 1}" in stderr and "rebuilding" in stderr
    assert _schema(_db(root)) == SCHEMA_VERSION


def test_a_small_workspace_without_a_cache_folder_gets_no_database(tmp_path: Path) -> None:
    runs = tmp_path / "traceml" / "runs"
    generate(runs, runs=3, seed=1)
    rows, stderr = _ls(runs)
    assert len(rows) == 3 and stderr == ""
    assert not (tmp_path / "traceml" / ".cache").exists()


def test_a_corrupt_database_is_a_warning_and_is_rebuilt(root: Path) -> None:
    cold, _ = _ls(root)
    _db(root).write_bytes(b"this is not a database" * 100)
    warm, stderr = _ls(root)
    assert warm == cold
    assert "runs.sqlite" in stderr and "rebuilding" in stderr
    assert _schema(_db(root)) == SCHEMA_VERSION
    again, stderr = _ls(root)
    assert again == cold and "runs.sqlite" not in stderr


def test_cache_dir_chooses_where_ls_keeps_its_database_and_one_inside_the_root_is_refused(
        root: Path, tmp_path: Path) -> None:
    # Review 16c: `runs ls` had no --cache-dir (only the TRACEML_CACHE_DIR setting), unlike `traceml ui`.
    chosen = tmp_path / "elsewhere"
    chosen.mkdir()
    proc = run_traceml("runs", "ls", str(root), "--json", "--cache-dir", str(chosen))
    assert proc.returncode == 0, proc.stderr
    assert (chosen / "runs.sqlite").is_file() and not _db(root).exists()
    again = run_traceml("runs", "ls", str(root), "--json", "--cache-dir", str(chosen))
    assert again.stdout == proc.stdout and "runs.sqlite" not in again.stderr
    inside = run_traceml("runs", "ls", str(root), "--cache-dir", str(root / "cache"))
    assert inside.returncode != 0 and not (root / "cache").exists()
    assert len(inside.stderr.strip().splitlines()) == 1, inside.stderr
