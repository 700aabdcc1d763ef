"""run.json and manifest.json of launched runs: the launcher guarantees a final status, and hands
run.json over to the script's own logger (DESIGN §2.1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from traceml_ai.launcher.runfolder import RunIdentity, RunJsonKeeper, create_run_folder, write_manifest
from traceml_ai.runs.store import RunStore

IDENTITY = RunIdentity(mode="run", command=["python", "train.py"], session_id="s1")


def read(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def test_a_launched_run_is_running_then_completed_and_readable_by_the_run_store(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "baseline")
    keeper = RunJsonKeeper(folder, "baseline", "g1", ["a"], IDENTITY)
    keeper.start()
    meta = read(folder / "run.json")
    assert meta["status"] == "running" and meta["launcher"]["mode"] == "run"
    assert meta["name"] == "baseline" and meta["group"] == "g1" and meta["tags"] == ["a"]
    assert keeper.finish(exit_code=0) == "completed"
    store = RunStore([tmp_path])
    store.poll()
    (run,) = store.runs()
    assert run.status == "completed" and not run.warnings


def test_a_nonzero_exit_is_failed_with_the_stderr_tail_as_traceback(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "crash")
    keeper = RunJsonKeeper(folder, "crash", None, [], IDENTITY)
    keeper.start()
    assert keeper.finish(exit_code=3, stderr_tail="Traceback...\nValueError: bad\n") == "failed"
    meta = read(folder / "run.json")
    assert meta["exit"]["code"] == 3 and meta["exit"]["traceback"].endswith("ValueError: bad\n")


def test_a_signal_or_ctrl_c_is_killed(tmp_path: Path) -> None:
    for kwargs in ({"exit_code": 137, "signal_name": "SIGKILL"}, {"exit_code": 130, "interrupted": True}):
        folder = create_run_folder(tmp_path, "k")
        keeper = RunJsonKeeper(folder, "k", None, [], IDENTITY)
        keeper.start()
        assert keeper.finish(**kwargs) == "killed"  # type: ignore[arg-type]
        assert read(folder / "run.json")["exit"]["signal"] in ("SIGKILL", "SIGINT")


def test_a_crash_signal_is_failed_not_killed(tmp_path: Path) -> None:
    """A segfault or abort() is the training's own failure, not someone stopping it."""
    for name in ("SIGSEGV", "SIGABRT"):
        folder = create_run_folder(tmp_path, "segv")
        keeper = RunJsonKeeper(folder, "segv", None, [], IDENTITY)
        keeper.start()
        assert keeper.finish(exit_code=139, signal_name=name) == "failed"
        exit_info = read(folder / "run.json")["exit"]
        assert exit_info["signal"] == name and exit_info["error_type"] == "Signal"
        assert exit_info["error_message"] == f"the training crashed with {name}"


def _logger_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "logger_script.py"
    script.write_text("import traceml_ai\n" + body)
    return script


def test_the_scripts_logger_takes_over_run_json_and_its_final_status_is_kept(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "attached")
    keeper = RunJsonKeeper(folder, "attached", None, [], IDENTITY)
    keeper.start()
    script = _logger_script(tmp_path, (
        "with traceml_ai.Run(name='attached', params={'lr': 0.1}) as run:\n"
        "    run.log(0, {'loss': 1.0})\n"
    ))
    env = {**os.environ, "TRACEML_RUN_DIR": str(folder)}
    subprocess.run([sys.executable, str(script)], env=env, check=True)
    assert keeper.taken_over
    # the script ended with exit code 1 after its logger said completed: the logger's word stands
    keeper.telemetry = {"status": "degraded", "reason": "test"}
    assert keeper.finish(exit_code=1) == "completed"
    meta = read(folder / "run.json")
    assert meta["status"] == "completed" and meta["launcher"]["session_id"] == "s1"
    assert meta["telemetry"]["status"] == "degraded"
    assert "lr: 0.1" in (folder / "params.yaml").read_text()


def test_a_logger_killed_with_sigkill_is_not_left_running(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "oom")
    keeper = RunJsonKeeper(folder, "oom", None, [], IDENTITY)
    keeper.start()
    script = _logger_script(tmp_path, (
        "import os, signal\n"
        "run = traceml_ai.Run(name='oom')\n"
        "run.log(0, {'loss': 1.0})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    ))
    env = {**os.environ, "TRACEML_RUN_DIR": str(folder)}
    proc = subprocess.run([sys.executable, str(script)], env=env)
    assert proc.returncode == -9
    assert read(folder / "run.json")["status"] == "running"  # what the killed logger left
    assert keeper.finish(exit_code=137, signal_name="SIGKILL") == "killed"
    meta = read(folder / "run.json")
    assert meta["status"] == "killed" and meta["exit"]["signal"] == "SIGKILL"
    assert meta["name"] == "oom" and (folder / "metrics.jsonl").read_text().count("\n") == 1


def test_manifest_holds_identity_and_lifecycle(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "m")
    ident = RunIdentity(mode="run", command=["x"], session_id="abc", job_id="job", nnodes=2, nproc_per_node=2)
    write_manifest(folder, ident, status="running", started_at_ns=1)
    write_manifest(folder, ident, status="completed", started_at_ns=1, ended_at_ns=5, exit_code=0)
    m = read(folder / "aggregator" / "manifest.json")
    assert (m["session_id"], m["job_id"], m["world_size"], m["status"], m["started_at_ns"], m["ended_at_ns"]) == (
        "abc", "job", 4, "completed", 1, 5)
    with pytest.raises(ValueError):
        write_manifest(folder, ident, status="done", started_at_ns=1)


def test_a_bad_run_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        create_run_folder(tmp_path, "a/b")


def test_a_failed_script_records_its_exception_not_just_its_exit_code(tmp_path: Path) -> None:
    folder = create_run_folder(tmp_path, "raised")
    keeper = RunJsonKeeper(folder, "raised", None, [], IDENTITY)
    keeper.start()
    tail = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: bad lr: -1\n'
    assert keeper.finish(exit_code=1, stderr_tail=tail) == "failed"
    exit_info = read(folder / "run.json")["exit"]
    assert (exit_info["error_type"], exit_info["error_message"], exit_info["code"]) == ("ValueError", "bad lr: -1", 1)


def test_every_file_of_a_captured_run_follows_the_umask(tmp_path: Path) -> None:
    # Issue 14 item 9: a teammate in the group must be able to use every run file alike; SQLite made
    # telemetry.sqlite 0644 whatever the umask. Under umask 002 every file is 0664, as under traceml run.
    (tmp_path / "train.py").write_text("print('trained')\n")
    proc = subprocess.run(
        ["sh", "-c", 'umask 002 && exec "$0" -m traceml_ai run --mode quiet --logs-dir runs train.py', sys.executable],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
        env={k: v for k, v in os.environ.items() if k != "TRACEML_RUN_DIR"},
    )
    assert proc.returncode == 0, proc.stderr
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    modes = {str(p.relative_to(tmp_path / "runs")): oct(p.stat().st_mode & 0o777) for p in files}
    assert any(name.endswith("aggregator/telemetry.sqlite") for name in modes)
    assert set(modes.values()) == {"0o664"}, modes
