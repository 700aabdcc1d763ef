"""`traceml runs ls / show` on the reader and table-model cases of issue 15 (the reference reader's
tests, run as real commands): natural sort, numeric filters, list tracebacks, newer metrics.json,
text keys in metrics.jsonl, glob roots, derived durations, differing params by default."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

from tests.conftest import run_traceml
from traceml_ai.runs.writer import iso_utc


def write_run(root: Path, folder: str, run: dict[str, Any] | None = None, *, params: str | None = None,
              metrics: dict[str, Any] | None = None, rows: list[dict[str, Any]] | None = None) -> Path:
    """One run folder written by hand, as another logger would."""
    path = root / folder
    path.mkdir(parents=True)
    if run is not None:
        (path / "run.json").write_text(json.dumps({"schema_version": 1, **run}))
    if params is not None:
        (path / "params.yaml").write_text(params)
    if metrics is not None:
        (path / "metrics.json").write_text(json.dumps(metrics))
    if rows is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ls_json(*args: str, cwd: Path | None = None) -> list[dict[str, Any]]:
    proc = run_traceml("runs", "ls", *args, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _done(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": "completed", "started_at": "2026-11-30T10:00:00Z",
            "ended_at": "2026-11-30T10:30:00Z", "duration_s": 1800.0, **extra}


def test_text_sorts_naturally_and_case_insensitively_in_the_table_and_the_csv(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i, name in enumerate(["run-10", "run-2", "run-1", "Run-3"]):
        write_run(root, f"r{i}", _done(name))
    assert [r["name"] for r in _ls_json(str(root), "--sort", "name")] == ["run-1", "run-2", "Run-3", "run-10"]
    assert [r["name"] for r in _ls_json(str(root), "--sort", "-name")] == ["run-10", "Run-3", "run-2", "run-1"]
    proc = run_traceml("runs", "ls", str(root), "--sort", "name", "--csv")
    assert proc.returncode == 0, proc.stderr
    assert [row["name"] for row in csv.DictReader(io.StringIO(proc.stdout))] == ["run-1", "run-2", "Run-3", "run-10"]
    proc = run_traceml("runs", "ls", str(root), "--sort", "name")  # the terminal table too
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout
    assert lines.index("run-1 ") < lines.index("run-2") < lines.index("Run-3") < lines.index("run-10")


def test_a_numeric_filter_never_matches_text_or_missing_values(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "a", _done("five"), params="width: 5\n")
    write_run(root, "b", _done("text"), params="width: abc\n")
    write_run(root, "c", _done("none"), params="width: null\n")
    write_run(root, "d", _done("zero"), params="width: 0\n")
    # config.width holds a text value, so it is a text column; "> 0" still compares numbers only.
    assert [r["name"] for r in _ls_json(str(root), "--filter", "config.width>0")] == ["five"]
    assert [r["name"] for r in _ls_json(str(root), "--filter", "config.width:1..10")] == ["five"]
    assert sorted(r["name"] for r in _ls_json(str(root), "--filter", "config.width>=0")) == ["five", "zero"]


def test_a_text_operand_on_a_number_column_is_bad_usage(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "a", _done("a"), metrics={"best": {"val/auc": {"value": 0.9, "mode": "max"}}})
    proc = run_traceml("runs", "ls", str(root), "--filter", "run.best.val/auc>abc")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "'abc' is not a number, and run.best.val/auc holds numbers" in proc.stderr


def test_a_traceback_written_as_a_list_of_lines_is_shown_as_text(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    lines = ["Traceback (most recent call last):\n", '  File "train.py", line 12, in <module>\n',
             "    main()\n", "ValueError: bad batch\n"]
    write_run(root, "a", {"name": "broken", "status": "failed", "started_at": "2026-11-30T10:00:00Z",
                          "exit": {"code": 1, "error_type": "ValueError", "error_message": "bad batch",
                                   "traceback": lines}})
    proc = run_traceml("runs", "show", "broken", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    shown = [line.strip("│ ") for line in proc.stdout.splitlines()]
    start = shown.index("Traceback (most recent call last):")
    assert shown[start + 1 : start + 4] == ['File "train.py", line 12, in <module>', "main()", "ValueError: bad batch"]
    assert "['Traceback" not in proc.stdout and "\\n" not in proc.stdout


def test_show_leaves_out_an_exit_field_run_json_leaves_null(tmp_path: Path) -> None:
    """A failed run with an exit code and no signal: "exit code 1", never "signal None"; one with
    neither prints no exit line at all."""
    root = tmp_path / "runs"
    write_run(root, "a", {"name": "coded", "status": "failed", "started_at": "2026-11-30T10:00:00Z",
                          "exit": {"code": 1, "signal": None, "error_type": "ValueError", "error_message": "bad"}})
    write_run(root, "b", {"name": "bare", "status": "failed", "started_at": "2026-11-30T10:00:00Z",
                          "exit": {"code": None, "signal": None, "error_type": "KeyError", "error_message": "k"}})
    proc = run_traceml("runs", "show", "coded", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "exit code 1" in proc.stdout and "signal" not in proc.stdout and "None" not in proc.stdout
    proc = run_traceml("runs", "show", "bare", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "KeyError: k" in proc.stdout
    assert "exit code" not in proc.stdout and "signal" not in proc.stdout and "None" not in proc.stdout


def test_a_newer_metrics_json_is_read_with_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "a", _done("future"), metrics={"schema_version": 2, "last": {"loss": 0.5}})
    (row,) = _ls_json(str(root))
    assert any(w.startswith("metrics.json: schema_version 2 is newer") for w in row["warnings"])
    proc = run_traceml("runs", "show", "future", "--root", str(root))
    assert "metrics.json: schema_version 2 is newer" in proc.stdout and "0.5" in proc.stdout


def test_text_and_boolean_keys_of_the_history_are_not_metrics(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    rows = [{"step": i, "loss": 1.0 / (i + 1), "phase": "train" if i % 2 else "val", "is_best": i == 3}
            for i in range(6)]
    write_run(root, "a", _done("phases"), rows=rows)
    proc = run_traceml("runs", "show", "phases", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    warnings = [w for w in shown["warnings"] if "not numbers" in w]
    assert len(warnings) == 1 and "2 key(s)" in warnings[0] and "is_best, phase" in warnings[0]
    table = run_traceml("runs", "show", "phases", "--root", str(root))
    lines = table.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["metric", "start"])
    assert [line.split()[0] for line in lines[header + 1 :] if line.strip()] == ["loss"]


def test_a_root_given_as_a_glob_is_expanded_like_a_shell_would(tmp_path: Path) -> None:
    write_run(tmp_path / "proj-a" / "runs", "r1", _done("alpha"))
    write_run(tmp_path / "deep" / "proj-b" / "runs", "r2", _done("beta"))
    names = sorted(r["name"] for r in _ls_json("**/runs", cwd=tmp_path))
    assert names == ["alpha", "beta"]
    proc = run_traceml("runs", "ls", "nowhere/**/runs", cwd=tmp_path)
    assert proc.returncode != 0
    assert "'nowhere/**/runs' matches no folder" in proc.stderr


def test_durations_are_derived_when_run_json_has_none(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    now = time.time()
    write_run(root, "a", {"name": "live", "status": "running", "started_at": iso_utc(now - 3600),
                          "heartbeat_at": iso_utc(now)})
    write_run(root, "b", {"name": "stuck", "status": "running", "started_at": iso_utc(now - 7200),
                          "heartbeat_at": iso_utc(now - 5400)})
    write_run(root, "c", {"name": "done", "status": "completed", "started_at": "2026-11-30T10:00:00Z",
                          "ended_at": "2026-11-30T10:30:00Z"})
    write_run(root, "d", _done("written", duration_s=42.0))
    rows = {r["name"]: r["values"]["duration_s"] for r in _ls_json(str(root), "--columns", "name,duration_s")}
    assert 3590 <= rows["live"] <= 3600 + 300  # now − started_at (the command takes a moment)
    assert rows["stuck"] == 1800.0  # heartbeat_at − started_at
    assert rows["done"] == 1800.0  # ended_at − started_at
    assert rows["written"] == 42.0
    show = run_traceml("runs", "show", "stuck", "--root", str(root))
    assert "30m 00s (derived: heartbeat_at − started_at)" in show.stdout
    show = run_traceml("runs", "show", "written", "--root", str(root))
    assert "duration  42s  " in show.stdout and "(derived" not in show.stdout
    longest = _ls_json(str(root), "--sort", "-duration_s", "--columns", "name")
    assert [r["name"] for r in longest] == ["live", "stuck", "done", "written"]


def test_default_columns_show_the_params_that_differ(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    common = "".join(f"same{j}: 1\n" for j in range(3))
    write_run(root, "a", _done("a"), params=common + "lr: 0.1\n" + "".join(f"p{j}: 1\n" for j in range(8)),
              metrics={"best": {"val/auc": {"value": 0.9, "mode": "max"}}})
    write_run(root, "b", _done("b"), params=common + "lr: 0.01\n" + "".join(f"p{j}: 2\n" for j in range(8)))
    (row, _) = _ls_json(str(root))
    columns = list(row["values"])
    params = [c for c in columns if c.startswith("config.")]
    assert params == ["config.lr", "config.p0", "config.p1", "config.p2", "config.p3", "config.p4"]
    assert columns.index("config.p4") < columns.index("run.best.val/auc")
    proc = run_traceml("runs", "ls", str(root), "--csv")
    header = proc.stdout.splitlines()[0].split(",")
    assert "config.lr" in header and "config.same0" not in header


def test_the_chart_csv_counts_wall_time_from_started_at(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    start = 1796032800.0  # 2026-11-30T10:00:00Z, the run's started_at
    write_run(root, "a", _done("timed"), rows=[{"step": i, "loss": 1.0, "time": start + 60 + 10 * i} for i in range(3)])
    proc = run_traceml("plot", "timed", "--root", str(root), "--metric", "loss", "--x", "time", "--format", "csv",
                       "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(Path(proc.stdout.strip()).read_text())))
    assert [float(r["time_s"]) for r in rows] == [60.0, 70.0, 80.0]
