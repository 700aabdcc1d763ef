"""A step whose timing fails is a loss, counted and said (review 11e): under ``traceml run`` a script
whose every step's timing failed got one note, 0 rows, no finalization_warning.json and a verdict
blaming a missing ``trace_step``. And a ``step=`` that is no step number is refused by
``trace_step`` itself, before anything is timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_traceml

# A real training loop under a fault of TraceML's own: the patching that opens each step raises
# (as a bug in it would). The training itself must run to the end and print its result.
FAULTY = """
import torch, traceml_ai
from traceml_ai.capture import instrument, steps

def broken():
    raise RuntimeError("planted fault in TraceML's step opening")

instrument._installed = False
instrument.install = broken
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(0)
for i in range(12):
    with traceml_ai.trace_step(model):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
print(f"trained 12 steps, last loss {loss.item():.4f}")
"""

# Faults on some steps only: the third iteration's step opening fails each time.
SOME_FAULTY = """
import torch, traceml_ai
from traceml_ai.capture import steps

begin = steps.StepTracer._begin  # a staticmethod
calls = 0

def sometimes(*args):
    global calls
    calls += 1
    if calls % 3 == 0:
        raise RuntimeError("planted fault on every third step")
    return begin(*args)

steps.StepTracer._begin = staticmethod(sometimes)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(12):
    with traceml_ai.trace_step(model):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
with traceml_ai.trace_step(model, step=20):
    pass
with traceml_ai.trace_step(model, step=20):  # the same number again
    pass
print("done")
"""

BAD_STEP = """
import torch, traceml_ai
model = torch.nn.Linear(4, 2)
for bad in ("s0", 0.5, True, -1, 2**70):
    try:
        with traceml_ai.trace_step(model, step=bad):
            pass
    except (TypeError, ValueError) as err:
        print(type(err).__name__, err)
"""


@pytest.mark.timeout(300)
def test_steps_whose_timing_failed_are_counted_and_said(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    root = tmp_path / "runs"
    done = run_traceml("run", "--logs-dir", str(root), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 12 steps" in done.stdout  # the training's result is untouched
    # one note for the kind of fault, then the count at the end
    assert done.stderr.count("step timing failed and was skipped") == 1
    assert "the timing of 12 step(s) failed" in done.stderr
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    summary = json.loads((run / "aggregator" / "final_summary.json").read_text())
    assert summary["steps"]["seen"] == 0 and summary["steps"]["failed"] == 12
    lost = json.loads((run / "aggregator" / "finalization_warning.json").read_text())
    assert lost["failed_steps"] == {"0": 12}
    assert any("lost the timing of 12 steps" in line for line in lost["summary"])
    shown = run_traceml("summary", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "the timing of all 12 traced step(s) failed" in shown.stdout
    assert "trace_step(model):`, or it ended" not in shown.stdout  # not blamed on the script
    assert "lost the timing of 12 steps" in shown.stdout


@pytest.mark.timeout(300)
def test_trace_step_refuses_a_step_that_is_no_step_number(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "bad_step.py"
    script.write_text(BAD_STEP)
    done = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[:5] == [
        "TypeError trace_step step must be an integer or None, got str 's0'",
        "TypeError trace_step step must be an integer or None, got float 0.5",
        "TypeError trace_step step must be an integer or None, got bool",
        "ValueError trace_step step must be from 0 to 2**63 - 1, got -1",
        f"ValueError trace_step step must be from 0 to 2**63 - 1, got {2**70}",
    ]


@pytest.mark.timeout(300)
def test_a_step_whose_timing_failed_keeps_its_number_and_a_repeated_number_is_said(tmp_path: Path) -> None:
    """Review 11f: rows after a failed step took its number (0..15 for 24 iterations), out of step
    with the iterations and with the other ranks; a step number given twice was kept without a word."""
    pytest.importorskip("torch")
    import sqlite3

    script = tmp_path / "some_faulty.py"
    script.write_text(SOME_FAULTY)
    root = tmp_path / "runs"
    done = run_traceml("run", "--logs-dir", str(root), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trace_step(step=20) repeats or goes back from step 20" in " ".join(done.stderr.split())
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    db = sqlite3.connect(f"file:{run / 'aggregator' / 'telemetry.sqlite'}?mode=ro", uri=True)
    try:
        numbers = [n for (n,) in db.execute("SELECT step FROM step_time_samples ORDER BY id")]
    finally:
        db.close()
    # iterations 2, 5, 8 and 11 failed: their numbers are gaps, the others keep their iteration's
    assert numbers == [0, 1, 3, 4, 6, 7, 9, 10, 20, 20]
    summary = json.loads((run / "aggregator" / "final_summary.json").read_text())
    assert summary["steps"]["failed"] == 4
