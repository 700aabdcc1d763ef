"""Real telemetry.sqlite files for the diagnose tests, written with the schema of
``traceml_ai.telemetry.schema`` (``Table.create_sql()`` / ``insert_sql()``) and realistic rows.

:class:`TelemetryDB` writes single rows; :func:`write_run` writes a whole synthetic run: N steps for
R ranks with chosen phase times (ms), per-step memory, and process/system snapshots every
``interval_s`` of simulated time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from traceml_ai.telemetry import schema

GIB = 1024**3
MIB = 1024**2
T0_NS = 1_764_000_000_000_000_000  # late 2025, ns since the Unix epoch
HOST = "node-a"

HEALTHY_CPU: dict[str, float] = {
    schema.DATALOADER_NEXT: 1.0,
    schema.H2D: 0.05,
    schema.FORWARD: 4.0,
    schema.BACKWARD: 7.0,
    schema.OPTIMIZER_STEP: 2.0,
}
"""Median phase times (ms) of a healthy small CPU training step; 'other' overhead is added on top."""


def _values(table: schema.Table, **fields: Any) -> tuple[Any, ...]:
    unknown = set(fields) - set(table.column_names)
    assert not unknown, f"{table.name} has no columns {unknown}"
    return tuple(fields.get(name) for name in table.column_names)


def _identity(rank: int | None, world_size: int | None) -> dict[str, Any]:
    return {
        "rank": rank, "global_rank": rank, "local_rank": rank, "world_size": world_size,
        "local_world_size": world_size, "node_rank": 0, "hostname": HOST,
    }


class TelemetryDB:
    """A telemetry database written like the aggregator writes it (WAL, the seven tables)."""

    def __init__(self, path: Path, *, tables: tuple[schema.Table, ...] = schema.TABLES) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        for table in tables:
            self.conn.execute(table.create_sql())
        self.conn.execute(f"PRAGMA user_version={schema.SCHEMA_USER_VERSION}")
        self.conn.commit()

    def _insert(self, table: schema.Table, **fields: Any) -> None:
        self.conn.execute(table.insert_sql(), _values(table, observed_timestamp_unix_ns=T0_NS, **fields))

    def step(self, rank: int | None, step: int | None, events: Mapping[str, Any] | str | None, *,
             ts_ns: int | None, world_size: int | None = 1, seq: int = 0) -> None:
        text = events if isinstance(events, str) or events is None else orjson.dumps(events).decode()
        self._insert(schema.STEP_TIME_SAMPLES, **_identity(rank, world_size), timestamp_unix_ns=ts_ns, seq=seq,
                     step=step, events_json=text)

    def memory(self, rank: int | None, step: int, device: str, alloc: float | None, reserved: float | None, *,
               ts_ns: int | None, world_size: int | None = 1) -> None:
        self._insert(schema.STEP_MEMORY_SAMPLES, **_identity(rank, world_size), timestamp_unix_ns=ts_ns, seq=0,
                     device=device, step=step, peak_alloc_bytes=alloc, peak_reserved_bytes=reserved)

    def process(self, rank: int | None, seq: int, *, ts_ns: int | None, rss: float | None,
                ram_total: float | None = 64 * GIB, cpu: float | None = 100.0, gpu_index: int | None = None,
                gpu_total: float | None = None, world_size: int | None = 1) -> None:
        self._insert(schema.PROCESS_SAMPLES, **_identity(rank, world_size), timestamp_unix_ns=ts_ns, seq=seq,
                     cpu_percent=cpu, cpu_logical_core_count=8, ram_used_bytes=rss, ram_total_bytes=ram_total,
                     gpu_available=1 if gpu_index is not None else 0, gpu_count=1 if gpu_index is not None else 0,
                     gpu_device_index=gpu_index, gpu_mem_used_bytes=None, gpu_mem_reserved_bytes=None,
                     gpu_mem_total_bytes=gpu_total)

    def system(self, seq: int, *, ts_ns: int | None, cpu: float | None, ram_used: float | None,
               ram_total: float | None = 64 * GIB, gpus: list[dict[str, Any]] | None = None,
               world_size: int | None = 1) -> None:
        ident = {k: v for k, v in _identity(0, world_size).items() if k != "rank"}
        self._insert(schema.SYSTEM_SAMPLES, **ident, timestamp_unix_ns=ts_ns, seq=seq, cpu_percent=cpu,
                     ram_used_bytes=ram_used, ram_total_bytes=ram_total, gpu_available=1 if gpus else 0,
                     gpu_count=len(gpus or []))
        for idx, gpu in enumerate(gpus or []):
            self._insert(schema.SYSTEM_GPU_SAMPLES, **ident, timestamp_unix_ns=ts_ns, seq=seq, gpu_idx=idx,
                         util=gpu.get("util"), mem_used_bytes=gpu.get("mem_used"),
                         mem_total_bytes=gpu.get("mem_total"), temperature_c=gpu.get("temp", 60.0),
                         power_usage_w=gpu.get("power", 200.0), power_limit_w=gpu.get("power_limit", 400.0))

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.commit()
        self.conn.close()


def cpu_events(phases: Mapping[str, float | None]) -> dict[str, Any]:
    """An events map as a CPU rank sends it: CPU wall time, no GPU time."""
    return {name: {"cpu": {"is_gpu": False, "duration_ms": ms, "cpu_ms": ms, "gpu_ms": None, "n_calls": 1}}
            for name, ms in phases.items()}


def gpu_events(phases: Mapping[str, float | None]) -> dict[str, Any]:
    """An events map as a GPU rank sends it: the dataloader on the CPU clock, the rest on CUDA events
    (whose CPU time is only the launch time)."""
    out: dict[str, Any] = {}
    for name, ms in phases.items():
        if name == schema.DATALOADER_NEXT:
            out[name] = {"cpu": {"is_gpu": False, "duration_ms": ms, "cpu_ms": ms, "gpu_ms": None, "n_calls": 1}}
        else:
            launch = None if ms is None else ms * 0.2
            out[name] = {"cuda:0": {"is_gpu": True, "duration_ms": ms, "cpu_ms": launch, "gpu_ms": ms, "n_calls": 1}}
    return out


PhaseFn = Callable[[int, int], Mapping[str, float]]
"""(rank, step) → median phase times in ms (built-in phase names; 'other' is overhead outside phases)."""


@dataclass
class RunSpec:
    """A synthetic run. Callables get (rank, step) or (rank, seconds since start)."""

    ranks: int = 1
    steps: int = 60
    phases: PhaseFn = field(default=lambda rank, step: HEALTHY_CPU)
    other_ms: float = 0.5
    noise: float = 0.05
    dataloader_outside_step: bool = False
    gpu: bool = False
    peak_alloc: Callable[[int, int], float | None] | None = None
    peak_reserved: Callable[[int, int], float | None] | None = None
    gpu_total: float = 80 * GIB
    gpu_util: Callable[[float], float] | None = None
    gpu_temp: Callable[[float], float | None] = lambda t: 60.0
    """Each GPU's temperature (degrees Celsius) at a snapshot; None: not reported."""
    gpu_power: Callable[[float], float | None] = lambda t: 200.0
    """Each GPU's power draw (watts) at a snapshot; None: not reported."""
    gpu_power_limit: float | None = 400.0
    rss: Callable[[int, float], float] | None = lambda rank, t: 900 * MIB
    ram_total: float = 64 * GIB
    host_cpu: Callable[[float], float] | None = lambda t: 55.0
    proc_cpu: Callable[[int, float], float] = lambda rank, t: 100.0
    """A rank's CPU percent of one core (the host has 8 logical cores)."""
    host_ram_used: Callable[[float], float] | None = lambda t: 20 * GIB
    interval_s: float = 0.25
    seed: int = 0


def write_run(run_dir: Path, spec: RunSpec) -> Path:
    """Write ``<run_dir>/aggregator/telemetry.sqlite`` for ``spec``; returns the database path.

    Each rank's clock advances by its iteration time; phase times get multiplicative noise of
    relative size ``spec.noise`` (seeded). Snapshots cover the run's simulated duration.
    """
    rng = np.random.default_rng(spec.seed)
    db = TelemetryDB(run_dir / "aggregator" / "telemetry.sqlite")
    end_ns = T0_NS
    for rank in range(spec.ranks):
        t = T0_NS
        for step in range(spec.steps):
            base = dict(spec.phases(rank, step))
            other = max(0.0, base.pop("other", spec.other_ms))
            phases = {k: float(v * (1 + spec.noise * rng.standard_normal())) for k, v in base.items()}
            phases = {k: max(0.0, v) for k, v in phases.items()}
            inner = sum(phases.values())
            if spec.dataloader_outside_step:
                step_ms = inner - phases.get(schema.DATALOADER_NEXT, 0.0) + other
                iteration = step_ms + phases.get(schema.DATALOADER_NEXT, 0.0)
            else:
                step_ms = inner + other
                iteration = step_ms
            t += int(iteration * 1e6)
            events = (gpu_events if spec.gpu else cpu_events)({**phases, schema.STEP: step_ms})
            db.step(rank, step, events, ts_ns=t, world_size=spec.ranks, seq=step)
            if spec.gpu:
                alloc = spec.peak_alloc(rank, step) if spec.peak_alloc else 10 * GIB
                reserved = spec.peak_reserved(rank, step) if spec.peak_reserved else 12 * GIB
                db.memory(rank, step, f"cuda:{rank}", alloc, reserved, ts_ns=t, world_size=spec.ranks)
            else:
                db.memory(rank, step, "cpu", None, None, ts_ns=t, world_size=spec.ranks)
        end_ns = max(end_ns, t)
    n_snap = int((end_ns - T0_NS) / (spec.interval_s * 1e9)) + 1
    for seq in range(n_snap):
        ts = T0_NS + int(seq * spec.interval_s * 1e9)
        secs = seq * spec.interval_s
        for rank in range(spec.ranks):
            if spec.rss is not None:
                db.process(rank, seq, ts_ns=ts, rss=spec.rss(rank, secs), ram_total=spec.ram_total,
                           cpu=spec.proc_cpu(rank, secs),
                           gpu_index=rank if spec.gpu else None, gpu_total=spec.gpu_total if spec.gpu else None,
                           world_size=spec.ranks)
        if spec.host_cpu is not None or spec.gpu_util is not None:
            gpus = None
            if spec.gpu:
                util = spec.gpu_util(secs) if spec.gpu_util else 92.0
                gpus = [{"util": util, "mem_used": 12 * GIB, "mem_total": spec.gpu_total, "temp": spec.gpu_temp(secs),
                         "power": spec.gpu_power(secs), "power_limit": spec.gpu_power_limit}
                        for _ in range(spec.ranks)]
            db.system(seq, ts_ns=ts, cpu=spec.host_cpu(secs) if spec.host_cpu else None,
                      ram_used=spec.host_ram_used(secs) if spec.host_ram_used else None, ram_total=spec.ram_total,
                      gpus=gpus, world_size=spec.ranks)
    db.close()
    return db.path
