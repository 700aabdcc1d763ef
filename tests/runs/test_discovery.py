"""Finding run folders under the runs roots (003 seed, "Security and resource use")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from traceml_ai.runs.discovery import OUTSIDE_ROOT, NoRootError, catalog_only_folder, list_runs, stat_confined


def _run(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"schema_version": 1, "name": name, "status": "completed"}))
    return folder


def test_each_subfolder_is_a_run_in_name_order(tmp_path: Path) -> None:
    _run(tmp_path, "b_run")
    _run(tmp_path, "a_run")
    listing = list_runs([tmp_path])
    assert [r.id for r in listing.runs] == ["a_run", "b_run"]
    assert listing.runs[0].path == os.path.realpath(tmp_path / "a_run")
    assert listing.roots == [os.path.realpath(tmp_path)]
    assert listing.ignored == [] and listing.missing_roots == []


def test_dot_folders_and_plain_files_are_not_runs(tmp_path: Path) -> None:
    _run(tmp_path, "real")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".real.tmp").mkdir()
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "runs.sqlite").write_bytes(b"")
    listing = list_runs([tmp_path])
    assert [r.id for r in listing.runs] == ["real"]
    assert listing.ignored == []


def test_a_missing_root_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "one")
    listing = list_runs([tmp_path / "nope", root])
    assert listing.missing_roots == [str(tmp_path / "nope")]
    assert [r.id for r in listing.runs] == ["one"]


def test_no_root_at_all_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoRootError) as err:
        list_runs([tmp_path / "a", tmp_path / "b"])
    message = str(err.value)
    assert str(tmp_path / "a") in message and str(tmp_path / "b") in message
    assert "TRACEML_ROOTS" in message


def test_the_same_root_twice_lists_each_run_once(tmp_path: Path) -> None:
    _run(tmp_path, "one")
    listing = list_runs([tmp_path, str(tmp_path) + "/"])
    assert [r.id for r in listing.runs] == ["one"]


def test_a_symlinked_run_outside_the_root_is_ignored_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "inside")
    secret = _run(tmp_path / "elsewhere", "secret")
    (root / "sneaky").symlink_to(secret, target_is_directory=True)
    (root / "up").symlink_to(root, target_is_directory=True)  # the root itself is not a run
    listing = list_runs([root])
    assert [r.id for r in listing.runs] == ["inside"]
    assert (str(root / "sneaky"), OUTSIDE_ROOT) in listing.ignored
    assert (str(root / "up"), OUTSIDE_ROOT) in listing.ignored
    assert OUTSIDE_ROOT == "symlink points outside the run folder"


@pytest.mark.parametrize("link_name", ["a_latest", "z_latest"])
def test_a_symlink_to_a_run_of_the_same_root_lists_it_once_under_its_own_id(tmp_path: Path, link_name: str) -> None:
    real = _run(tmp_path, "m_run")
    (tmp_path / link_name).symlink_to(real, target_is_directory=True)
    listing = list_runs([tmp_path])
    assert [(r.id, r.path) for r in listing.runs] == [("m_run", os.path.realpath(real))]
    assert listing.ignored == [(str(tmp_path / link_name), "same folder as another run (m_run)")]


def test_a_symlink_to_a_folder_deeper_inside_the_root_is_a_run(tmp_path: Path) -> None:
    deep = _run(tmp_path / "archive", "old")
    (tmp_path / "old").symlink_to(deep, target_is_directory=True)
    listing = list_runs([tmp_path])
    assert [(r.id, r.path) for r in listing.runs] == [("archive", os.path.realpath(tmp_path / "archive")),
                                                     ("old", os.path.realpath(deep))]


def test_stat_confined_follows_only_links_that_stay_inside(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = _run(root, "r")
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    (run / "config.json").symlink_to(outside)
    (run / "params.yaml").symlink_to(run / "run.json")
    (run / "logs").mkdir()
    real_root = os.path.realpath(root)
    assert stat_confined(str(run / "config.json"), real_root) == (None, OUTSIDE_ROOT)
    st, reason = stat_confined(str(run / "params.yaml"), real_root)
    assert reason is None and st is not None and st.st_size == (run / "run.json").stat().st_size
    assert stat_confined(str(run / "metrics.json"), real_root) == (None, None)
    assert stat_confined(str(run / "logs"), real_root) == (None, "not a regular file")


def test_a_folder_holding_only_catalog_files_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "stormlog_run.json").write_text("{}", encoding="utf-8")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "stormlog_attachments.json").write_text("{}", encoding="utf-8")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stormlog_run.json").write_text("{}", encoding="utf-8")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n', encoding="utf-8")
    (tmp_path / "empty").mkdir()
    assert [catalog_only_folder(str(tmp_path / n)) for n in ("group", "notes", "run", "empty")] == [
        True, True, False, False]
