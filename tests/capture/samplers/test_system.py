"""The system sampler's rows (DESIGN §3.1 ``system`` keys), measured on this host."""

from __future__ import annotations

import time

import psutil

from traceml_ai.capture.samplers.system import Nvml, SystemSampler

ROW_KEYS = {"seq", "timestamp_unix_ns", "cpu_percent", "ram_used_bytes", "ram_total_bytes", "gpu_available",
            "gpu_count", "gpus"}
GPU_KEYS = {"util", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_usage_w", "power_limit_w"}


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_row_keys_and_plausible_host_values() -> None:
    sampler = SystemSampler()
    busy(0.3)
    now = time.time_ns()
    rows = sampler.collect(7, now)
    sampler.close()
    assert len(rows) == 1
    row = rows[0]
    assert set(row) == ROW_KEYS
    assert row["seq"] == 7 and row["timestamp_unix_ns"] == now
    # one core was busy for the whole interval: at least a share of 1/cores of the host
    cores = psutil.cpu_count() or 1
    assert 100.0 / cores * 0.5 <= row["cpu_percent"] <= 100.0
    vm = psutil.virtual_memory()
    assert row["ram_total_bytes"] == float(vm.total)
    assert 0 < row["ram_used_bytes"] < row["ram_total_bytes"]


def test_gpu_fields_follow_nvml() -> None:
    nvml = Nvml()
    row = SystemSampler().collect(1, time.time_ns())[0]
    if not nvml.available:
        # no NVML library or driver here: no usable GPU, nothing counted, no per-GPU rows
        assert row["gpu_available"] == 0 and row["gpu_count"] is None and row["gpus"] == []
        return
    assert row["gpu_count"] == nvml.count() == len(row["gpus"])
    assert row["gpu_available"] == (1 if row["gpu_count"] else 0)
    for gpu in row["gpus"]:
        assert set(gpu) == GPU_KEYS
        assert 0 <= gpu["util"] <= 100 and 0 < gpu["mem_used_bytes"] <= gpu["mem_total_bytes"]
        assert 0 < gpu["power_usage_w"] <= gpu["power_limit_w"] * 1.5 and 0 < gpu["temperature_c"] < 120


def test_cpu_percent_needs_two_samples_and_is_none_without() -> None:
    sampler = SystemSampler()
    first = sampler.collect(1, 0)[0]["cpu_percent"]
    # zero elapsed CPU time between construction and the call can only be "not measured"
    assert first is None or 0.0 <= first <= 100.0
