"""Export on real training (issue 5, "Done when"): ``traceml run`` of the digits example with the jsonl
exporter on all streams, a custom exporter from a module on PYTHONPATH, and a failing exporter. Real
processes, sockets, SQLite and torch on the CPU; nothing mocked."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceml_ai.aggregator.export.records import RECORD_STREAMS, RECORD_TYPE_BY_STREAM
from traceml_ai.examples import TRAIN_DIGITS
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.sqlite import read_only_uri

pytest.importorskip("torch")
pytest.importorskip("sklearn")

TIMEOUT_S = 600
# Each test trains the digits example for real: past the suite default of 300 s.
pytestmark = pytest.mark.timeout(900)
TABLE_OF = {t.record_stream: t for t in schema.TABLES}

RECORDING_EXPORTER = '''\
import json, threading

class Recording:
    def __init__(self, context):
        self.context = context
        self.file = None
    def open(self):
        self.context.export_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(self.context.export_dir / "recorded.jsonl", "x", encoding="utf-8")
        self.file.write(json.dumps({"context": [str(self.context.session_root), str(self.context.export_dir),
                                                self.context.include_hostname, list(self.context.streams)],
                                    "thread": threading.current_thread().name}) + "\\n")
    def write(self, records):
        for record in records:
            self.file.write(json.dumps(record.to_dict()) + "\\n")
    def flush(self):
        self.file.flush()
    def close(self, *, dropped_batches=0):
        self.file.write(json.dumps({"dropped_batches": dropped_batches}) + "\\n")
        self.file.close()

def make(context):
    return Recording(context)
'''

FAILING_EXPORTER = '''\
print("failing exporter module loaded")  # an exporter's own stdout reaches the user (on stderr)

class Failing:
    def open(self): pass
    def write(self, records): raise OSError(28, "No space left on device")
    def flush(self): pass
    def close(self, *, dropped_batches=0): pass

def make(context):
    return Failing()
'''


def run_digits(tmp_path: Path, name: str, *flags: str, env: dict[str, str] | None = None,
               ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "summary", "--name", name, "--logs-dir",
         str(tmp_path / "runs"), "--interval", "0.2", *flags, str(TRAIN_DIGITS), "--epochs", "1", "--batch-size", "64"],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if f"_{name}_" in p.name]
    return run_dir, proc


def sqlite_rows(run_dir: Path, stream: str) -> list[dict[str, Any]]:
    table = TABLE_OF[stream]
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    try:
        rows = db.execute(f"SELECT {', '.join(table.column_names)} FROM {table.name} ORDER BY id").fetchall()
    finally:
        db.close()
    return [dict(zip(table.column_names, row, strict=True)) for row in rows]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def same_as_rows(records: list[dict[str, Any]], rows: list[dict[str, Any]], *, hostname: bool) -> None:
    """Every record equals its SQLite row in every shared field (the observed stamps are taken apart)."""
    assert len(records) == len(rows)
    for record, row in zip(records, rows, strict=True):
        row = dict(row)
        if "events_json" in row:
            row["events"] = json.loads(row.pop("events_json"))
        if not hostname:
            row.pop("hostname", None)
        assert set(record) == {"stream", "schema_version", *row}
        assert {k: v for k, v in record.items() if k not in ("stream", "schema_version",
                                                               "observed_timestamp_unix_ns")} == \
            {k: v for k, v in row.items() if k != "observed_timestamp_unix_ns"}


def test_jsonl_on_all_streams_writes_all_seven_files_with_correct_closing_lines(tmp_path: Path) -> None:
    run_dir, proc = run_digits(tmp_path, "jsonl", "--exporter", "jsonl", "--export-streams", "all")
    export = run_dir / "aggregator" / "export"
    assert sorted(p.name for p in export.iterdir()) == sorted(f"{s}.jsonl" for s in RECORD_STREAMS)
    for stream in RECORD_STREAMS:
        found = read_lines(export / f"{stream}.jsonl")
        rows = sqlite_rows(run_dir, stream)
        assert found[-1] == {"closing": True, "stream": stream, "written_records": len(rows), "dropped_batches": 0}
        same_as_rows(found[:-1], rows, hostname=False)
        if stream not in ("system_gpu",):  # no GPU on this machine: its file holds only the closing line
            assert rows, stream
    assert len(sqlite_rows(run_dir, "step_time")) == 23  # 1,437 training images, batch 64
    assert not (run_dir / "aggregator" / "finalization_warning.json").exists()
    assert "[TraceML]" not in proc.stderr


def test_a_custom_exporter_from_a_module_on_pythonpath_receives_the_same_records(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "recording_exporter.py").write_text(RECORDING_EXPORTER)
    run_dir, _ = run_digits(tmp_path, "custom", "--exporter", "recording_exporter:make", "--export-streams",
                            "step_time,system,process", "--exporter-hostname", env={"PYTHONPATH": str(site)})
    lines = read_lines(run_dir / "aggregator" / "export" / "recorded.jsonl")
    opened, records, closed = lines[0], lines[1:-1], lines[-1]
    assert opened == {"context": [str(run_dir), str(run_dir / "aggregator" / "export"), True,
                                  ["step_time", "system", "system_gpu", "process"]], "thread": "traceml-export"}
    assert closed == {"dropped_batches": 0}
    assert {r["stream"] for r in records} == {"step_time", "system", "process"}  # no GPU here: no system_gpu
    for stream in ("step_time", "system", "process"):
        mine = [r for r in records if r["stream"] == stream]
        same_as_rows(mine, sqlite_rows(run_dir, stream), hostname=True)
        assert list(mine[0])[2:] == list(RECORD_TYPE_BY_STREAM[stream].COLUMNS)


def test_a_failing_exporter_is_reported_and_harms_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "failing_exporter.py").write_text(FAILING_EXPORTER)
    run_dir, proc = run_digits(tmp_path, "failing", "--exporter", "failing_exporter:make", "--export-streams", "all",
                               env={"PYTHONPATH": str(site)})
    ours = [line for line in proc.stderr.splitlines() if line.startswith("[TraceML] exporter")]
    assert ours == ["[TraceML] exporter 'failing_exporter:make' failed in write: OSError: [Errno 28] No space left "
                    "on device; export stopped, the run goes on (see aggregator/finalization_warning.json)"]
    warning = json.loads((run_dir / "aggregator" / "finalization_warning.json").read_text())
    rows = sum(len(sqlite_rows(run_dir, s)) for s in RECORD_STREAMS)
    export = warning["export"]
    assert export["exporter_failed"] is True and export["written_records"] == 0
    assert any("exporter 'failing_exporter:make' failed" in line for line in warning["summary"])
    assert "failing exporter module loaded" in proc.stderr
    assert export["failed_records"] == export["admitted_records"] == rows
    assert len(sqlite_rows(run_dir, "step_time")) == 23  # telemetry is whole
    summary = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    assert summary["telemetry"]["status"] == "ok" and summary["telemetry"]["rows"]["step_time_samples"] == 23
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["status"] == "completed"
