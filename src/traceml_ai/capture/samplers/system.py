"""The ``system`` stream: host CPU and RAM, and every GPU through NVML (DESIGN §3.1).

One row per tick with keys ``seq, timestamp_unix_ns, cpu_percent, ram_used_bytes, ram_total_bytes,
gpu_available, gpu_count, gpus``; each ``gpus`` item has ``util, mem_used_bytes, mem_total_bytes,
temperature_c, power_usage_w, power_limit_w``. Only node-local rank 0 runs this source (one host
snapshot per node; the session decides).

GPUs are read with nvidia-ml-py (``pynvml``). When the NVML library or the driver is absent, the
host has no GPU this rank can see: ``gpu_available`` 0, ``gpu_count`` None (not counted) and no
``gpus``. Any other NVML failure leaves the field it concerns None; a measured 0 stays 0.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import psutil

from traceml_ai.telemetry.schema import SYSTEM

T = TypeVar("T")


def _read(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:  # NVML raises its own error family per field; a missing field is None
        return None


class _HostCpu:
    """Host CPU busy percent between two calls, from ``psutil.cpu_times`` (state kept here, not in psutil)."""

    def __init__(self) -> None:
        self._last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float] | None:
        try:
            t = psutil.cpu_times()
        except Exception:
            return None
        total = sum(t)
        # guest time is already counted in user/nice on Linux
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        idle = t.idle + getattr(t, "iowait", 0.0)
        return total, idle

    def percent(self) -> float | None:
        now = self._sample()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        total = now[0] - last[0]
        if total <= 0:
            return None
        busy = total - (now[1] - last[1])
        return round(min(100.0, max(0.0, 100.0 * busy / total)), 1)


class Nvml:
    """NVML for the whole host: initialised once; ``available`` is False without library or driver.

    ``gpus()`` returns one dict per GPU (the ``system`` row's ``gpus`` items), in NVML index order.
    """

    def __init__(self) -> None:
        self.available: bool | None = False
        self.error: str | None = None
        self._pynvml: Any = None
        try:
            import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
        except ImportError as exc:
            self.error = f"nvidia-ml-py is not installed: {exc}"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            # Without the library or the driver no GPU is usable here: that is a fact, not a gap.
            no_gpu = code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            self.available = False if no_gpu else None
            self.error = str(exc)
            return
        self._pynvml = pynvml
        self.available = True

    def count(self) -> int | None:
        if self._pynvml is None:
            return None
        return _read(self._pynvml.nvmlDeviceGetCount)

    def gpus(self) -> list[dict[str, Any]]:
        nv = self._pynvml
        n = self.count()
        if nv is None or not n:
            return []
        out = []
        for index in range(n):
            handle: Any = _read(partial(nv.nvmlDeviceGetHandleByIndex, index))
            util: Any = _read(partial(nv.nvmlDeviceGetUtilizationRates, handle)) if handle is not None else None
            mem: Any = _read(partial(nv.nvmlDeviceGetMemoryInfo, handle)) if handle is not None else None
            temp: Any = (
                _read(partial(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU))
                if handle is not None else None
            )
            usage_mw: Any = _read(partial(nv.nvmlDeviceGetPowerUsage, handle)) if handle is not None else None
            limit_mw: Any = _read(partial(nv.nvmlDeviceGetEnforcedPowerLimit, handle)) if handle is not None else None
            out.append({
                "util": float(util.gpu) if util is not None else None,
                "mem_used_bytes": float(mem.used) if mem is not None else None,
                "mem_total_bytes": float(mem.total) if mem is not None else None,
                "temperature_c": float(temp) if temp is not None else None,
                "power_usage_w": usage_mw / 1000.0 if usage_mw is not None else None,
                "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
            })
        return out

    def close(self) -> None:
        if self._pynvml is not None:
            _read(self._pynvml.nvmlShutdown)
            self._pynvml = None


class SystemSampler:
    """Row source of the ``system`` stream: one host snapshot per tick (DESIGN §3.1).

    ``cpu_percent`` is host CPU busy time over the last tick in percent of all cores (0–100);
    ``ram_used_bytes`` is ``total - available`` (memory new allocations cannot get),
    ``ram_total_bytes`` physical RAM. GPU fields are described in the module docstring.
    """

    stream = SYSTEM

    def __init__(self) -> None:
        self._cpu = _HostCpu()
        self._nvml_made: Nvml | None = None

    @property
    def _nvml(self) -> Nvml:
        # NVML is loaded by the first collect, on the sampler thread: loading it (10-40 ms, also
        # where it is absent) at the session's start would delay the training (issue 14, item 1).
        if self._nvml_made is None:
            self._nvml_made = Nvml()
        return self._nvml_made

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        vm = _read(psutil.virtual_memory)
        count = self._nvml.count() if self._nvml.available else None
        if self._nvml.available is False:
            gpu_available: int | None = 0
        elif count is None:
            gpu_available = None
        else:
            gpu_available = 1 if count > 0 else 0
        return [{
            "seq": seq,
            "timestamp_unix_ns": now_ns,
            "cpu_percent": self._cpu.percent(),
            "ram_used_bytes": float(vm.total - vm.available) if vm is not None else None,
            "ram_total_bytes": float(vm.total) if vm is not None else None,
            "gpu_available": gpu_available,
            "gpu_count": count,
            "gpus": self._nvml.gpus(),
        }]

    def close(self) -> None:
        """Release NVML (if a collect loaded it)."""
        if self._nvml_made is not None:
            self._nvml_made.close()
