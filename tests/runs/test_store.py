"""The run store: discovery, derived status, cheap polling and histories (003 seed, "Status and stale",
"Live refresh", "Security and resource use")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from traceml_ai.runs.discovery import NoRootError
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.writer import iso_utc

NOW = 1_790_000_000.0  # 2026-09-21T14:13:20Z
STALE_AFTER = 60.0


class Clock:
    """A fake Unix-seconds clock the test moves by hand."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _set_mtime_later(path: Path, old_mtime_ns: int) -> None:
    # Two writes in the same clock tick can share an mtime; the store must see every rewrite here.
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, old_mtime_ns + 1_000_000_000)))


def _rewrite(path: Path, data: str | bytes) -> None:
    """Replace a file's content the way a logger does (temp file + rename), with a newer mtime."""
    old = os.stat(path).st_mtime_ns if path.exists() else 0
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
    _set_mtime_later(path, old)


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def write_run(
    root: Path,
    run_id: str,
    *,
    status: str | None = "completed",
    heartbeat: float | None = NOW,
    params: str = "optim.lr: 0.001\n",
    metrics: dict[str, Any] | None = None,
    jsonl: str | None = None,
    config: Any = None,
    **run_fields: Any,
) -> Path:
    """A run folder with run.json (omitted when ``status`` is None), params.yaml, metrics.json and
    optionally metrics.jsonl and config.json."""
    folder = root / run_id
    folder.mkdir(parents=True)
    if status is not None:
        run = {
            "schema_version": 1,
            "id": run_id,
            "name": run_id.split("_")[1] if "_" in run_id else run_id,
            "status": status,
            "started_at": iso_utc(NOW - 3600),
            "heartbeat_at": iso_utc(heartbeat) if heartbeat is not None else None,
            **run_fields,
        }
        (folder / "run.json").write_text(json.dumps(run))
    (folder / "params.yaml").write_text(params)
    m = metrics if metrics is not None else {"step": 1, "last": {"val/auc": 0.8}}
    (folder / "metrics.json").write_text(json.dumps({"schema_version": 1, **m}))
    if jsonl is not None:
        (folder / "metrics.jsonl").write_text(jsonl)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _row(step: int, **metrics: Any) -> str:
    return json.dumps({"step": step, "epoch": step, **metrics}) + "\n"


def _store(*roots: Path, clock: Clock | None = None) -> RunStore:
    return RunStore(list(roots), stale_after_seconds=STALE_AFTER, clock=clock or Clock())


def _by_id(store: RunStore) -> dict[str, Any]:
    return {r.id: r for r in store.runs()}


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- discovery through the store ---------------------------------------------------------------


def test_a_missing_root_is_skipped_with_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "20260921-120000_base_a3f9")
    store = _store(tmp_path / "gone", root)
    store.poll()
    assert [r.name for r in store.runs()] == ["base"]
    assert store.warnings == [f"runs folder not found, skipped: {tmp_path / 'gone'}"]


def test_no_root_at_all_raises_no_root_error(tmp_path: Path) -> None:
    with pytest.raises(NoRootError):
        _store(tmp_path / "gone").poll()


def test_dot_folders_and_plain_files_are_not_runs(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_base_a3f9")
    (tmp_path / ".cache").mkdir()
    (tmp_path / "README.md").write_text("# runs\n")
    store = _store(tmp_path)
    store.poll()
    assert [r.id for r in store.runs()] == ["20260921-120000_base_a3f9"]


def test_a_run_folder_symlinked_from_outside_is_ignored_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "20260921-120000_base_a3f9")
    secret = write_run(tmp_path / "private", "20260921-120000_secret_0000")
    (root / "20260921-120000_secret_0000").symlink_to(secret, target_is_directory=True)
    store = _store(root)
    store.poll()
    assert [r.name for r in store.runs()] == ["base"]
    assert any("20260921-120000_secret_0000" in w and "symlink points outside the run folder" in w
               for w in store.warnings)


def test_a_run_folder_symlinked_from_inside_is_listed_once(tmp_path: Path) -> None:
    real = write_run(tmp_path, "20260921-120000_base_a3f9")
    (tmp_path / "best").symlink_to(real, target_is_directory=True)
    store = _store(tmp_path)
    store.poll()
    assert [r.id for r in store.runs()] == ["20260921-120000_base_a3f9"]


def test_a_run_file_symlinked_from_outside_is_ignored_with_a_warning_on_that_run(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "20260921-120000_base_a3f9", status=None)
    write_run(root, "20260921-130000_other_b4c5")
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps({"name": "SECRET", "status": "completed"}))
    (run / "run.json").symlink_to(outside)
    store = _store(root)
    store.poll()
    runs = _by_id(store)
    base = runs["20260921-120000_base_a3f9"]
    assert base.name == "base"  # from the folder name, never from the outside file
    assert "SECRET" not in json.dumps(base.run_json)
    assert "run.json: ignored (symlink points outside the run folder)" in base.warnings
    assert runs["20260921-130000_other_b4c5"].warnings == []


# -- status ------------------------------------------------------------------------------------


def test_display_status_is_derived(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_fresh_0001", status="running", heartbeat=NOW - 10)
    write_run(tmp_path, "20260921-120000_stale_0002", status="running", heartbeat=NOW - STALE_AFTER - 1)
    write_run(tmp_path, "20260921-120000_nobeat_0003", status="running", heartbeat=None)
    write_run(tmp_path, "20260921-120000_done_0004", status="completed", heartbeat=NOW - 86400)
    write_run(tmp_path, "20260921-120000_crash_0005", status="failed", heartbeat=NOW - 86400)
    write_run(tmp_path, "20260921-120000_odd_0006", status="paused")
    write_run(tmp_path, "20260921-120000_old-exp_0007", status=None)
    write_run(tmp_path, "my experiment", status=None)
    store = _store(tmp_path)
    store.poll()
    shown = {r.name: r.display_status for r in store.runs()}
    assert shown == {
        "fresh": "running",
        "stale": "stale",
        "nobeat": "running?",
        "done": "completed",
        "crash": "failed",
        "odd": "unknown",
        "old-exp": "legacy",
        "my experiment": "legacy",
    }
    legacy = _by_id(store)["20260921-120000_old-exp_0007"]
    assert legacy.legacy and legacy.status is None
    assert legacy.started_at == "2026-09-21T12:00:00Z"  # from the folder name's stamp
    assert _by_id(store)["20260921-120000_stale_0002"].status == "running"  # as written


def test_stale_is_never_written(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_live_0001", status="running", heartbeat=NOW - 10,
              jsonl=_row(0, a=1.0))
    write_run(tmp_path, "20260921-120000_done_0002", status="completed", config={"a": 1})
    before = _tree(tmp_path)
    clock = Clock()
    store = _store(tmp_path, clock=clock)
    store.poll()
    clock.t += 3600
    store.poll()
    store.refresh()
    for run in store.runs():
        store.history(run.key)
        store.details(run.key)
    assert _by_id(store)["20260921-120000_live_0001"].display_status == "stale"
    assert _tree(tmp_path) == before  # same files, same bytes, same mtimes


# -- polling -----------------------------------------------------------------------------------


def test_a_poll_without_changes_reports_nothing(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-120000_live_0001", status="running", jsonl=_row(0, a=1.0))
    write_run(tmp_path, "20260921-120000_done_0002")
    store = _store(tmp_path)
    first = store.poll()
    assert len(first.changed) == 2 and first.removed == [] and first.version == 1
    second = store.poll()
    assert second.changed == [] and second.removed == []
    assert second.version == first.version
    assert store.refresh().changed == []


def test_rewriting_a_running_runs_metrics_json_changes_that_run_only(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running")
    write_run(tmp_path, "20260921-120000_live2_0002", status="running")
    write_run(tmp_path, "20260921-120000_done_0003")
    store = _store(tmp_path)
    v = store.poll().version
    _rewrite(live / "metrics.json", json.dumps({"step": 2, "last": {"val/auc": 0.85, "lr": 0.01}}))
    result = store.poll()
    assert result.changed == [os.path.realpath(live)]
    assert result.version == v + 1
    summary = store.get(os.path.realpath(live))
    assert summary is not None and summary.last == {"val/auc": 0.85, "lr": 0.01} and summary.step == 2


def test_appending_to_a_running_runs_metrics_jsonl_updates_start_values(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running", metrics={}, jsonl="")
    store = _store(tmp_path)
    store.poll()
    _append(live / "metrics.jsonl", _row(0, **{"train/loss": 2.0}))
    assert store.poll().changed == [os.path.realpath(live)]
    summary = store.get(os.path.realpath(live))
    assert summary is not None
    assert summary.start == {"train/loss": 2.0}
    assert summary.metric_names == ["train/loss"]


def test_finished_runs_are_frozen_until_refresh(tmp_path: Path) -> None:
    done = write_run(tmp_path, "20260921-120000_done_0001", metrics={"step": 9, "last": {"val/auc": 0.8}})
    key = os.path.realpath(done)
    store = _store(tmp_path)
    store.poll()
    _rewrite(done / "metrics.json", json.dumps({"step": 9, "last": {"val/auc": 0.9}}))
    assert store.poll().changed == []
    assert store.get(key).last == {"val/auc": 0.8}  # type: ignore[union-attr]
    assert store.refresh().changed == [key]
    assert store.get(key).last == {"val/auc": 0.9}  # type: ignore[union-attr]


def test_new_and_removed_run_folders(tmp_path: Path) -> None:
    old = write_run(tmp_path, "20260921-120000_old_0001")
    store = _store(tmp_path)
    v = store.poll().version
    new = write_run(tmp_path, "20260921-130000_new_0002", status="running")
    result = store.poll()
    assert result.changed == [os.path.realpath(new)] and result.removed == []
    assert result.version == v + 1
    (old / "run.json").unlink()
    (old / "params.yaml").unlink()
    (old / "metrics.json").unlink()
    old.rmdir()
    result = store.poll()
    assert result.changed == [] and result.removed == [os.path.realpath(old)]
    assert [r.name for r in store.runs()] == ["new"]


def test_a_running_run_turns_stale_as_its_heartbeat_ages(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running", heartbeat=NOW)
    write_run(tmp_path, "20260921-120000_done_0002")
    clock = Clock()
    store = _store(tmp_path, clock=clock)
    store.poll()
    clock.t += STALE_AFTER - 1
    assert store.poll().changed == []
    clock.t += 1  # exactly stale_after_seconds old: not yet stale (003 seed: now - heartbeat_at > it)
    assert store.poll().changed == []
    assert store.get(os.path.realpath(live)).display_status == "running"  # type: ignore[union-attr]
    clock.t += 0.5
    result = store.poll()
    assert result.changed == [os.path.realpath(live)]
    assert store.get(os.path.realpath(live)).display_status == "stale"  # type: ignore[union-attr]
    # A fresh heartbeat brings it back.
    run = json.loads((live / "run.json").read_text())
    _rewrite(live / "run.json", json.dumps({**run, "heartbeat_at": iso_utc(clock.t)}))
    assert store.poll().changed == [os.path.realpath(live)]
    assert store.get(os.path.realpath(live)).display_status == "running"  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "broken"), [
    ("metrics.json", "{broken"),
    ("params.yaml", "a: [1, 2\n"),
    ("run.json", '{"status": "runn'),
])
def test_a_file_that_turns_corrupt_keeps_its_last_good_parse(tmp_path: Path, name: str, broken: str) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running",
                     metrics={"step": 3, "last": {"val/auc": 0.7}}, params="optim.lr: 0.01\n")
    other = write_run(tmp_path, "20260921-120000_other_0002", status="running")
    key = os.path.realpath(live)
    store = _store(tmp_path)
    store.poll()
    good = store.get(key)
    assert good is not None and good.warnings == []
    _rewrite(live / name, broken)
    assert store.poll().changed == [key]
    summary = store.get(key)
    assert summary is not None
    assert (summary.last, summary.params, summary.status, summary.display_status) == (
        {"val/auc": 0.7}, {"optim.lr": 0.01}, "running", "running")
    (warning,) = summary.warnings
    assert warning.startswith(f"{name}: ") and warning.endswith("; showing the last good version")
    assert store.get(os.path.realpath(other)).warnings == []  # type: ignore[union-attr]
    # Fixed again: the warning goes away.
    _rewrite(live / name, _good_text(name))
    store.poll()
    assert store.get(key).warnings == []  # type: ignore[union-attr]


def _good_text(name: str) -> str:
    return {
        "metrics.json": json.dumps({"step": 3, "last": {"val/auc": 0.7}}),
        "params.yaml": "optim.lr: 0.01\n",
        "run.json": json.dumps({"status": "running", "heartbeat_at": iso_utc(NOW)}),
    }[name]


def test_a_byte_that_is_not_utf8_in_run_json_flags_that_run_only(tmp_path: Path) -> None:
    bad = write_run(tmp_path, "20260921-120000_bad_0001", notes="caf\u00e9")
    write_run(tmp_path, "20260921-120000_good_0002")
    raw = (bad / "run.json").read_bytes().replace(b"caf\\u00e9", b"caf\xe9")
    (bad / "run.json").write_bytes(raw)
    store = _store(tmp_path)
    store.poll()
    runs = _by_id(store)
    flagged = runs["20260921-120000_bad_0001"]
    assert flagged.name == "bad" and flagged.notes == "caf\ufffd" and flagged.display_status == "completed"
    assert len(flagged.warnings) == 1 and "is not UTF-8" in flagged.warnings[0]
    assert runs["20260921-120000_good_0002"].warnings == []


# -- histories ---------------------------------------------------------------------------------


def test_history_is_loaded_on_request_and_advances_by_appended_bytes(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running",
                     jsonl=_row(0, **{"train/loss": 1.0}) + _row(1, **{"train/loss": 0.8}))
    key = os.path.realpath(live)
    store = _store(tmp_path)
    store.poll()
    tail = store.history(key)
    assert tail.series("train/loss").value.tolist() == [1.0, 0.8]
    offset = tail.offset
    _append(live / "metrics.jsonl", _row(2, **{"train/loss": 0.6}))
    again = store.history(key)
    assert again is tail  # the same reader, advanced
    assert tail.offset == (live / "metrics.jsonl").stat().st_size > offset
    assert tail.series("train/loss").value.tolist() == [1.0, 0.8, 0.6]


def test_history_warnings_appear_in_the_run_summary(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running", jsonl=_row(0, a=1.0))
    key = os.path.realpath(live)
    store = _store(tmp_path)
    store.poll()
    store.history(key)
    assert store.get(key).warnings == []  # type: ignore[union-attr]
    _append(live / "metrics.jsonl", "not json\n" + _row(1, a=2.0))
    store.history(key)
    warnings = store.get(key).warnings  # type: ignore[union-attr]
    assert warnings == ["metrics.jsonl: 1 corrupt line(s) skipped (line 2: not JSON)"]


def test_a_partial_final_line_is_not_a_row_until_completed(tmp_path: Path) -> None:
    line = _row(1, a=2.0)
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running", jsonl=_row(0, a=1.0) + line[:7])
    key = os.path.realpath(live)
    store = _store(tmp_path)
    store.poll()
    assert store.history(key).steps == [0]
    assert store.get(key).warnings == []  # type: ignore[union-attr]
    _append(live / "metrics.jsonl", line[7:])
    assert store.history(key).steps == [0, 1]
    assert store.get(key).warnings == []  # type: ignore[union-attr]


def test_history_of_a_run_that_has_not_logged_yet_picks_up_the_file_later(tmp_path: Path) -> None:
    live = write_run(tmp_path, "20260921-120000_live_0001", status="running")
    key = os.path.realpath(live)
    store = _store(tmp_path)
    store.poll()
    assert store.history(key).rows == []
    (live / "metrics.jsonl").write_text(_row(0, a=1.0))
    assert store.history(key).steps == [0]


def test_history_of_a_metrics_file_symlinked_from_outside_is_empty(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "20260921-120000_live_0001", status="running")
    outside = tmp_path / "other.jsonl"
    outside.write_text(_row(0, secret=1.0))
    (run / "metrics.jsonl").symlink_to(outside)
    store = _store(root)
    store.poll()
    key = os.path.realpath(run)
    assert "metrics.jsonl: ignored (symlink points outside the run folder)" in store.get(key).warnings  # type: ignore[union-attr]
    assert store.history(key).rows == []


# -- find and details --------------------------------------------------------------------------


def test_find_by_path_id_prefix_and_name(tmp_path: Path) -> None:
    a = write_run(tmp_path, "20260921-120000_baseline_a3f9")
    write_run(tmp_path, "20260921-130000_high-lr_b4c5")
    write_run(tmp_path, "20260922-090000_high-lr_c6d7")
    store = _store(tmp_path)
    store.poll()
    assert store.find(str(a)).id == "20260921-120000_baseline_a3f9"
    assert store.find("20260921-130000_high-lr_b4c5").id == "20260921-130000_high-lr_b4c5"
    assert store.find("20260922").id == "20260922-090000_high-lr_c6d7"
    assert store.find("baseline").id == "20260921-120000_baseline_a3f9"
    assert store.find("base").id == "20260921-120000_baseline_a3f9"
    with pytest.raises(KeyError, match="no run 'nope'"):
        store.find("nope")


def test_a_name_of_several_runs_is_the_newest_with_a_note(tmp_path: Path) -> None:
    """Issue 14: a name given to a command that takes one run, matching several, was an error."""
    write_run(tmp_path, "20260921-130000_high-lr_b4c5", started_at="2026-09-22T10:00:00Z")
    write_run(tmp_path, "20260922-090000_high-lr_c6d7", started_at="2026-09-22T09:00:00Z")
    write_run(tmp_path, "20260920-090000_high-lr_0000", started_at=None)
    write_run(tmp_path, "20260923-090000_high-mom_e8f9")
    store = _store(tmp_path)
    store.poll()
    run, note = store.resolve("high-lr")
    assert run.id == "20260921-130000_high-lr_b4c5"  # started last, though its id sorts first
    assert note == ("3 runs are named 'high-lr'; using the newest, 20260921-130000_high-lr_b4c5 (started "
                    "2026-09-22T10:00:00Z); name another by its id or folder path "
                    "(traceml runs ls --filter name=high-lr lists them)")
    assert store.find("high-l").id == run.id  # the start of one name, the same rule
    assert store.resolve("high-mom")[1] is None  # one run of that name: no note
    with pytest.raises(KeyError, match=r"'high' is the start of 2 run names \('high-lr', 'high-mom'\)"):
        store.find("high")
    with pytest.raises(KeyError, match="'2026092' is the start of 4 run ids"):
        store.find("2026092")


def test_details_returns_config_json(tmp_path: Path) -> None:
    config = {"model": {"layers": [64, 64], "act": "gelu"}, "seed": 1}
    run = write_run(tmp_path, "20260921-120000_base_a3f9", config=config, jsonl=_row(0, a=1.0))
    bare = write_run(tmp_path, "20260921-120000_bare_0000")
    store = _store(tmp_path)
    store.poll()
    details = store.details(os.path.realpath(run))
    assert details.config == config
    assert details.summary.name == "base"
    assert details.files["config.json"] == (run / "config.json").stat().st_size
    assert details.files["metrics.jsonl"] == (run / "metrics.jsonl").stat().st_size
    empty = store.details(os.path.realpath(bare))
    assert empty.config is None and empty.files["config.json"] is None and empty.files["metrics.jsonl"] is None


def test_details_shows_a_broken_config_json_as_a_warning(tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-120000_base_a3f9")
    (run / "config.json").write_text("{oops")
    store = _store(tmp_path)
    store.poll()
    details = store.details(os.path.realpath(run))
    assert details.config is None
    assert any(w.startswith("config.json: not valid JSON") for w in details.summary.warnings)


def test_details_reads_the_whole_run_json_which_the_kept_summaries_leave_out(tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-120000_base_a3f9", command=["python", "train.py"], host={"hostname": "gpu-1"})
    key = os.path.realpath(run)
    store = _store(tmp_path)
    store.poll()
    # The table's summary keeps the typed fields only (10,000 runs stay small in a viewer)...
    assert store.get(key).run_json == {} and store.get(key).name == "base"  # type: ignore[union-attr]
    # ...and the inspector gets the whole file, read again when it changes.
    details = store.details(key)
    assert details.summary.run_json["command"] == ["python", "train.py"]
    assert details.summary.run_json["host"] == {"hostname": "gpu-1"}
    assert store.get(key).run_json == {}  # type: ignore[union-attr]
    meta = json.loads((run / "run.json").read_text())
    _rewrite(run / "run.json", json.dumps({**meta, "notes": "rewritten"}))
    assert store.details(key).summary.run_json["notes"] == "rewritten"
    # Turned corrupt: the inspector shows the version it read last, the table says what is wrong.
    _rewrite(run / "run.json", '{"status": "runn')
    store.refresh()
    details = store.details(key)
    assert details.summary.run_json["notes"] == "rewritten"
    assert any(w.startswith("run.json: ") for w in details.summary.warnings)


def test_details_never_reads_a_run_json_symlinked_from_outside(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "20260921-120000_base_a3f9", status=None)
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps({"name": "SECRET", "status": "completed"}))
    (run / "run.json").symlink_to(outside)
    store = _store(root)
    store.poll()
    assert store.details(os.path.realpath(run)).summary.run_json == {}


def test_histories_are_read_while_a_poll_holds_the_runs_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from traceml_ai.runs import store as store_module

    monkeypatch.setattr(store_module, "_POLL_CHUNK", 2)
    folders = [
        write_run(tmp_path, f"20260921-12000{i}_run{i}_000{i}", status="running", jsonl=_row(0, loss=float(i)))
        for i in range(7)
    ]
    store = _store(tmp_path)
    store.poll()
    errors: list[BaseException] = []
    done = threading.Event()

    def refresh_until_done() -> None:
        try:
            while not done.is_set():
                store.refresh()
        except BaseException as err:  # reported below, on the test thread
            errors.append(err)

    worker = threading.Thread(target=refresh_until_done)
    worker.start()
    try:
        for _ in range(50):
            for i, folder in enumerate(folders):
                key = os.path.realpath(folder)
                assert store.history(key).series("loss").value.tolist() == [float(i)]
                assert store.details(key).summary.name == f"run{i}"
                assert len(store.runs()) == 7
    finally:
        done.set()
        worker.join()
    assert errors == []
