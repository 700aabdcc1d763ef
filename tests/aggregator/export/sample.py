"""Payloads for the export tests: one envelope per rank that fills every stream, as a GPU rank sends it."""

from __future__ import annotations

from typing import Any

from traceml_ai.telemetry import schema
from traceml_ai.telemetry.envelope import make_envelope

SESSION = "sess-export-1"
TS = 1_764_500_000_000_000_000


def meta(global_rank: int = 0, *, hostname: str | None = "gpu-node-1", world_size: int = 2) -> dict[str, Any]:
    out: dict[str, Any] = {
        "session_id": SESSION,
        "global_rank": global_rank,
        "local_rank": global_rank,
        "world_size": world_size,
        "local_world_size": world_size,
        "node_rank": 0,
        "pid": 5000 + global_rank,
        "sampler": "test",
    }
    if hostname is not None:
        out["hostname"] = hostname
    return out


def step_events(device: str = "cuda:0", gpu_ms: float | None = 2.5) -> dict[str, Any]:
    return {
        schema.FORWARD: {device: {"is_gpu": True, "duration_ms": 2.5, "cpu_ms": 1.25, "gpu_ms": gpu_ms, "n_calls": 1}},
        schema.BACKWARD: {device: {"is_gpu": True, "duration_ms": 0.0, "cpu_ms": 0.0, "gpu_ms": 0.0, "n_calls": 2}},
        schema.DATALOADER_NEXT: {device: {"is_gpu": False, "duration_ms": 4.0, "cpu_ms": 4.0}},
    }


def full_tables(global_rank: int = 0, *, first_step: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Rows of all six rank streams; the system row carries two GPUs (so all seven tables fill)."""
    ts = TS + global_rank * 1000 + first_step
    device = f"cuda:{global_rank}"
    return {
        "step_time": [
            {"seq": 7, "timestamp_unix_ns": ts, "step": first_step, "events": step_events(device)},
            {"seq": 7, "timestamp_unix_ns": ts + 1, "step": first_step + 1, "events": step_events(device, None)},
        ],
        "step_memory": [
            {"seq": 7, "timestamp_unix_ns": ts, "device": device, "step": first_step,
             "peak_alloc_bytes": 1.5e9, "peak_reserved_bytes": 0.0},
        ],
        "system": [
            {"seq": 3, "timestamp_unix_ns": ts, "cpu_percent": 0.0, "ram_used_bytes": 8e9, "ram_total_bytes": 64e9,
             "gpu_available": True, "gpu_count": 2,
             "gpus": [
                 {"util": 97.0, "mem_used_bytes": 7e10, "mem_total_bytes": 8e10, "temperature_c": 66.0,
                  "power_usage_w": 512.5, "power_limit_w": 700.0},
                 {"util": 0.0, "mem_used_bytes": None, "mem_total_bytes": 8e10},
             ]},
        ],
        "process": [
            {"seq": 3, "timestamp_unix_ns": ts, "cpu_percent": 131.5, "cpu_logical_core_count": 16,
             "ram_used_bytes": 2e9, "ram_total_bytes": 64e9, "gpu_available": True, "gpu_count": 2,
             "gpu_device_index": global_rank, "gpu_mem_used_bytes": 0.0, "gpu_mem_reserved_bytes": 3e9,
             "gpu_mem_total_bytes": 8e10},
        ],
        "runtime_environment": [
            {"seq": 0, "timestamp_unix_ns": ts, "topology": "single_node", "distributed_initialized": True,
             "distributed_backend": "nccl", "training_strategy": "ddp", "strategy_source": "model_wrapper",
             "strategy_confidence": "high"},
        ],
        "stdout_stderr": [
            {"timestamp_unix_ns": ts, "line": "epoch 1 loss 0.25\n", "stream": "stdout"},
            {"timestamp_unix_ns": ts + 1, "line": "", "stream": "stdout"},
            {"timestamp_unix_ns": ts + 2, "line": "warning: slow\n", "stream": "stderr"},
        ],
    }


def full_envelope(global_rank: int = 0, *, hostname: str | None = "gpu-node-1", first_step: int = 0) -> dict[str, Any]:
    return make_envelope(meta(global_rank, hostname=hostname), full_tables(global_rank, first_step=first_step))


RECORDS_PER_FULL_ENVELOPE = {
    "step_time": 2, "step_memory": 1, "system": 1, "system_gpu": 2, "process": 1, "runtime_environment": 1,
    "stdout_stderr": 2,
}
"""Records one :func:`full_envelope` gives per record STREAM (the empty stdout line is not recorded)."""
