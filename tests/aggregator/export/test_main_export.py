"""``python -m traceml_ai.aggregator --exporter ...``: the export worker inside the real aggregator process
(000 seed "Custom exporters" and "Stream selection"; DESIGN §3.2 finalization, §3.4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.export.sample import SESSION, full_tables
from tests.aggregator.test_main import LISTENING
from tests.aggregator.wire import SECRET, RankClient
from traceml_ai.aggregator.store import open_readonly
from traceml_ai.telemetry import schema

SUPPORTED = "supported names: step_time, step_memory, process, system, all"


class Aggregator:
    def __init__(self, run_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
             "--world-size", "2", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TRACEML_JOB_SECRET": SECRET, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().rstrip("\n")
        match = LISTENING.match(line)
        assert match, (line, self.proc.communicate(timeout=240) if self.proc.poll() is not None else "")
        self.port = int(match.group(1))

    def feed(self, frames_per_rank: int = 3) -> None:
        """Two ranks, each sending ``frames_per_rank`` frames that fill all seven tables."""
        for rank in (0, 1):
            client = RankClient(self.port, rank, session_id=SESSION)
            assert client.hello()["control"] == "welcome"
            for frame in range(frames_per_rank):
                client.send(full_tables(rank, first_step=2 * frame))
            client.finish()
            client.close()

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _out, err = self.proc.communicate(timeout=240)
        return self.proc.returncode, err

    def file(self, name: str) -> Path:
        return self.run_dir / "aggregator" / name

    def table_counts(self) -> dict[str, int]:
        conn = open_readonly(self.file("telemetry.sqlite"))
        try:
            return {t.record_stream: conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0]
                    for t in schema.TABLES}
        finally:
            conn.close()


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def without_time(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "generated_at"}


def test_jsonl_on_all_streams_writes_one_file_per_stream_matching_the_sqlite_rows(tmp_path: Path) -> None:
    agg = Aggregator(tmp_path / "run", "--exporter", "jsonl", "--export-streams", "all")
    agg.feed()
    code, err = agg.stop()
    assert code == 0, err
    counts = agg.table_counts()
    for stream, rows in counts.items():
        found = read_lines(agg.file(f"export/{stream}.jsonl"))
        assert rows > 0 and len(found) == rows + 1, stream
        assert found[-1] == {"closing": True, "stream": stream, "written_records": rows, "dropped_batches": 0}
        assert all("hostname" not in line for line in found)
    assert not agg.file("finalization_warning.json").exists()  # nothing was lost
    assert agg.file("final_summary.json").exists() and "[TraceML]" not in err


def test_the_default_stream_selection_exports_step_time_only_and_hostname_on_request(tmp_path: Path) -> None:
    agg = Aggregator(tmp_path / "run", "--exporter", "jsonl", "--exporter-hostname")
    agg.feed(1)
    assert agg.stop()[0] == 0
    assert sorted(p.name for p in agg.file("export").iterdir()) == ["step_time.jsonl"]
    assert {line.get("hostname") for line in read_lines(agg.file("export/step_time.jsonl"))[:-1]} == {"node-a"}


def test_without_an_exporter_nothing_is_exported_and_export_streams_is_not_checked(tmp_path: Path) -> None:
    agg = Aggregator(tmp_path / "run", "--export-streams", "nonsense")
    agg.feed(1)
    assert agg.stop()[0] == 0
    assert not agg.file("export").exists()


def test_a_failing_exporter_is_logged_once_reported_and_harms_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "flaky_sink.py").write_text(
        "class Sink:\n"
        "    def open(self): pass\n"
        "    def write(self, records): raise ConnectionError('collector refused the batch')\n"
        "    def flush(self): pass\n"
        "    def close(self, *, dropped_batches=0): pass\n"
        "def make(context):\n"
        "    return Sink()\n"
    )
    plain = Aggregator(tmp_path / "plain")
    plain.feed()
    assert plain.stop()[0] == 0
    agg = Aggregator(tmp_path / "run", "--exporter", "flaky_sink:make", "--export-streams", "step_time,system",
                     env={"PYTHONPATH": str(site)})
    agg.feed()
    code, err = agg.stop()
    assert code == 0
    failures = [line for line in err.splitlines() if "flaky_sink:make" in line]
    assert failures == ["[TraceML] exporter 'flaky_sink:make' failed in write: ConnectionError: collector refused "
                        "the batch; export stopped, the run goes on (see aggregator/finalization_warning.json)"]
    warning = json.loads(agg.file("finalization_warning.json").read_text())
    counts = agg.table_counts()
    admitted = counts["step_time"] + counts["system"] + counts["system_gpu"]
    assert warning["export"] == {
        "exporter": "flaky_sink:make", "streams": ["step_time", "system", "system_gpu"], "exporter_failed": True,
        "failure": "write: ConnectionError: collector refused the batch", "admitted_records": admitted,
        "written_records": 0, "failed_records": admitted, "dropped_batches": 0, "skipped": 0,
    }
    assert counts == plain.table_counts()  # every row still reached SQLite
    ours = without_time(json.loads(agg.file("final_summary.json").read_text()))
    theirs = without_time(json.loads(plain.file("final_summary.json").read_text()))
    assert ours == theirs  # final_summary.json is unchanged by the exporter's failure


def test_a_factory_that_cannot_be_imported_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    agg = Aggregator(tmp_path / "run", "--exporter", "not_installed_anywhere:make")
    agg.feed(1)
    code, err = agg.stop()
    assert code == 0 and agg.table_counts()["step_time"] == 4
    assert err.count("[TraceML] exporter 'not_installed_anywhere:make' failed in factory: cannot import") == 1
    export = json.loads(agg.file("finalization_warning.json").read_text())["export"]
    assert export["exporter_failed"] is True and export["failed_records"] == export["admitted_records"] == 4


INTERRUPTING = {
    "factory": ("def make(context):\n    raise KeyboardInterrupt\n",
                "factory: interrupting:make(context) raised KeyboardInterrupt"),
    "write": ("class Sink:\n"
              "    def open(self): pass\n"
              "    def write(self, records): raise KeyboardInterrupt\n"
              "    def flush(self): pass\n"
              "    def close(self, *, dropped_batches=0): pass\n"
              "def make(context):\n"
              "    return Sink()\n", "write: KeyboardInterrupt"),
}


@pytest.mark.parametrize("where", list(INTERRUPTING))
def test_a_keyboard_interrupt_raised_by_the_factory_or_an_exporter_method_is_an_export_failure_not_a_crash(
    tmp_path: Path, where: str,
) -> None:
    """A KeyboardInterrupt the exporter code raises (not the user's Ctrl+C) is treated like any other
    exception: one [TraceML] line, the aggregator keeps listening, SQLite and the summary are written."""
    source, failure = INTERRUPTING[where]
    site = tmp_path / "site"
    site.mkdir()
    (site / "interrupting.py").write_text(source)
    agg = Aggregator(tmp_path / "run", "--exporter", "interrupting:make", env={"PYTHONPATH": str(site)})
    agg.feed(1)
    code, err = agg.stop()
    assert code == 0 and "Traceback" not in err, err
    method, message = failure.split(": ", 1)
    assert [line for line in err.splitlines() if "interrupting:make" in line] == [
        f"[TraceML] exporter 'interrupting:make' failed in {method}: {message}; export stopped, the run goes on "
        "(see aggregator/finalization_warning.json)"]
    assert agg.table_counts()["step_time"] == 4 and agg.file("final_summary.json").exists()
    export = json.loads(agg.file("finalization_warning.json").read_text())["export"]
    assert export["exporter_failed"] is True and export["failure"] == failure
    assert export["failed_records"] == export["admitted_records"] == 4


@pytest.mark.parametrize(("args", "message"), [
    (["--exporter", "jsonl", "--export-streams", "gpu"], f"export_streams 'gpu' has unknown name 'gpu'; {SUPPORTED}"),
    (["--exporter", "jsonl", "--export-streams", ""], f"export_streams '' names no stream; {SUPPORTED}"),
    (["--exporter", "exporters.py"], "exporter 'exporters.py' is not jsonl, otlp or module:factory"),
])
def test_with_an_exporter_a_bad_value_stops_the_aggregator_with_exit_2_and_one_line(
    tmp_path: Path, args: list[str], message: str,
) -> None:
    proc = subprocess.run([sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(tmp_path),
                           "--session-id", SESSION, *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TRACEML_JOB_SECRET": SECRET})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"[TraceML] aggregator: {message}") and proc.stderr.count("\n") == 1


def test_the_launched_aggregator_imports_an_exporter_from_pythonpath_but_not_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from traceml_ai.launcher.aggregator_process import AggregatorProcess

    site = tmp_path / "site"
    site.mkdir()
    source = "class E:\n    def open(self): pass\n    def write(self, records): pass\n    def flush(self): pass\n" \
             "    def close(self, *, dropped_batches=0): pass\ndef make(context):\n    return E()\n"
    (site / "site_exporter.py").write_text(source)
    work = tmp_path / "work"
    work.mkdir()
    (work / "cwd_exporter.py").write_text(source)
    monkeypatch.chdir(work)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("TRACEML_JOB_SECRET", SECRET)
    for name, found in (("site_exporter", True), ("cwd_exporter", False)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        agg = AggregatorProcess(run_dir, SESSION, secret=SECRET, exporter=f"{name}:make", export_streams="all")
        client = RankClient(agg.port, 0, session_id=SESSION, world_size=1)
        assert client.hello()["control"] == "welcome"
        client.send(full_tables(0))
        client.finish()
        client.close()
        assert agg.stop() == 0
        warning = run_dir / "aggregator" / "finalization_warning.json"
        if found:
            assert not warning.exists(), warning.read_text()
        else:
            export = json.loads(warning.read_text())["export"]
            assert export["exporter_failed"] is True
            assert export["failure"].startswith("factory: cannot import cwd_exporter: ModuleNotFoundError")
