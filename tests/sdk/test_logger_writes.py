"""The Run logger's writes off the training thread, what reaches the disk on every way out, a full or
read-only disk, and DDP ranks (issue 14 items 6, 11, 12; issue 12 item 9). Real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_traceml

HEAD = """
import os, sys, time
import traceml_ai
runs_dir = sys.argv[1]
N = int(sys.argv[2])
"""

LOG_N = """
run = traceml_ai.Run(runs_dir, "fast", best={"loss": "min"})
for i in range(N):
    run.log(i, {"loss": 1.0 / (i + 1), "acc": i / N})
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_") and k != "RANK"}
    env.update(extra or {})
    return env


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(HEAD + textwrap.dedent(body))
    return script


def _run(tmp_path: Path, body: str, n: int, env: dict[str, str] | None = None,
         runs: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(_script(tmp_path, body)), str(runs or tmp_path / "runs"), str(n)],
                          capture_output=True, text=True, timeout=120, env=_env(env))


def _folder(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _assert_everything_written(run: Path, n: int) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(n))
    metrics = _json(run / "metrics.json")
    assert metrics["step"] == n - 1
    assert metrics["last"]["loss"] == pytest.approx(1.0 / n)
    assert metrics["best"]["loss"]["step"] == n - 1


@pytest.mark.parametrize("ending, status, code", [
    ("run.finish()", "completed", 0),
    ("raise RuntimeError('diverged')", "failed", 1),  # no finish(): the excepthook marks it failed at exit
    ("sys.exit(0)", "completed", 0),  # no finish(): the exit hook knows the code
    ("pass", "running", 0),  # a plain end: the exit code is unknown at exit, left running (shown stale)
])
def test_every_row_reaches_the_files_on_the_way_out(tmp_path: Path, ending: str, status: str, code: int) -> None:
    proc = _run(tmp_path, LOG_N + ending + "\n", 3000)
    assert proc.returncode == code, proc.stderr
    run = _folder(tmp_path / "runs")
    _assert_everything_written(run, 3000)
    assert _json(run / "run.json")["status"] == status


def test_every_row_reaches_the_files_when_the_block_fails(tmp_path: Path) -> None:
    proc = _run(tmp_path, """
        with traceml_ai.Run(runs_dir, "fast", best={"loss": "min"}) as run:
            for i in range(N):
                run.log(i, {"loss": 1.0 / (i + 1)})
            raise ValueError("diverged")
    """, 2000)
    assert proc.returncode == 1 and "diverged" in proc.stderr
    run = _folder(tmp_path / "runs")
    _assert_everything_written(run, 2000)
    assert _json(run / "run.json")["status"] == "failed"


def test_every_row_reaches_the_files_on_sigterm(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        with traceml_ai.Run(runs_dir, "fast", best={"loss": "min"}) as run:
            for i in range(N):
                run.log(i, {"loss": 1.0 / (i + 1)})
            print("logged", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "2500"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "logged"
    proc.send_signal(signal.SIGTERM)  # well inside the one second metrics.json may lag behind
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    run = _folder(tmp_path / "runs")
    _assert_everything_written(run, 2500)
    assert _json(run / "run.json")["status"] == "killed"


def test_metrics_json_follows_a_live_run_within_seconds(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        with traceml_ai.Run(runs_dir, "live", best={"loss": "min"}) as run:
            for i in range(N):
                run.log(i, {"loss": 1.0 / (i + 1)})
            print("logged", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "10"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "logged"
        run = _folder(tmp_path / "runs")
        deadline = time.time() + 20
        while time.time() < deadline and _json(run / "metrics.json")["step"] != 9:
            time.sleep(0.1)
        assert _json(run / "metrics.json")["step"] == 9
        assert (run / "metrics.jsonl").read_text().count("\n") == 10  # lines are there at once
    finally:
        proc.kill()
        proc.wait()


def test_run_name_with_spaces_gets_a_slug_folder_and_keeps_its_name(tmp_path: Path) -> None:
    proc = _run(tmp_path, """
        with traceml_ai.Run(runs_dir, "lr sweep (2)") as run:
            run.log(0, {"loss": 1.0})
    """, 0)
    assert proc.returncode == 0, proc.stderr
    run = _folder(tmp_path / "runs")
    assert "_lr-sweep-2_" in run.name and " " not in run.name
    assert _json(run / "run.json")["name"] == "lr sweep (2)"


# -- a full or read-only disk never stops the training -------------------------------------------


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_counted_and_warned_once_and_training_goes_on(tmp_path: Path, small_disk: Path) -> None:
    proc = _run(tmp_path, """
        with traceml_ai.Run(runs_dir, "full") as run:
            for i in range(N):
                run.log(i, {f"m{j}": float(i) for j in range(50)})
        print("training finished", run.write_errors, flush=True)
    """, 3000, runs=small_disk / "runs")
    assert proc.returncode == 0, proc.stderr  # the script's own exit code
    assert proc.stdout.startswith("training finished")
    assert int(proc.stdout.split()[-1]) > 0
    assert proc.stderr.count("[TraceML] cannot write the run folder") == 1
    assert "No space left on device" in proc.stderr
    run = _folder(small_disk / "runs")
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line)["m0"] == i for i, line in enumerate(lines[:-1]))  # whole rows


def test_a_read_only_run_folder_never_raises(tmp_path: Path, small_disk: Path) -> None:
    folder = small_disk / "runs" / "20261130-101500_ro_a3f9"
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    proc = _run(tmp_path, """
        with traceml_ai.Run(runs_dir, "ro") as run:
            for i in range(N):
                run.log(i, {"loss": 1.0})
        print("done", run.write_errors)
    """, 100, env={"TRACEML_RUN_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "done" and int(proc.stdout.split()[1]) > 0
    assert proc.stderr.count("[TraceML]") == 1 and "Read-only file system" in proc.stderr


# -- DDP ranks ------------------------------------------------------------------------------------


def test_only_global_rank_zero_writes_by_default(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "20261130-101500_ddp_a3f9"
    folder.mkdir(parents=True)
    body = """
        with traceml_ai.Run(runs_dir, "ddp") as run:
            for i in range(N):
                run.log(i, {"loss": float(os.environ["RANK"])})
        print(run.active)
    """
    for rank in ("1", "0", "2"):
        proc = _run(tmp_path, body, 5, env={"TRACEML_RUN_DIR": str(folder), "RANK": rank})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(rank == "0")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [0.0] * 5  # rank 0's rows only
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("metrics")) == ["metrics.json",
                                                                                        "metrics.jsonl"]
    assert _json(folder / "run.json")["status"] == "completed"


def test_a_rank_opts_in_to_its_own_metrics_file(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "20261130-101500_ddp_a3f9"
    folder.mkdir(parents=True)
    body = """
        with traceml_ai.Run(runs_dir, "ddp", all_ranks=True if os.environ.get("OPT") == "arg" else None) as run:
            for i in range(N):
                run.log(i, {"loss": float(os.environ["RANK"])})
    """
    for rank, how in (("0", ""), ("1", "arg"), ("2", "env")):
        env = {"TRACEML_RUN_DIR": str(folder), "RANK": rank, "OPT": how}
        if how == "env":
            env["TRACEML_LOG_ALL_RANKS"] = "1"
        proc = _run(tmp_path, body, 3, env=env)
        assert proc.returncode == 0, proc.stderr
    for rank in (1, 2):
        rows = [json.loads(line) for line in (folder / f"metrics.rank{rank}.jsonl").read_text().splitlines()]
        assert [r["loss"] for r in rows] == [float(rank)] * 3
    assert {json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()} == {0.0}
    assert _json(folder / "run.json")["status"] == "completed"
    # The ranks' own histories are the run's files, not Stormlog telemetry: the catalog neither
    # lists them as sessions nor warns about them (issue 14 review: a ⚠ for metrics.rank1.jsonl).
    query = run_traceml("query", "sessions", str(tmp_path / "runs"), "--json", "--no-cache")
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout) == [] and "metrics.rank" not in query.stderr, query.stderr


def test_a_second_process_writing_the_same_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "20261130-101500_ddp_a3f9"
    folder.mkdir(parents=True)
    script = _script(tmp_path, """
        with traceml_ai.Run(runs_dir, "first") as run:
            run.log(0, {"loss": 1.0})
            print("open", flush=True)
            time.sleep(60)
    """)
    first = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "0"], stdout=subprocess.PIPE,
                             text=True, env=_env({"TRACEML_RUN_DIR": str(folder)}))
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "open"
        proc = _run(tmp_path, """
            with traceml_ai.Run(runs_dir, "second") as run:
                run.log(0, {"loss": 2.0})
        """, 0, env={"TRACEML_RUN_DIR": str(folder)})
        assert proc.returncode == 0, proc.stderr
        assert "another process is already writing" in proc.stderr and "DDP rank" in proc.stderr
    finally:
        first.kill()
        first.wait()


def test_rows_of_several_processes_in_one_file_are_named_as_such(tmp_path: Path) -> None:
    from traceml_ai.runs.metrics_tail import MetricsTail

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (0, 1, 0, 2, 1, 3, 2, 4, 3)))
    tail = MetricsTail(path)
    tail.advance()
    (warning,) = tail.warnings
    assert "several processes write this file" in warning and "resumed" not in warning
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (0, 1, 2, 3, 1, 2, 3, 4)))
    tail = MetricsTail(resumed)
    tail.advance()
    assert any("a resumed run?" in w for w in tail.warnings)


LOG_FOREVER = """
def body(run):
    i = 0
    while True:
        run.log(i, {"loss": 1.0 / (i + 1)})
        if i == 200:
            print("ready", flush=True)
        i += 1
if sys.argv[3] == "with":
    with traceml_ai.Run(runs_dir, "loop", best={"loss": "min"}) as run:
        body(run)
else:
    body(traceml_ai.Run(runs_dir, "loop", best={"loss": "min"}))  # neither with nor finish()
"""


@pytest.mark.parametrize("how", ["with", "bare"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_middle_of_logging_leaves_the_summary_at_the_last_row(
        tmp_path: Path, sig: signal.Signals, how: str) -> None:
    # Issue 14 review: the signal lands in log() just after the row's write returns; metrics.json
    # ended one row behind metrics.jsonl, and a Run without `with` stayed "running".
    script = _script(tmp_path, LOG_FOREVER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "0", how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    run = _folder(tmp_path / "runs")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = _json(run / "metrics.json")
    assert summary["step"] == rows[-1]["step"] >= 200  # (200: the signal came before the next row)
    assert summary["last"]["loss"] == rows[-1]["loss"] == summary["best"]["loss"]["value"]
    meta = _json(run / "run.json")
    assert meta["status"] == "killed"
    assert meta["exit"]["signal"] == ("SIGTERM" if sig == signal.SIGTERM else "SIGINT")


def test_a_run_without_with_or_finish_is_failed_when_the_script_raises(tmp_path: Path) -> None:
    proc = _run(tmp_path, LOG_N + 'raise RuntimeError("CUDA error: device-side assert")\n', 50)
    assert proc.returncode == 1 and proc.stderr.count("Traceback") == 1  # printed once, as without TraceML
    assert "CUDA error: device-side assert" in proc.stderr
    run = _folder(tmp_path / "runs")
    meta = _json(run / "run.json")
    assert meta["status"] == "failed" and meta["exit"]["code"] == 1
    assert meta["exit"]["error_type"] == "RuntimeError" and "device-side assert" in meta["exit"]["error_message"]
    _assert_everything_written(run, 50)
    status = run_traceml("runs", "ls", str(tmp_path / "runs"), "--json")
    assert status.returncode == 0 and json.loads(status.stdout.splitlines()[0])["display_status"] == "failed"


@pytest.mark.parametrize(("exit_call", "code", "status"), [
    ("sys.exit(3)", 3, "failed"), ("sys.exit(0)", 0, "completed"), ("sys.exit()", 0, "completed"),
    ('sys.exit("bad config")', 1, "failed"),
])
def test_a_run_without_with_or_finish_ends_with_the_sys_exit_code(
        tmp_path: Path, exit_call: str, code: int, status: str) -> None:
    """Issue 14: a bare Run in a script ending with sys.exit(3) was left running (shown stale)."""
    proc = _run(tmp_path, LOG_N + exit_call + "\n", 20)
    assert proc.returncode == code, proc.stderr
    run = _folder(tmp_path / "runs")
    meta = _json(run / "run.json")
    assert (meta["status"], meta["exit"]["code"]) == (status, code)
    assert meta["ended_at"] is not None
    if status == "failed":
        assert meta["exit"]["error_type"] == "SystemExit"
    _assert_everything_written(run, 20)
    shown = run_traceml("runs", "ls", str(tmp_path / "runs"), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout.splitlines()[0])["display_status"] == status


def test_a_sys_exit_the_program_caught_does_not_end_the_run(tmp_path: Path) -> None:
    """A SystemExit caught and survived (the training went on and logged) says nothing about the
    exit: the plain end that follows keeps the documented running (stale)."""
    proc = _run(tmp_path, """
        run = traceml_ai.Run(runs_dir, "caught")
        try:
            sys.exit(4)
        except SystemExit:
            pass
        run.log(0, {"loss": 1.0})
    """, 0)
    assert proc.returncode == 0, proc.stderr
    assert _json(_folder(tmp_path / "runs") / "run.json")["status"] == "running"
    proc = _run(tmp_path, """
        try:
            sys.exit(5)  # caught before the run began
        except SystemExit:
            pass
        traceml_ai.Run(runs_dir, "next")
    """, 0, runs=tmp_path / "next")
    assert proc.returncode == 0, proc.stderr
    assert _json(_folder(tmp_path / "next") / "run.json")["status"] == "running"


def test_a_sys_exit_in_another_thread_does_not_end_the_run(tmp_path: Path) -> None:
    proc = _run(tmp_path, """
        import threading
        run = traceml_ai.Run(runs_dir, "thread")
        worker = threading.Thread(target=sys.exit, args=(5,))
        worker.start()
        worker.join()
        run.finish()
    """, 0)
    assert proc.returncode == 0, proc.stderr
    meta = _json(_folder(tmp_path / "runs") / "run.json")
    assert (meta["status"], meta["exit"]["code"]) == ("completed", 0)


def test_a_run_without_with_or_finish_keeps_a_programs_excepthook(tmp_path: Path) -> None:
    proc = _run(tmp_path, 'sys.excepthook = lambda *a: print("mine", file=sys.stderr)\n'
                + LOG_N + 'raise ValueError("x")\n', 5)
    assert proc.returncode == 1 and proc.stderr.strip() == "mine"
    assert _json(_folder(tmp_path / "runs") / "run.json")["status"] == "failed"


def test_a_caught_ctrl_c_inside_log_keeps_that_rows_best_value(tmp_path: Path) -> None:
    # The program catches the interrupt and goes on (as Lightning does); the row written just
    # before it still counts for best, whatever row comes next.
    proc = _run(tmp_path, """
        run = traceml_ai.Run(runs_dir, "caught", best={"loss": "min"})
        real_write = os.write
        def write_then_interrupt(fd, data):
            n = real_write(fd, data)
            if b'"loss":0.01' in data:
                raise KeyboardInterrupt  # just after the row's write returns, as a real Ctrl+C lands
            return n
        os.write = write_then_interrupt
        run.log(0, {"loss": 1.0})
        try:
            run.log(1, {"loss": 0.01})
        except KeyboardInterrupt:
            pass
        os.write = real_write
        run.log(2, {"loss": 0.5})
        run.finish()
    """, 0)
    assert proc.returncode == 0, proc.stderr
    run = _folder(tmp_path / "runs")
    assert [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1.0, 0.01, 0.5]
    summary = _json(run / "metrics.json")
    assert summary["best"]["loss"]["value"] == 0.01 and summary["best"]["loss"]["step"] == 1
    assert summary["last"]["loss"] == 0.5 and summary["step"] == 2
