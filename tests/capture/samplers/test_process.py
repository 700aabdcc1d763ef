"""The process sampler's rows (DESIGN §3.1 ``process`` keys): RSS, CPU of one core, torch CUDA memory.

Runs in fresh interpreters so that whether torch is imported is known.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

ROW_KEYS = {"seq", "timestamp_unix_ns", "cpu_percent", "cpu_logical_core_count", "ram_used_bytes",
            "ram_total_bytes", "gpu_available", "gpu_count", "gpu_device_index", "gpu_mem_used_bytes",
            "gpu_mem_reserved_bytes", "gpu_mem_total_bytes"}

PROBE = textwrap.dedent("""
    import json, sys, time
    import psutil
    IMPORT_TORCH
    from traceml_ai.capture.samplers.process import ProcessSampler
    sampler = ProcessSampler(local_rank=0)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    ballast = bytearray(200 * 1024 * 1024)  # 200 MiB resident
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    row = sampler.collect(1, time.time_ns())[0]
    row["expected_cpu_percent"] = (time.process_time() - cpu0) / (time.perf_counter() - wall0) * 100
    row["torch_imported"] = "torch" in sys.modules
    row["cuda_build"] = "torch" in sys.modules and sys.modules["torch"].version.cuda is not None
    row["psutil_rss"] = psutil.Process().memory_info().rss
    row["psutil_cores"] = psutil.cpu_count()
    print(json.dumps(row))
""")


def probe(import_torch: bool) -> dict[str, object]:
    code = PROBE.replace("IMPORT_TORCH", "import torch" if import_torch else "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True)
    row: dict[str, object] = json.loads(proc.stdout)
    return row


def test_row_without_torch_never_imports_it_and_leaves_gpu_unknown() -> None:
    row = probe(import_torch=False)
    assert row.pop("torch_imported") is False
    row.pop("cuda_build")
    rss, cores = row.pop("psutil_rss"), row.pop("psutil_cores")
    expected = row.pop("expected_cpu_percent")
    assert set(row) == ROW_KEYS
    for key in ("gpu_available", "gpu_count", "gpu_device_index", "gpu_mem_used_bytes", "gpu_mem_reserved_bytes",
                "gpu_mem_total_bytes"):
        assert row[key] is None, key
    assert row["cpu_logical_core_count"] == cores
    # in percent of ONE core: what the process's own CPU clock says over the same window. How much CPU
    # the busy loop got depends on the machine's load, so only the agreement and "some" are asserted.
    assert isinstance(row["cpu_percent"], float) and isinstance(expected, float)
    assert abs(row["cpu_percent"] - expected) <= 15.0 and row["cpu_percent"] > 0.0
    assert isinstance(rss, int) and isinstance(row["ram_used_bytes"], float)
    assert 200 * 1024 * 1024 <= row["ram_used_bytes"] <= rss * 1.1
    assert row["ram_used_bytes"] < row["ram_total_bytes"]  # type: ignore[operator]


def test_torch_imported_but_cuda_not_initialised() -> None:
    row = probe(import_torch=True)
    assert row["torch_imported"] is True and set(row) - {"torch_imported", "cuda_build", "psutil_rss",
                                                          "psutil_cores", "expected_cpu_percent"} == ROW_KEYS
    if row["cuda_build"]:
        # CUDA not initialised by the script: nothing known, and the sampler did not initialise it
        assert row["gpu_available"] is None and row["gpu_count"] is None
    else:
        # a CPU-only build can never have a GPU
        assert row["gpu_available"] == 0 and row["gpu_count"] == 0
    assert row["gpu_device_index"] is None and row["gpu_mem_used_bytes"] is None
    assert row["gpu_mem_reserved_bytes"] is None and row["gpu_mem_total_bytes"] is None
