"""``traceml query ...`` run as a real command (004 seed, "Query API"; DESIGN §5, §7 exit codes: 0 ok,
1 failure, 2 bad usage): the seed's commands under TraceML's name, Stormlog's output shapes."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.catalog.fixtures import SEED_MINIMAL_ENVELOPE, envelope, telemetry_jsonl, traceml_session
from tests.conftest import run_traceml


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """The seed's layout: ./artifacts with the minimal envelope, its rank-0 session, and one
    implicit TraceML run beside it."""
    root = tmp_path / "artifacts"
    (root / "train-42").mkdir(parents=True)
    (root / "train-42" / "stormlog_run.json").write_text(SEED_MINIMAL_ENVELOPE, encoding="utf-8")
    telemetry_jsonl(root / "train-42" / "telemetry" / "rank0.jsonl", "session-rank-0", job_id="train-42", rank=0,
                    world_size=8)
    traceml_session(root / "20261130-101500_baseline_a3f9", "solo-session")
    return root


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_traceml_query_runs_json_as_in_the_seed(artifacts: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = run_traceml("query", "runs", "./artifacts", "--json", cwd=artifacts.parent,
                       env={"HOME": str(home), "XDG_CACHE_HOME": ""})
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in json.loads(proc.stdout)}  # one JSON array, as stormlog query --json
    assert set(rows) == {"run-train-42", "session:solo-session"}
    assert rows["run-train-42"]["explicit"] is True and rows["run-train-42"]["sessions"] == ["session-rank-0"]
    assert rows["run-train-42"]["source_kind"] == "run_envelope"
    assert rows["session:solo-session"]["title"] == "Session solo-session"
    assert proc.stderr == ""
    # the parse cache went to the user's cache folder; nothing beside or inside ./artifacts
    assert (home / ".cache" / "traceml" / "catalog" / "catalog-facts.msgpack").is_file()
    assert sorted(p.name for p in artifacts.parent.iterdir()) == ["artifacts", "home"]
    assert not list(artifacts.rglob("*.msgpack"))


def test_json_is_an_empty_array_when_nothing_matches_and_jsonl_is_one_object_per_line(artifacts: Path) -> None:
    none = run_traceml("query", "runs", str(artifacts), "--json", "--run-id", "nope", "--no-cache")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    lines = run_traceml("query", "sessions", str(artifacts), "--jsonl", "--no-cache")
    assert lines.returncode == 0, lines.stderr
    assert [r["session_id"] for r in json_lines(lines.stdout)] == ["solo-session", "session-rank-0"]
    empty = run_traceml("query", "sessions", str(artifacts), "--jsonl", "--session", "nope", "--no-cache")
    assert empty.returncode == 0 and empty.stdout == ""


def test_a_file_path_writes_nothing_beside_the_file(artifacts: Path, tmp_path: Path) -> None:
    target = artifacts / "train-42" / "telemetry" / "rank0.jsonl"
    before = sorted(p.name for p in target.parent.iterdir())
    proc = run_traceml("query", "sessions", str(target), "--json", env={"HOME": str(tmp_path / "home"),
                                                                        "XDG_CACHE_HOME": ""})
    assert proc.returncode == 0, proc.stderr
    assert [r["session_id"] for r in json.loads(proc.stdout)] == ["session-rank-0"]
    assert sorted(p.name for p in target.parent.iterdir()) == before
    assert not (artifacts / "train-42" / ".cache").exists() and not (target.parent / ".cache").exists()


def test_traceml_query_attachments_table_as_in_the_seed(artifacts: Path) -> None:
    proc = run_traceml("query", "attachments", "./artifacts", "--run-id", "run-train-42", "--table", "--no-cache",
                       cwd=artifacts.parent)
    assert proc.returncode == 0, proc.stderr
    assert "Rank 0 profiler trace" in proc.stdout and "profiler_trace" in proc.stdout and "reference" in proc.stdout
    assert "telemetry_file" in proc.stdout  # the local telemetry file, as copy
    assert "solo-session" not in proc.stdout
    assert "2 attachments" in proc.stdout


def test_traceml_query_sessions_csv_with_filters(artifacts: Path) -> None:
    proc = run_traceml("query", "sessions", str(artifacts), "--job-id", "train-42", "--rank", "0", "--csv",
                       "--no-cache")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["session_id"], r["source_kind"], r["world_size"]) for r in rows] == [
        ("session-rank-0", "telemetry_jsonl", "8")]
    assert "run_id" not in rows[0]  # Stormlog's CSV columns only; TraceML's own fields are in --json
    assert not (artifacts.parent / ".cache").exists()


def test_warnings_go_to_stderr_and_stdout_stays_parseable(artifacts: Path) -> None:
    envelope(artifacts / "copy", "run-train-42", [])  # a second envelope with the same run_id
    proc = run_traceml("query", "runs", str(artifacts), "--json")
    assert proc.returncode == 0, proc.stderr
    assert {r["run_id"] for r in json.loads(proc.stdout)} == {"job:train-42", "session:solo-session"}
    assert proc.stderr.count("warning:") == 2 and "is also declared by" in proc.stderr
    strict = run_traceml("query", "runs", str(artifacts), "--json", "--strict")
    assert strict.returncode == 1 and strict.stdout == proc.stdout


def test_no_existing_path_exits_1_with_one_line(tmp_path: Path) -> None:
    proc = run_traceml("query", "runs", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert "none of the paths exists" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [
    ["runs", ".", "--json", "--csv"],
    ["runs", ".", "--json", "--jsonl"],
    ["runs", ".", "--rank", "zero"],
    ["runs"],
    ["attachments", ".", "--cache-dir", "x", "--no-cache"],
    ["runs", ".", "--cache-dir", "inside"],
])
def test_bad_usage_exits_2(tmp_path: Path, args: list[str]) -> None:
    proc = run_traceml("query", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_has_an_example() -> None:
    proc = run_traceml("query", "attachments", "--help")
    assert proc.returncode == 0 and "--run-id run-train-42" in proc.stdout
    proc = run_traceml("query", "--help")
    assert proc.returncode == 0 and all(c in proc.stdout for c in ("runs", "attachments", "sessions"))


def test_csv_with_no_matching_row_still_prints_the_header_and_tables_count_in_the_singular(artifacts: Path) -> None:
    proc = run_traceml("query", "runs", str(artifacts), "--csv", "--run-id", "nope", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "run_id,explicit,title,job_id,started_at_ns,ended_at_ns,session_count,attachment_count,source_kind,"
        "source_path,source_namespace,source_ref,sessions,ranks"]  # Stormlog's header of an empty result
    table = run_traceml("query", "runs", str(artifacts), "--run-id", "run-train-42", "--no-cache")
    assert re.search(r"^1 run\s*$", table.stdout, re.MULTILINE), table.stdout


def test_many_warnings_of_one_kind_about_one_file_are_summed_up(tmp_path: Path) -> None:
    envelope(tmp_path, "big", [f"absent-{i}" for i in range(25)])
    proc = run_traceml("query", "runs", str(tmp_path), "--json", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert sum("was not found" in line for line in lines) == 20
    assert lines[-1].endswith("and 5 more warnings of the same kind (session_not_found) about this file "
                              "(--all-warnings prints each)")
    every = run_traceml("query", "runs", str(tmp_path), "--json", "--no-cache", "--all-warnings")
    assert sum("was not found" in line for line in every.stderr.splitlines()) == 25
    assert every.stdout == proc.stdout


def _without_root_powers() -> list[str]:
    """A command prefix under which permission bits apply: nothing for a normal user; for root,
    ``setpriv`` dropping the capabilities that let root read anything (else the test is skipped)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits cannot be tested")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


def test_a_folder_that_cannot_be_read_says_permission_denied(tmp_path: Path) -> None:
    locked = tmp_path / "root" / "locked"
    traceml_session(locked / "run-a", "s-a")
    traceml_session(tmp_path / "root" / "open" / "run-b", "s-b")
    locked.chmod(0)
    try:
        cmd = [*_without_root_powers(), sys.executable, "-m", "traceml_ai", "query", "runs", "--json", "--no-cache"]
        alone = subprocess.run([*cmd, str(locked)], capture_output=True, text=True, timeout=240)
        assert alone.returncode == 1, alone.stderr
        assert f"warning: {locked}: folder cannot be read: Permission denied; skipped" in alone.stderr
        assert f"error: none of the paths could be read: {locked}" in alone.stderr
        beside = subprocess.run([*cmd, str(locked / "run-a"), str(tmp_path / "root" / "open")],
                                capture_output=True, text=True, timeout=240)
        assert beside.returncode == 0, beside.stderr
        assert f"{locked / 'run-a'}: cannot be reached: permission denied on a folder on the way" in beside.stderr
        assert "no such file" not in beside.stderr
        assert [r["run_id"] for r in json.loads(beside.stdout)] == ["session:s-b"]
    finally:
        locked.chmod(0o755)


def test_a_cache_folder_beside_a_file_path_is_bad_usage(tmp_path: Path) -> None:
    """``--cache-dir`` inside the folder of a file PATH would write beside that file: refused, exit 2,
    and nothing is written there."""
    target = tmp_path / "data" / "track_events.jsonl"
    target.parent.mkdir()
    target.write_text("", encoding="utf-8")
    out = subprocess.run([str(Path(sys.executable).parent / "traceml"), "query", "runs", str(target), "--cache-dir",
                          str(tmp_path / "data" / "cache")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "cache folder" in out.stderr and "never writes inside" in out.stderr
    assert sorted(p.name for p in target.parent.iterdir()) == ["track_events.jsonl"]
