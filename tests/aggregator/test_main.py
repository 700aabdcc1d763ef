"""``python -m traceml_ai.aggregator`` as the launcher runs it: the listening line, signals, kill -9, errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.wire import SECRET, SESSION, RankClient, step_memory_rows, step_time_rows
from traceml_ai.aggregator.store import open_readonly

LISTENING = re.compile(r"^TRACEML_AGGREGATOR_LISTENING 127\.0\.0\.1 (\d+)$")


class AggregatorProcess:
    def __init__(self, run_dir: Path, *args: str) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
             *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TRACEML_JOB_SECRET": SECRET},
        )
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline().rstrip("\n")
        match = LISTENING.match(self.first_line)
        assert match, (self.first_line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port = int(match.group(1))

    def signal_and_wait(self, signum: int = signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=240)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=240)

    @property
    def db(self) -> Path:
        return self.run_dir / "aggregator" / "telemetry.sqlite"


@pytest.fixture
def started(tmp_path: Path) -> Any:
    procs: list[AggregatorProcess] = []

    def start(*args: str) -> AggregatorProcess:
        procs.append(AggregatorProcess(tmp_path, *args))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()


def count(db: Path, table: str) -> int:
    conn = open_readonly(db)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_gives_a_clean_exit_with_every_row(started: Any, signum: int) -> None:
    agg = started("--world-size", "2")
    for rank in (0, 1):
        client = RankClient(agg.port, rank)
        client.hello()
        for batch in range(5):
            client.send({"step_time": step_time_rows(batch * 20, 20), "step_memory": step_memory_rows(batch * 20, 20)})
        client.finish()
        client.close()
    code, out, err = agg.signal_and_wait(signum)
    assert (code, out, err) == (0, "", "")  # the listening line was the only line on stdout
    assert count(agg.db, "step_time_samples") == 200 and count(agg.db, "step_memory_samples") == 200
    assert not (agg.run_dir / "aggregator" / "finalization_warning.json").exists()


def test_a_rank_that_never_connected_is_reported_at_exit(started: Any) -> None:
    agg = started("--world-size", "3")
    client = RankClient(agg.port, 0, world_size=3)
    client.hello()
    client.send({"step_memory": step_memory_rows(0, 5)})
    client.finish(dropped_batches=2)
    client.close()
    late = RankClient(agg.port, 2, world_size=3)  # connects, sends, never says rank_finished
    late.hello()
    late.send({"step_memory": step_memory_rows(0, 1)})
    time.sleep(0.2)
    code, _, _ = agg.signal_and_wait()
    late.close()
    assert code == 0
    report = json.loads((agg.run_dir / "aggregator" / "finalization_warning.json").read_text())
    assert report["missing_ranks"] == {"never_connected": [1], "never_finished": [2]}
    assert report["dropped_batches"] == {"0": 2}
    assert count(agg.db, "step_memory_samples") == 6


def test_kill_9_mid_ingest_keeps_every_committed_row(started: Any) -> None:
    agg = started()
    stop = threading.Event()

    def send() -> None:
        client = RankClient(agg.port, 0)
        client.hello()
        batch = 0
        try:
            while not stop.is_set():
                client.send({"step_memory": step_memory_rows(batch * 200, 200)})
                batch += 1
        except OSError:
            pass  # the aggregator died under us
        client.close()

    sender = threading.Thread(target=send)
    sender.start()
    committed: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 60
    while len(committed) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
        if agg.db.exists():
            conn = open_readonly(agg.db)
            committed = conn.execute("SELECT id, step, seq FROM step_memory_samples ORDER BY id").fetchall()
            conn.close()
    assert len(committed) >= 2000
    agg.proc.send_signal(signal.SIGKILL)  # while the sender is still sending
    agg.proc.wait(30)
    stop.set()
    sender.join(30)
    assert agg.proc.returncode == -signal.SIGKILL

    conn = open_readonly(agg.db)  # opens read-only right after the crash, as the viewer would
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    after = conn.execute("SELECT id, step, seq FROM step_memory_samples ORDER BY id").fetchall()
    assert after[: len(committed)] == committed
    assert [step for _, step, _ in after] == list(range(len(after)))  # whole flushes only, no gaps
    conn.close()


def test_a_taken_port_is_one_error_line_and_exit_1(started: Any, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(tmp_path), "--session-id", "s",
             "--port", str(port)],
            capture_output=True, text=True, timeout=240, env={**os.environ, "TRACEML_JOB_SECRET": SECRET},
        )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("[TraceML] aggregator: cannot listen on 127.0.0.1:") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--session-id", "s"], 2, "--run-dir"),
    (["--run-dir", "{tmp}", "--session-id", "s", "--world-size", "0"], 2, "not a positive integer"),
    (["--run-dir", "{tmp}/missing", "--session-id", "s"], 1, "does not exist"),
])
def test_bad_arguments_are_one_line(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, "-m", "traceml_ai.aggregator", *argv],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == code and proc.stdout == ""
    assert proc.stderr.startswith("[TraceML] aggregator:") and message in proc.stderr
    assert proc.stderr.count("\n") == 1
