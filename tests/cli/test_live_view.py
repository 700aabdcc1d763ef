"""The live terminal view of ``traceml run --mode cli``, in a real pseudo-terminal (issue: capture, item 5)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = """
import time, torch, traceml_ai
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(60):
    with traceml_ai.trace_step(model):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    time.sleep(0.05)
    if i % 20 == 0:
        print(f"training line {i}", flush=True)
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.timeout(600)  # a real training under `traceml run`, read for up to 300 s
def test_live_view_shows_the_breakdown_resources_and_the_scripts_output(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        # A '#' in the database's path once cut the SQLite URI short: the view said "no steps yet" all
        # run long and SQLite created an empty file in the runs root. Run names are slugified into
        # folder names now ("exp#1" -> exp-1), so the '#' comes from the logs folder.
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "cli", "--interval", "0.2", "--name", "exp#1",
         "--logs-dir", str(tmp_path / "exp#1" / "runs"), str(script)],
        cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed: every process holding it has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=240) == 0
    screen = ANSI.sub("", b"".join(chunks).decode("utf-8", errors="replace"))
    for line in ("training line 0", "training line 20", "training line 40"):
        assert line in screen  # the script's output, printed above the view
    assert "step time" in screen and "median rank (0)" in screen
    for phase in ("forward", "backward", "optimizer_step"):  # the steps were read (not "no steps yet")
        assert re.search(rf"{phase}\s*│\s*[\d.]+ ms", screen), phase
    assert "process RSS" in screen and "host CPU" in screen
    assert re.search(r"step \d+", screen)
    assert "run folder:" in screen and "exit code 0" in screen
    (run_dir,) = (tmp_path / "exp#1" / "runs").iterdir()  # nothing else appeared in the runs root
    assert "exp-1" in run_dir.name and run_dir.is_dir()
    assert sorted(p.name for p in (tmp_path / "exp#1").iterdir()) == ["runs"]


@pytest.mark.parametrize("name", ["exp#1", "what?", "50% lr", "a b"])
def test_a_run_path_with_uri_characters_is_read_and_nothing_is_created(tmp_path: Path, name: str) -> None:
    """The view reads the database of a run whose folder name holds ``#``, ``?``, ``%`` or a space
    (``traceml run --name "exp#1"``), and creates no file anywhere but SQLite's own ``-wal``/``-shm``
    beside the database (which the live writer has anyway)."""
    from tests.diagnose.telemetry_db import RunSpec, write_run
    from traceml_ai.cli.live_view import TelemetrySnapshot

    root = tmp_path / "runs"
    db = write_run(root / f"20261201-101500_{name}_ab12", RunSpec(ranks=2, steps=12, noise=0.0))
    before = set(tmp_path.rglob("*"))
    snap = TelemetrySnapshot(db)
    snap.refresh()
    snap.close()
    assert snap.error is None
    assert sorted(snap.steps) == [0, 1] and all(len(steps) > 0 for steps in snap.steps.values())
    assert set(tmp_path.rglob("*")) - before <= {Path(f"{db}-wal"), Path(f"{db}-shm")}


def test_the_worst_rank_is_the_straggler_even_when_ddp_makes_every_iteration_equal(tmp_path: Path) -> None:
    """Under DDP the fast ranks wait in backward's all-reduce, so every iteration is equal; the view
    must still name the rank whose own work (outside backward) is longest, and show 'other'."""
    from rich.console import Console

    from tests.diagnose.telemetry_db import RunSpec, write_run
    from traceml_ai.cli.live_view import TelemetrySnapshot, breakdown_table
    from traceml_ai.telemetry import schema

    def phases(rank: int, step: int) -> dict[str, float]:
        slow = rank == 2  # rank 2 spends 6 ms more in forward; the others wait that long in backward
        return {schema.DATALOADER_NEXT: 1.0, schema.FORWARD: 10.0 if slow else 4.0,
                schema.BACKWARD: 7.0 if slow else 13.0, schema.OPTIMIZER_STEP: 2.0, "other": 3.0}

    db = write_run(tmp_path / "run", RunSpec(ranks=4, steps=30, phases=phases, noise=0.0))
    snap = TelemetrySnapshot(db)
    snap.refresh()
    console = Console(width=160, record=True)
    console.print(breakdown_table(snap))
    text = console.export_text()
    assert "worst rank (2)" in text and "4 rank(s)" in text
    assert re.search(r"other\s*│\s*3\.0 ms", text)
    assert re.search(r"iteration\s*│\s*23\.0 ms\s*│\s*23\.0 ms", text)
    assert re.search(r"forward\s*│\s*4\.0 ms\s*│\s*10\.0 ms", text)
    snap.close()


def test_legacy_rows_timed_only_in_duration_ms_show_their_phases(tmp_path: Path) -> None:
    """Rows written before ``cpu_ms``/``gpu_ms`` existed carry only ``duration_ms``: the view reads
    them as the diagnoses do (it once left those phases out of the table), and a phase timed on two
    devices counts once (the longest), not summed."""
    from rich.console import Console

    from tests.diagnose.telemetry_db import TelemetryDB
    from traceml_ai.cli.live_view import TelemetrySnapshot, breakdown_table
    from traceml_ai.telemetry import schema

    db = TelemetryDB(tmp_path / "run" / "aggregator" / "telemetry.sqlite")
    for step in range(10):
        legacy = {name: {"cpu": {"duration_ms": ms}} for name, ms in
                  ((schema.FORWARD, 4.0), (schema.BACKWARD, 6.0), (schema.STEP, 12.0))}
        legacy[schema.OPTIMIZER_STEP] = {"cpu": {"duration_ms": 1.0}, "cuda:0": {"duration_ms": 1.5}}
        db.step(0, step, legacy, ts_ns=None)
    db.close()
    snap = TelemetrySnapshot(db.path)
    snap.refresh()
    console = Console(width=160, record=True)
    console.print(breakdown_table(snap))
    text = console.export_text()
    snap.close()
    assert "no steps yet" not in text
    assert re.search(r"forward\s*│\s*4\.0 ms", text)
    assert re.search(r"optimizer_step\s*│\s*1\.5 ms", text)
    assert re.search(r"iteration\s*│\s*12\.0 ms", text)
    assert re.search(r"other\s*│\s*0\.5 ms", text)
