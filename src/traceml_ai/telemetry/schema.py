"""Streams, tables and columns of TraceML telemetry (DESIGN §3.1, 000 seed "Records").

A rank sends rows grouped by *stream* (``step_time``, ``step_memory``, ``system``, ``process``,
``runtime_environment``, ``stdout_stderr``). The aggregator projects them into seven SQLite tables
whose columns are the 000 seed's record fields in order, after ``id INTEGER PRIMARY KEY
AUTOINCREMENT``; ``step_time_samples`` stores the events map as ``events_json`` text. The ``system``
stream fills two tables: ``system_samples`` and one ``system_gpu_samples`` row per GPU.

Units: every ``*_unix_ns`` is integer nanoseconds since the Unix epoch, ``*_ms`` milliseconds,
``*_bytes`` bytes, ``*_percent`` / ``util`` percent, ``temperature_c`` degrees C, ``power_*_w`` watts.
A value that was not measured is NULL, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- streams a rank sends (the keys of an envelope's "tables") ---------------------------------------

STEP_TIME = "step_time"
STEP_MEMORY = "step_memory"
SYSTEM = "system"
PROCESS = "process"
RUNTIME_ENVIRONMENT = "runtime_environment"
STDOUT_STDERR = "stdout_stderr"

RANK_STREAMS: tuple[str, ...] = (STEP_TIME, STEP_MEMORY, SYSTEM, PROCESS, RUNTIME_ENVIRONMENT, STDOUT_STDERR)

# -- built-in phase event names (DESIGN §3.1) ------------------------------------------------------

PHASE_PREFIX = "traceml:"
DATALOADER_NEXT = "traceml:dataloader_next"
H2D = "traceml:h2d"
FORWARD = "traceml:forward"
BACKWARD = "traceml:backward"
OPTIMIZER_STEP = "traceml:optimizer_step"
STEP = "traceml:step"
BUILTIN_PHASES: tuple[str, ...] = (DATALOADER_NEXT, H2D, FORWARD, BACKWARD, OPTIMIZER_STEP, STEP)

# -- identity fields of envelope "meta" ---------------------------------------------------------------

META_FIELDS: tuple[str, ...] = (
    "session_id",
    "global_rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "hostname",
    "pid",
    "sampler",
)


@dataclass(frozen=True)
class Column:
    """One SQLite column: its name and declared type (``INTEGER``, ``REAL`` or ``TEXT``)."""

    name: str
    sql_type: str


@dataclass(frozen=True)
class Table:
    """One projection table: its SQLite name, the stream whose rows fill it and its columns.

    ``columns`` excludes the leading ``id INTEGER PRIMARY KEY AUTOINCREMENT``; in order they are the
    000 seed's record fields (with ``events_json`` in place of ``events`` for ``step_time_samples``).
    ``record_stream`` is the record's ``STREAM`` (``system_gpu`` for ``system_gpu_samples``).
    """

    name: str
    stream: str
    record_stream: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def create_sql(self) -> str:
        """``CREATE TABLE IF NOT EXISTS`` for this table (idempotent, DESIGN §3.3)."""
        cols = ", ".join(f"{c.name} {c.sql_type}" for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})"

    def insert_sql(self) -> str:
        """``INSERT`` with one ``?`` per column (``id`` left to SQLite)."""
        names = ", ".join(self.column_names)
        marks = ", ".join("?" for _ in self.columns)
        return f"INSERT INTO {self.name} ({names}) VALUES ({marks})"


def _cols(*spec: str) -> tuple[Column, ...]:
    out = []
    for item in spec:
        name, sql_type = item.split(":")
        out.append(Column(name, sql_type))
    return tuple(out)


_OBSERVED = ("observed_timestamp_unix_ns:INTEGER",)
_IDENTITY = (
    "global_rank:INTEGER",
    "local_rank:INTEGER",
    "world_size:INTEGER",
    "local_world_size:INTEGER",
    "node_rank:INTEGER",
    "hostname:TEXT",
)
_TIME = ("timestamp_unix_ns:INTEGER", "seq:INTEGER")
_WITH_RANK = (*_OBSERVED, "rank:INTEGER", *_IDENTITY)
_NO_RANK = (*_OBSERVED, *_IDENTITY)

STEP_TIME_SAMPLES = Table(
    "step_time_samples", STEP_TIME, "step_time", _cols(*_WITH_RANK, *_TIME, "step:INTEGER", "events_json:TEXT")
)
STEP_MEMORY_SAMPLES = Table(
    "step_memory_samples",
    STEP_MEMORY,
    "step_memory",
    _cols(*_WITH_RANK, *_TIME, "device:TEXT", "step:INTEGER", "peak_alloc_bytes:REAL", "peak_reserved_bytes:REAL"),
)
SYSTEM_SAMPLES = Table(
    "system_samples",
    SYSTEM,
    "system",
    _cols(
        *_NO_RANK,
        *_TIME,
        "cpu_percent:REAL",
        "ram_used_bytes:REAL",
        "ram_total_bytes:REAL",
        "gpu_available:INTEGER",
        "gpu_count:INTEGER",
    ),
)
SYSTEM_GPU_SAMPLES = Table(
    "system_gpu_samples",
    SYSTEM,
    "system_gpu",
    _cols(
        *_NO_RANK,
        *_TIME,
        "gpu_idx:INTEGER",
        "util:REAL",
        "mem_used_bytes:REAL",
        "mem_total_bytes:REAL",
        "temperature_c:REAL",
        "power_usage_w:REAL",
        "power_limit_w:REAL",
    ),
)
PROCESS_SAMPLES = Table(
    "process_samples",
    PROCESS,
    "process",
    _cols(
        *_WITH_RANK,
        *_TIME,
        "cpu_percent:REAL",
        "cpu_logical_core_count:INTEGER",
        "ram_used_bytes:REAL",
        "ram_total_bytes:REAL",
        "gpu_available:INTEGER",
        "gpu_count:INTEGER",
        "gpu_device_index:INTEGER",
        "gpu_mem_used_bytes:REAL",
        "gpu_mem_reserved_bytes:REAL",
        "gpu_mem_total_bytes:REAL",
    ),
)
RUNTIME_ENVIRONMENT_TABLE = Table(
    "runtime_environment",
    RUNTIME_ENVIRONMENT,
    "runtime_environment",
    _cols(
        *_WITH_RANK,
        "pid:INTEGER",
        *_TIME,
        "topology:TEXT",
        "distributed_initialized:INTEGER",
        "distributed_backend:TEXT",
        "training_strategy:TEXT",
        "strategy_source:TEXT",
        "strategy_confidence:TEXT",
    ),
)
STDOUT_STDERR_SAMPLES = Table(
    "stdout_stderr_samples",
    STDOUT_STDERR,
    "stdout_stderr",
    _cols(*_OBSERVED, "rank:INTEGER", "timestamp_unix_ns:INTEGER", "line:TEXT"),
)

# The writer's table order (000 seed: within one envelope, records follow this order).
TABLES: tuple[Table, ...] = (
    STEP_TIME_SAMPLES,
    STEP_MEMORY_SAMPLES,
    SYSTEM_SAMPLES,
    SYSTEM_GPU_SAMPLES,
    PROCESS_SAMPLES,
    RUNTIME_ENVIRONMENT_TABLE,
    STDOUT_STDERR_SAMPLES,
)
TABLES_BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}

# PRAGMA user_version of telemetry.sqlite (DESIGN §3.3); bump with a migration when columns change.
SCHEMA_USER_VERSION = 1
