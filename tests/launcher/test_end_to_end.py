"""``traceml run`` on real training (issue: capture, items 4, 8 and 9): the digits example with 1
and 2 processes, the planted bottleneck suite, ``watch``, ``serve``, and telemetry faults. Real
processes, sockets, SQLite and torch on the CPU; nothing mocked."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from traceml_ai.examples import TRAIN_DIGITS
from traceml_ai.telemetry.schema import TABLES
from traceml_ai.telemetry.sqlite import read_only_uri

pytest.importorskip("torch")
pytest.importorskip("sklearn")

TIMEOUT_S = 600
# Each test trains or launches for real, some more than once: past the suite default of 300 s.
pytestmark = pytest.mark.timeout(1200)


def traceml(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceml_ai", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def run_digits(tmp_path: Path, name: str, *script_args: str, nproc: int = 1, interval: str = "0.2",
               expect_code: int = 0) -> Path:
    proc = traceml("run", "--mode", "summary", "--name", name, "--logs-dir", str(tmp_path / "runs"),
                   "--interval", interval, "--nproc-per-node", str(nproc), str(TRAIN_DIGITS), *script_args,
                   cwd=tmp_path)
    assert proc.returncode == expect_code, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if f"_{name}_" in p.name]
    return run_dir


def table_counts(run_dir: Path) -> dict[str, int]:
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    try:
        return {t.name: db.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()[0] for t in TABLES}
    finally:
        db.close()


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "aggregator" / "final_summary.json").read_text())


def serious(doc: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in doc["findings"] if f["severity"] in ("warning", "critical")]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# -- real input: 1 and 2 processes -----------------------------------------------------------------


def test_one_process_fills_every_table_but_gpu_and_is_healthy(tmp_path: Path) -> None:
    run_dir = run_digits(tmp_path, "single", "--epochs", "2", "--batch-size", "8")
    counts = table_counts(run_dir)
    assert counts.pop("system_gpu_samples") == 0  # no GPU here
    assert all(n > 0 for n in counts.values()), counts
    assert counts["step_time_samples"] == 2 * 180  # 1,437 training images, batch 8: 180 steps per epoch
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    devices = {r[0] for r in db.execute("SELECT DISTINCT device FROM step_memory_samples")}
    peaks = db.execute("SELECT COUNT(*) FROM step_memory_samples WHERE peak_alloc_bytes IS NOT NULL").fetchone()[0]
    assert devices == {"cpu"} and peaks == 0  # on the CPU: device cpu, null peaks
    # the script's own logger wrote into the launched folder; the launcher kept its labels
    meta = read_json(run_dir / "run.json")
    assert meta["status"] == "completed" and meta["launcher"]["mode"] == "run"
    assert "val/acc" in (run_dir / "metrics.jsonl").read_text()
    assert read_json(run_dir / "aggregator" / "manifest.json")["status"] == "completed"
    assert "epoch 1:" in (run_dir / "aggregator" / "rank_0.log").read_text()
    doc = summary(run_dir)
    assert serious(doc) == [], doc["findings"]
    assert not (run_dir / "aggregator" / "finalization_warning.json").exists()


def test_two_processes_with_gloo_report_both_ranks(tmp_path: Path) -> None:
    run_dir = run_digits(tmp_path, "ddp", "--epochs", "2", nproc=2)
    counts = table_counts(run_dir)
    assert counts.pop("system_gpu_samples") == 0
    assert all(n > 0 for n in counts.values()), counts
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    ranks = {r[0] for r in db.execute("SELECT DISTINCT global_rank FROM step_time_samples")}
    strategies = {r[0] for r in db.execute("SELECT training_strategy FROM runtime_environment")}
    assert ranks == {0, 1} and "DDP" in strategies
    doc = summary(run_dir)
    assert doc["ranks"]["seen"] == [0, 1]
    assert "straggler" not in serious(doc), doc["findings"]


# -- the planted bottleneck suite --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plant", "args", "nproc", "interval", "kind"),
    [
        ("input_stall", ("--epochs", "1"), 1, "0.2", "input_bound"),
        ("optimizer_heavy", ("--epochs", "1"), 1, "0.2", "optimizer_bound"),
        ("memory_creep", ("--epochs", "3", "--batch-size", "8"), 1, "0.1", "memory_creep"),
        ("straggler", ("--epochs", "1"), 2, "0.2", "straggler"),
    ],
)
def test_a_planted_bottleneck_is_diagnosed_first(
    tmp_path: Path, plant: str, args: tuple[str, ...], nproc: int, interval: str, kind: str
) -> None:
    run_dir = run_digits(tmp_path, plant, "--plant", plant, *args, nproc=nproc, interval=interval)
    doc = summary(run_dir)
    assert doc["findings"], doc
    assert doc["findings"][0]["kind"] == kind, doc["findings"]
    assert doc["findings"][0]["severity"] in ("warning", "critical")


# -- watch, serve, disable ---------------------------------------------------------------------------


def test_watch_needs_no_code_change_and_records_no_steps(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n")
    proc = traceml("watch", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"), "--interval", "0.1",
                   str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tick 2" in proc.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    counts = table_counts(run_dir)
    assert counts["step_time_samples"] == 0
    assert counts["system_samples"] > 0 and counts["process_samples"] > 0
    assert counts["runtime_environment"] > 0 and counts["stdout_stderr_samples"] == 3
    assert read_json(run_dir / "run.json")["launcher"]["mode"] == "watch"


def test_serve_collects_a_script_that_calls_init(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "serve", "--name", "served", "--logs-dir", str(tmp_path / "runs"),
         "--world-size", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        env: dict[str, str] = {}
        assert server.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in server.stdout], daemon=True).start()  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while len(env) < 4 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line.strip().startswith("export "):
                key, value = line.strip()[len("export "):].split("=", 1)
                env[key] = value
        assert set(env) == {"TRACEML_AGGREGATOR", "TRACEML_SESSION_ID", "TRACEML_JOB_SECRET", "TRACEML_RUN_DIR"}
        script = tmp_path / "own.py"
        script.write_text(
            "import traceml_ai\n"
            "session = traceml_ai.init(interval=0.1)\n"
            "assert session is not None\n"
            "print('hello from a served script')\n"
        )
        child = subprocess.run([sys.executable, str(script)], env={**os.environ, **env}, capture_output=True,
                               text=True, timeout=240)
        assert child.returncode == 0, child.stderr
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=240)
    assert server.returncode == 0, server.stderr.read() if server.stderr else ""
    run_dir = Path(env["TRACEML_RUN_DIR"])
    assert table_counts(run_dir)["stdout_stderr_samples"] == 1
    assert read_json(run_dir / "run.json")["status"] == "completed"
    assert (run_dir / "aggregator" / "final_summary.json").exists()


def test_disable_traceml_runs_the_script_plainly_with_its_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import sys\nprint('plain')\nsys.exit(7)\n")
    proc = traceml("run", "--disable-traceml", "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert proc.returncode == 7 and proc.stdout == "plain\n"
    assert not (tmp_path / "runs").exists()


def test_a_missing_script_is_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = traceml("run", "--logs-dir", str(tmp_path / "runs"), "nope.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: no such training script: nope.py"


# -- faults ------------------------------------------------------------------------------------------

KILL_AGGREGATOR = '''
import os, signal, sys, time
import psutil
port = int(os.environ["TRACEML_AGGREGATOR"].rsplit(":", 1)[1])
for i in range(6):
    print("step", i, flush=True)
    if i == 2:
        for proc in psutil.process_iter(["cmdline"]):
            if "traceml_ai.aggregator" in " ".join(proc.info["cmdline"] or []):
                if any(c.laddr.port == port for c in proc.net_connections(kind="tcp")):
                    proc.send_signal(signal.SIGKILL)
    time.sleep(0.3)
sys.exit(5)
'''


def test_training_outlives_a_killed_aggregator_with_its_own_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "kill_agg.py"
    script.write_text(KILL_AGGREGATOR)
    proc = traceml("run", "--mode", "summary", "--logs-dir", str(tmp_path / "runs"), "--interval", "0.1",
                   str(script), cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "step 5" in proc.stdout  # the training ran to its end
    assert "telemetry degraded" in proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = read_json(run_dir / "run.json")
    assert meta["status"] == "failed" and meta["exit"]["code"] == 5
    assert meta["telemetry"]["status"] == "degraded"
    assert read_json(run_dir / "aggregator" / "manifest.json")["status"] == "incomplete"
    # the rank's own account of what it lost is a run file like the others: 0666 less the umask, not 0600
    umask = os.umask(0)
    os.umask(umask)
    losses = list((run_dir / "aggregator" / "rank_losses").glob("*.json"))
    assert losses and {p.stat().st_mode & 0o777 for p in losses} == {0o666 & ~umask}
    # every committed row survived the kill -9
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # the launcher writes the verdict the dead aggregator could not, marked as partial
    doc = summary(run_dir)
    assert doc["telemetry"]["status"] == "degraded"
    assert "exited with code" in doc["telemetry"]["detail"]
    shown = traceml("summary", str(run_dir), cwd=tmp_path, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "partial telemetry" in shown.stdout and "no bottleneck found" not in shown.stdout.replace(
        "no bottleneck found in that part", "")


def test_a_training_that_raises_is_failed_and_its_session_did_not_complete(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    proc = traceml("run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = read_json(run_dir / "run.json")
    assert meta["status"] == "failed" and meta["exit"]["error_type"] == "RuntimeError"
    manifest = read_json(run_dir / "aggregator" / "manifest.json")
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 1


def test_a_training_that_segfaults_is_failed_with_its_signal(tmp_path: Path) -> None:
    script = tmp_path / "segv.py"
    script.write_text("import os, signal\nprint('about to crash', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    proc = traceml("run", "--mode", "summary", "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = read_json(run_dir / "run.json")
    assert meta["status"] == "failed"
    assert meta["exit"]["signal"] == "SIGSEGV" and meta["exit"]["error_type"] == "Signal"
    # the session did not run to its end (the catalog lists it so, not as completed)
    assert read_json(run_dir / "aggregator" / "manifest.json")["status"] == "interrupted"


FLOOD_OUTPUT = '''
import sys
for i in range(30_000):
    print("line", i)
sys.stdout.flush()
'''


def test_stdout_lines_dropped_by_a_full_buffer_are_reported_in_the_finalization_warning(tmp_path: Path) -> None:
    """A rank that prints faster than its sampler collects drops the oldest lines (the user still sees
    all of them on the terminal); the count reaches finalization_warning.json, not only stderr."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD_OUTPUT)
    proc = traceml("run", "--mode", "summary", "--logs-dir", str(tmp_path / "runs"), "--interval", "30",
                   str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\nline ") + proc.stdout.startswith("line ") == 30_000  # the terminal got every line
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = read_json(run_dir / "aggregator" / "finalization_warning.json")
    dropped = report["dropped_output_lines"]["0"]
    assert 0 < dropped <= 20_000
    assert any("stdout/stderr lines" in line for line in report["summary"])
    assert report["ranks"]["0"]["dropped_output_lines"] == dropped
    # what was kept is the newest part of the output
    (log,) = (run_dir / "aggregator").glob("rank_0*.log")
    assert "stdout | line 29999" in log.read_text()


def test_an_unreachable_aggregator_leaves_training_alone_and_counts_losses(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('trained')\nsys.exit(0)\n")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TRACEML_AGGREGATOR": f"127.0.0.1:{port}", "TRACEML_SESSION_ID": "x",
           "TRACEML_INTERVAL": "0.1"}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    proc = subprocess.run([sys.executable, "-m", "traceml_ai.capture.bootstrap", str(script)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == plain.returncode == 0
    assert proc.stdout == plain.stdout == "trained\n"
    assert re.search(r"\[TraceML\] \d+ of \d+ telemetry batches were not delivered", proc.stderr), proc.stderr


def test_ctrl_c_stops_the_training_and_marks_the_run_killed(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"),
         str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    assert launcher.stdout is not None
    assert launcher.stdout.readline().strip() == "started"
    os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl+C in a terminal does
    launcher.communicate(timeout=240)
    assert launcher.returncode == 130
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert read_json(run_dir / "run.json")["status"] == "killed"
    assert read_json(run_dir / "aggregator" / "manifest.json")["status"] == "interrupted"


@pytest.mark.timeout(300)
def test_ctrl_c_of_two_ranks_prints_no_traceback(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text("import os, time\nos.write(1, f\"rank {os.environ['RANK']} up\\n\".encode())\n"
                      "while True:\n    time.sleep(0.1)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"),
         "--nproc-per-node", "2", str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert launcher.stdout is not None
    up = {launcher.stdout.readline().strip(), launcher.stdout.readline().strip()}
    assert up == {"rank 0 up", "rank 1 up"}
    os.killpg(launcher.pid, signal.SIGINT)  # Ctrl+C reaches the launcher, torchrun and both ranks
    _, errors = launcher.communicate(timeout=240)
    assert launcher.returncode == 130
    assert "Traceback" not in errors and "KeyboardInterrupt\n" not in errors, errors
    assert "[TraceML] the ranks were stopped by SIGINT" in errors
    assert "[TraceML] rank 0 stopped by Ctrl+C" in errors and "[TraceML] rank 1 stopped by Ctrl+C" in errors
    assert "closing signal" not in errors  # torchrun's own warnings stay below ERROR
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert read_json(run_dir / "run.json")["status"] == "killed"


def test_two_nodes_report_to_the_aggregator_on_node_0(tmp_path: Path) -> None:
    """Two launchers, as on two machines (here both on 127.0.0.1): node 1 creates no run folder and
    its rank reports to the aggregator that node 0 started on master_port + 1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["run", "--mode", "quiet", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--interval", "0.2"]
    # Both nodes derive the job secret from the user's key in the (shared) home folder.
    home = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    node1 = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", *common, "--node-rank", "1", "--logs-dir", str(tmp_path / "node1"),
         str(TRAIN_DIGITS), "--epochs", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in {**os.environ, **home}.items() if k != "TRACEML_JOB_SECRET"},
    )
    node0 = traceml(*common, "--node-rank", "0", "--logs-dir", str(tmp_path / "node0"), str(TRAIN_DIGITS),
                    "--epochs", "1", cwd=tmp_path, env=home)
    if node0.returncode != 0:  # node 1 would wait at the rendezvous for torchrun's own timeout
        node1.kill()
        node1.communicate()
    assert node0.returncode == 0, node0.stderr[-3000:]
    _, err1 = node1.communicate(timeout=TIMEOUT_S)
    assert node1.returncode == 0, err1[-3000:]
    assert not (tmp_path / "node1").exists()
    (run_dir,) = (tmp_path / "node0").iterdir()
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    ranks = dict(db.execute("SELECT global_rank, node_rank FROM step_time_samples GROUP BY global_rank"))
    assert ranks == {0: 0, 1: 1}
    assert read_json(run_dir / "aggregator" / "manifest.json")["world_size"] == 2
    assert not (run_dir / "aggregator" / "finalization_warning.json").exists()


def test_a_killed_launcher_leaves_no_aggregator_behind(tmp_path: Path) -> None:
    """kill -9 of `traceml run` (an OOM kill, a scheduler): its aggregator notices and finishes."""
    import psutil

    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(3)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"),
         str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )
    assert launcher.stdout is not None and launcher.stdout.readline().strip() == "started"
    aggregators = [p for p in psutil.Process(launcher.pid).children()
                   if "traceml_ai.aggregator" in " ".join(p.cmdline())]
    assert len(aggregators) == 1
    launcher.kill()
    launcher.wait(timeout=240)
    aggregators[0].wait(timeout=240)  # raises psutil.TimeoutExpired if it lingers
    (run_dir,) = (tmp_path / "runs").iterdir()
    deadline = time.monotonic() + 30
    while not (run_dir / "aggregator" / "final_summary.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run_dir / "aggregator" / "final_summary.json").exists()


@pytest.mark.parametrize("flags", [("--interval", "0.000001"), ("--nproc-per-node", "0"), ("--master-port", "0"),
                                   ("--name", ".."), ("--name", "a/b")])
def test_a_bad_flag_value_is_one_line_and_exit_2(tmp_path: Path, flags: tuple[str, str]) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('never')\n")
    proc = traceml("run", *flags, "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and flags[0] in proc.stderr
    assert "never" not in proc.stdout and not (tmp_path / "runs").exists()
