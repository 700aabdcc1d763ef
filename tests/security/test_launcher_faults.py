"""Faults of the processes around the training (issue 12 points 4 and 12): the launcher killed
while the training goes on, and an aggregator shutdown with many connections open."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.aggregator.wire import SECRET, SESSION, RankClient, step_time_rows

TICKS = 40


def test_the_aggregator_outlives_a_killed_launcher_until_the_training_ends(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import time\n"
        f"for n in range({TICKS}):\n"
        "    print(f'tick {n}', flush=True)\n"
        "    time.sleep(0.1)\n"
        "print('training done', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--name", "orphan", "--logs-dir",
         str(tmp_path / "runs"), "--interval", "0.1", str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert launcher.stdout is not None
    for line in launcher.stdout:
        if line.startswith("tick 3"):
            break
    launcher.kill()  # SIGKILL: no chance to stop anything
    launcher.wait(timeout=30)
    (run_dir,) = list((tmp_path / "runs").iterdir())
    summary = run_dir / "aggregator" / "final_summary.json"
    deadline = time.monotonic() + 180
    while not summary.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert summary.exists(), "the aggregator never finalized"
    # It waited for the training: the last lines the training printed after the kill are stored.
    log = (run_dir / "aggregator" / "rank_0.log").read_text()
    assert f"tick {TICKS - 1}" in log and "training done" in log
    warning = json.loads((run_dir / "aggregator" / "finalization_warning.json").read_text())
    block = warning["launcher"]
    assert block["launcher_gone_at_unix_ns"] > 0 and block["waited_for_ranks_s"] > 0
    assert any("launcher died" in line for line in warning["summary"])
    manifest = json.loads((run_dir / "aggregator" / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and "launcher died" in manifest["telemetry"]["reason"]


def test_an_aggregator_shutdown_with_many_open_connections_prints_no_traceback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TRACEML_JOB_SECRET": SECRET},
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[2])
    clients = []
    for rank in range(40):  # admitted ranks, some inside a frame
        client = RankClient(port, rank, world_size=40)
        client.hello()
        client.send({"step_time": step_time_rows(0, 2)})
        if rank % 2:
            client.send_raw((1 << 20).to_bytes(4, "big") + b"\x90" * 1000)
        clients.append(client)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]  # waiting for a hello
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert "Traceback" not in err and "CancelledError" not in err, err[:2000]
    for sock in idle:
        sock.close()


def test_after_an_aggregator_sigkill_the_ranks_undelivered_batches_are_in_the_warning_file(tmp_path: Path) -> None:
    import psutil

    script = tmp_path / "train.py"
    script.write_text(
        "import time\n"
        f"for n in range({TICKS}):\n"
        "    print(f'tick {n}', flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--name", "agg-killed", "--logs-dir",
         str(tmp_path / "runs"), "--interval", "0.05", str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert launcher.stdout is not None
    for line in launcher.stdout:
        if line.startswith("tick 3"):
            break
    (aggregator,) = [p for p in psutil.Process(launcher.pid).children()
                     if "traceml_ai.aggregator" in (p.cmdline() or [])]
    aggregator.kill()
    _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    assert "telemetry batches were not delivered" in err  # the rank's own line, as before
    (run_dir,) = list((tmp_path / "runs").iterdir())
    warning = json.loads((run_dir / "aggregator" / "finalization_warning.json").read_text())
    assert warning["undelivered_batches"]["0"] > 0
    assert warning["aggregator_died"]["rank_reports"]["0"]["submitted_batches"] >= warning["undelivered_batches"]["0"]
    assert any(line.startswith("the telemetry aggregator died") for line in warning["summary"])
    assert any(line.startswith("rank 0: ") and "not delivered" in line for line in warning["summary"])
