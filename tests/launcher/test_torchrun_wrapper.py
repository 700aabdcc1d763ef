"""The torchrun wrapper of multi-rank runs: a stop by a signal is one line, not torchrun's tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

RANK = """
import os, sys, time
# One write per line: print() writes each argument apart, and two ranks' words then interleave.
sys.stdout.write(f"rank {os.environ['RANK']} up\\n")
sys.stdout.flush()
time.sleep(120)
"""


def test_a_stopped_torchrun_says_one_line(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.Popen([sys.executable, "-m", "traceml_ai.launcher.torchrun", "--standalone",
                             "--nproc-per-node", "2", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    up = {proc.stdout.readline().strip(), proc.stdout.readline().strip()}
    assert up == {"rank 0 up", "rank 1 up"}
    proc.send_signal(signal.SIGTERM)  # what the launcher's stop and a scheduler send
    _, errors = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "[TraceML] the ranks were stopped by SIGTERM" in errors
    assert "Traceback" not in errors and "SignalException" not in errors
    assert "Received 15 death signal" not in errors  # torchrun's warnings stay below ERROR


def test_failed_ranks_are_one_line_each_and_the_exit_status_is_the_scripts(tmp_path: Path) -> None:
    """Fresh-user review (issue 14): a 2-rank script failing on its arguments printed some 45 lines
    of torchrun's ChildFailedError traceback and "Root Cause" block, and exited 1, not the script's 2."""
    script = tmp_path / "bad_args.py"
    script.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.run([sys.executable, "-m", "traceml_ai.launcher.torchrun", "--standalone", "--nproc-per-node",
                           "2", str(script), "--bogus"], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("unrecognized arguments: --bogus") == 2  # the ranks' own words stay
    assert "[TraceML] rank 0 exited with code 2" in proc.stderr and "[TraceML] rank 1 exited with code 2" in proc.stderr
    for noise in ("Traceback", "ChildFailedError", "Root Cause", "elastic/multiprocessing"):
        assert noise not in proc.stderr, proc.stderr
