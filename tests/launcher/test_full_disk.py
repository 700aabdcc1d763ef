"""``traceml run`` on a full disk (issue 12 item 9): the training's own exit code comes back, the
failure is said once, and the final status is recorded wherever it still fits."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_traceml

FILL = """
import sys
import traceml_ai
with traceml_ai.Run(None, "x") as run:
    for i in range(3000):
        run.log(i, {f"m{j}": float(i) for j in range(50)})
print("script done", run.write_errors, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("script_code", [0, 3])
def test_a_full_disk_keeps_the_scripts_exit_code_and_records_the_end(tmp_path: Path, small_disk: Path,
                                                                    script_code: int) -> None:
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    proc = run_traceml("run", "--logs-dir", str(small_disk / "runs"), str(script), str(script_code), cwd=tmp_path)
    assert proc.returncode == script_code, proc.stderr
    assert "script done" in proc.stdout
    assert "error:" not in proc.stderr and "Traceback" not in proc.stderr
    assert "No space left on device" in proc.stderr
    (run,) = (small_disk / "runs").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == ("completed" if script_code == 0 else "failed")
    manifest = json.loads((run / "aggregator" / "manifest.json").read_text())
    assert manifest["status"] != "running" and manifest["exit_code"] == script_code
    assert manifest["telemetry"]["status"] == "degraded"
