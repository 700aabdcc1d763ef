"""benchmarks/gpu_check.py (issue 11 item 9) is the one script a lent GPU machine runs, with minutes
of device time for every try: its CPU rehearsal runs here, so a broken collection is found before
the device is. On the CPU the figures it collects must say what the CPU run measured: no GPU
timing, no h2d phase, no NVML records, and the planted host-side wait counted in the step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


@pytest.mark.timeout(600)
def test_gpu_check_rehearsal_on_the_cpu_collects_every_figure(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--epochs", "1",
                           "--keep", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=env, timeout=540, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in ("CUDA event timing", "h2d: median", "per-step peaks", "NVML (0 system_gpu records)", "verdict:"):
        assert line in proc.stdout, line
    found = json.loads((tmp_path / "gpu_check.json").read_text())
    results = {r["case"]: r for r in found["results"]}
    assert set(results) == {"healthy", "h2d_bound", "low_gpu_util"}
    # the healthy case is judged in the rehearsal too, as on the GPU (review 11f: 3 steps, not judged)
    assert results["healthy"]["verdict_kind"] in ("healthy", "findings")
    for result in results.values():
        assert result["exit"] == 0 and "error" not in result
        steps = result["steps"]
        assert steps == 45  # one epoch of 1,437 training images in batches of 32
        forward = result["phases"]["traceml:forward"]
        assert forward["events"] == steps and forward["gpu_timed"] == 0 and forward["devices"] == ["cpu"]
        assert forward["median_cpu_ms"] > 0
        assert "traceml:h2d" not in result["phases"] and result["h2d"] == {"median_ms": None, "share": None}
        assert result["step_memory"]["records"] == steps and result["step_memory"]["steps_with_peak"] == 0
        assert result["nvml"]["records"] == 0 and result["gpu_util_median"] is None
        assert "low_gpu_util" in result["abstained"]
        if result["case"] != "healthy":
            assert result["planted_first"] is False  # nothing to find on the CPU
    # the planted 20 ms of host-side work per step is in the step, outside every phase
    low = results["low_gpu_util"]
    assert low["iteration_median_ms"] >= 20
    assert low["shares"]["other"] > results["h2d_bound"]["shares"]["other"]
    # the runs are kept where asked, one folder per case
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["h2d_bound", "healthy", "low_gpu_util"]


def test_gpu_check_without_cuda_says_so_and_exits_2() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "no CUDA device here" in proc.stderr
