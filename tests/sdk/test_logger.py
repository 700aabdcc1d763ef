"""The Run logger's lifecycle, in real subprocesses (003 seed, reference logger; DESIGN §2.1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from traceml_ai.runs.store import RunStore

SCRIPT_HEAD = """
import sys, time
import traceml_ai
runs_dir = sys.argv[1]
"""


def _run_script(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_HEAD + textwrap.dedent(body))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=240, env=full_env,
    )


def _only_run(tmp_path: Path) -> Path:
    (run,) = list((tmp_path / "runs").iterdir())
    return run


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_normal_exit_completes_with_format_of_the_spec(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        with traceml_ai.Run(runs_dir, "baseline", params={"optim": {"lr": 3e-4}, "layers": [1, 2], "amp": True},
                            group="sweep", tags=["cv"], best={"val/auc": "max", "val/loss": "min"}) as run:
            for epoch in range(3):
                run.log(epoch, {"train/loss": 1.0 / (epoch + 1), "lr": 3e-4})
                run.log(epoch, {"val/loss": [0.5, 0.2, 0.3][epoch], "val/auc": [0.7, 0.9, 0.8][epoch]})
            run.summary["test/auc"] = 0.88
    """)
    assert proc.returncode == 0, proc.stderr
    run = _only_run(tmp_path)
    stamp, name, hex4 = run.name.split("_")
    assert len(stamp) == 15 and name == "baseline" and len(hex4) == 4
    assert {p.name for p in run.iterdir() if p.is_dir()} == {"logs", "checkpoints", "artifacts"}
    assert not [p for p in run.iterdir() if p.name.startswith(".")], "temp files left behind"
    meta = _json(run / "run.json")
    assert meta["status"] == "completed" and meta["exit"] == {"code": 0, "signal": None}
    assert meta["id"] == run.name and meta["group"] == "sweep" and meta["tags"] == ["cv"]
    assert meta["ended_at"].endswith("Z") and meta["duration_s"] >= 0
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert params == {"optim.lr": 0.0003, "layers": "[1,2]", "amp": True}
    metrics = _json(run / "metrics.json")
    assert metrics["best"]["val/auc"] == {"value": 0.9, "step": 1, "epoch": 1, "mode": "max"}
    assert metrics["best"]["val/loss"]["value"] == 0.2
    assert metrics["last"]["val/auc"] == 0.8 and metrics["summary"] == {"test/auc": 0.88}
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all({"step", "epoch", "time"} <= json.loads(x).keys() for x in lines)


def test_nan_and_inf_are_written_as_null(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        with traceml_ai.Run(runs_dir, "nan") as run:
            run.log(0, {"train/loss": float("nan"), "x": float("inf"), "y": float("-inf"), "z": 1})
            run.summary["test/auc"] = float("nan")
    """)
    assert proc.returncode == 0, proc.stderr
    run = _only_run(tmp_path)
    text = (run / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    row = json.loads(text)
    assert row["train/loss"] is None and row["x"] is None and row["y"] is None and row["z"] == 1.0
    assert _json(run / "metrics.json")["summary"] == {"test/auc": None}


def test_exception_marks_failed_with_traceback_and_is_not_swallowed(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        def train_step():
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        with traceml_ai.Run(runs_dir, "oom") as run:
            run.log(0, {"train/loss": 1.0})
            train_step()
    """)
    assert proc.returncode == 1
    assert "RuntimeError: CUDA out of memory" in proc.stderr  # the user still sees their error
    meta = _json(_only_run(tmp_path) / "run.json")
    assert meta["status"] == "failed"
    assert meta["exit"]["error_type"] == "RuntimeError"
    assert meta["exit"]["error_message"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "in train_step" in meta["exit"]["traceback"] and meta["exit"]["code"] == 1


def test_sys_exit_codes(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        with traceml_ai.Run(runs_dir, "exit3") as run:
            sys.exit(3)
    """)
    assert proc.returncode == 3
    meta = _json(_only_run(tmp_path) / "run.json")
    assert meta["status"] == "failed" and meta["exit"]["code"] == 3


def test_sys_exit_zero_is_completed(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        with traceml_ai.Run(runs_dir, "exit0") as run:
            sys.exit(0)
    """)
    assert proc.returncode == 0
    assert _json(_only_run(tmp_path) / "run.json")["status"] == "completed"


def _start_looping(tmp_path: Path, heartbeat_s: float = 15.0) -> subprocess.Popen[str]:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT_HEAD + textwrap.dedent(f"""
        with traceml_ai.Run(runs_dir, "looping", heartbeat_s={heartbeat_s}) as run:
            run.log(0, {{"train/loss": 1.0}})
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_ctrl_c_marks_killed(tmp_path: Path) -> None:
    proc = _start_looping(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in stderr
    meta = _json(_only_run(tmp_path) / "run.json")
    assert meta["status"] == "killed" and meta["exit"]["signal"] == "SIGINT"


def test_sigkill_leaves_running_and_readers_show_stale(tmp_path: Path) -> None:
    proc = _start_looping(tmp_path)
    proc.kill()
    proc.wait(timeout=240)
    run = _only_run(tmp_path)
    meta = _json(run / "run.json")
    assert meta["status"] == "running"  # nobody could write the final status
    now = {"t": time.time()}
    store = RunStore([tmp_path / "runs"], stale_after_seconds=60, clock=lambda: now["t"])
    store.poll()
    assert store.runs()[0].display_status == "running"
    now["t"] += 61
    assert store.poll().changed == [str(run.resolve())]
    assert store.runs()[0].display_status == "stale"
    assert _json(run / "run.json") == meta  # stale is never written


def test_heartbeat_thread_refreshes_heartbeat(tmp_path: Path) -> None:
    proc = _start_looping(tmp_path, heartbeat_s=0.2)
    try:
        run = _only_run(tmp_path)
        first = _json(run / "run.json")["heartbeat_at"]
        deadline = time.time() + 10
        while time.time() < deadline and _json(run / "run.json")["heartbeat_at"] == first:
            time.sleep(0.1)
        assert _json(run / "run.json")["heartbeat_at"] != first
    finally:
        proc.kill()
        proc.wait()


def test_attach_mode_writes_into_the_given_folder(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "20261130-101500_launched_a3f9"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "id": folder.name, "name": "launched", "status": "running",
        "started_at": "2026-11-30T10:15:00Z", "command": ["traceml", "run", "train.py"],
    }))
    proc = _run_script(tmp_path, """
        with traceml_ai.Run(runs_dir, "ignored-name") as run:
            run.log(0, {"train/loss": 0.5})
    """, env={"TRACEML_RUN_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [folder.name]  # no new folder
    meta = _json(folder / "run.json")
    assert meta["id"] == folder.name and meta["status"] == "completed"
    assert meta["started_at"] == "2026-11-30T10:15:00Z"
    assert meta["command"] == ["traceml", "run", "train.py"]
    assert (folder / "metrics.jsonl").read_text().count("\n") == 1


def test_bad_arguments_raise_clear_errors(tmp_path: Path) -> None:
    import traceml_ai

    with pytest.raises(ValueError, match="best mode"):
        traceml_ai.Run(tmp_path, "x", best={"val/auc": "maximum"})
    with pytest.raises(ValueError, match="path separator"):
        traceml_ai.Run(tmp_path, "a/b")
    with traceml_ai.Run(tmp_path, "ok") as run:
        with pytest.raises(TypeError, match="train/loss"):
            run.log(0, {"train/loss": "high"})
        run.log(0, {"converged": True, "diverged": False})  # a bool is 1 or 0 (issue 14 review)
        with pytest.raises(ValueError, match="not a metric name"):
            run.log(0, {"step": 3})
    with pytest.raises(RuntimeError, match="finished"):
        run.log(1, {"train/loss": 1.0})
    (row,) = [json.loads(line) for line in next(tmp_path.glob("*_ok_*/metrics.jsonl")).read_text().splitlines()]
    assert row["converged"] == 1.0 and row["diverged"] == 0.0


def test_sigterm_marks_killed_like_a_scheduler_stop(tmp_path: Path) -> None:
    proc = _start_looping(tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=240)
    assert proc.returncode == 143  # what the scheduler would have seen
    meta = _json(_only_run(tmp_path) / "run.json")
    assert meta["status"] == "killed" and meta["exit"] == {"code": 143, "signal": "SIGTERM"}


def test_a_programs_own_sigterm_handler_is_left_alone(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, """
        import os, signal
        seen = []
        signal.signal(signal.SIGTERM, lambda *a: seen.append("mine"))
        with traceml_ai.Run(runs_dir, "own-handler") as run:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        assert seen == ["mine"], seen
    """)
    assert proc.returncode == 0, proc.stderr
    assert _json(_only_run(tmp_path) / "run.json")["status"] == "completed"


def test_steps_must_be_integers_and_summary_values_stay_json(tmp_path: Path) -> None:
    import numpy as np

    import traceml_ai

    with traceml_ai.Run(tmp_path, "steps", params={"n": np.int64(3), "lr": np.float32(0.5)}) as run:
        with pytest.raises(ValueError, match="step must be an integer"):
            run.log(1.5, {"a": 1.0})
        with pytest.raises(TypeError, match="step must be an integer"):
            run.log("3", {"a": 1.0})  # type: ignore[arg-type]
        run.log(np.int64(2), {"a": 1.0})
        run.log(3.0, {"a": 2.0})  # type: ignore[arg-type]
        run.summary["nested"] = {"xs": [1, float("inf")]}
    (folder,) = list(tmp_path.iterdir())
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3]
    assert _json(folder / "metrics.json")["summary"]["nested"] == '{"xs":[1,null]}'
    assert yaml.safe_load((folder / "params.yaml").read_text()) == {"n": 3, "lr": 0.5}
    with pytest.raises(ValueError, match="control characters"):
        traceml_ai.Run(tmp_path, "x\ny")
