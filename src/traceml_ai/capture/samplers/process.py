"""The ``process`` stream: this rank's own CPU, memory and torch CUDA memory (DESIGN §3.1).

One row per tick with keys ``seq, timestamp_unix_ns, cpu_percent, cpu_logical_core_count,
ram_used_bytes, ram_total_bytes, gpu_available, gpu_count, gpu_device_index, gpu_mem_used_bytes,
gpu_mem_reserved_bytes, gpu_mem_total_bytes``.

The GPU fields come from torch, and only when the training already imported torch *and* initialised
CUDA: this source never imports torch and never initialises CUDA (that would cost the rank a CUDA
context, and in a process that later forks DataLoader workers, break them). Before that:

- torch not imported → every GPU field None (nothing is known yet);
- a CPU-only torch build → ``gpu_available`` 0, ``gpu_count`` 0, the memory fields None;
- CUDA built but not initialised → every GPU field None.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import psutil

from traceml_ai.telemetry.schema import PROCESS

_GPU_KEYS = ("gpu_available", "gpu_count", "gpu_device_index", "gpu_mem_used_bytes", "gpu_mem_reserved_bytes",
             "gpu_mem_total_bytes")


def torch_cuda_memory(local_rank: int | None) -> dict[str, Any]:
    """The process row's GPU fields from an already imported, CUDA-initialised torch (else Nones).

    The device is the rank's: the only visible device, else the only device holding memory of this
    process, else ``local_rank`` when it names a visible device, else torch's current device. The
    sampler thread cannot ask the training thread which device it set, so this order prefers what
    the memory itself shows.
    """
    out: dict[str, Any] = dict.fromkeys(_GPU_KEYS)
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    try:
        version = getattr(torch, "version", None)
        if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
            out["gpu_available"], out["gpu_count"] = 0, 0
            return out
        cuda = torch.cuda
        if not cuda.is_initialized():
            return out
        count = int(cuda.device_count())
        out["gpu_count"] = count
        out["gpu_available"] = 1 if count > 0 else 0
        if count == 0:
            return out
        if count == 1:
            device = 0
        else:
            holding = [d for d in range(count) if cuda.memory_reserved(d) > 0]
            if len(holding) == 1:
                device = holding[0]
            elif local_rank is not None and 0 <= local_rank < count:
                device = local_rank
            else:
                device = int(cuda.current_device())
        out["gpu_device_index"] = device
        out["gpu_mem_used_bytes"] = float(cuda.memory_allocated(device))
        out["gpu_mem_reserved_bytes"] = float(cuda.memory_reserved(device))
        out["gpu_mem_total_bytes"] = float(cuda.get_device_properties(device).total_memory)
    except Exception:
        # A torch that misbehaves mid-read leaves whatever was not read as None.
        pass
    return out


class ProcessSampler:
    """Row source of the ``process`` stream for this process (DESIGN §3.1).

    ``cpu_percent`` is this process's CPU time over the last tick in percent of ONE logical core
    (so it can exceed 100), ``cpu_logical_core_count`` the host's logical cores, ``ram_used_bytes``
    the process's resident set size, ``ram_total_bytes`` the host's physical RAM. GPU fields: see
    the module docstring.

    Args:
        local_rank: the rank's local rank, used to pick its CUDA device when several are visible.
    """

    stream = PROCESS

    def __init__(self, local_rank: int | None = None) -> None:
        self._local_rank = local_rank
        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(None)  # the first call only starts psutil's clock
        self._cores: int | None = psutil.cpu_count(logical=True)
        self._ram_total: float | None
        try:
            self._ram_total = float(psutil.virtual_memory().total)
        except Exception:
            self._ram_total = None

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        try:
            cpu: float | None = float(self._proc.cpu_percent(None))
        except Exception:
            cpu = None
        try:
            rss: float | None = float(self._proc.memory_info().rss)
        except Exception:
            rss = None
        return [{
            "seq": seq,
            "timestamp_unix_ns": now_ns,
            "cpu_percent": cpu,
            "cpu_logical_core_count": self._cores,
            "ram_used_bytes": rss,
            "ram_total_bytes": self._ram_total,
            **torch_cuda_memory(self._local_rank),
        }]
