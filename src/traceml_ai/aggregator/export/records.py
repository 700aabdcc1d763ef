"""Export records: one frozen dataclass per projection table the aggregator writes (000 seed, "Records").

A record's fields are its table's columns in table order (``telemetry.schema``), minus the
autoincrement ``id``; :class:`StepTimeRecord` is the one record that differs from its row, in one
field: it carries the decoded ``events`` map in place of the ``events_json`` text. Every class
carries ``STREAM`` (its stream name), ``SCHEMA_VERSION`` (1), ``COLUMNS`` (its field names in
order) and ``TABLE`` (the SQLite table whose rows it mirrors).

Units: ``*_unix_ns`` integer ns since the Unix epoch, ``*_ms`` milliseconds, ``*_bytes`` bytes,
``*_percent`` / ``util`` percent, ``temperature_c`` degrees C, ``power_*_w`` watts. An unavailable
value is None; a measured zero stays 0.

Records are built from projected rows by :func:`from_row` (and the same two steps inline in
:func:`~traceml_ai.aggregator.export.payload.build_records`): a plain, unfrozen twin of the class
with the same fields takes the row, then the instance becomes the frozen class. The frozen
``__init__`` costs one ``object.__setattr__`` call per field; the twin's plain assignments fill the
instance's attribute storage directly, about 2.5 times faster per record
(benchmarks/bench_export.py). The result is an ordinary frozen instance: equal to one made by
``__init__``, and assignments raise ``FrozenInstanceError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from traceml_ai.telemetry import schema

SCHEMA_VERSION = 1
"""The version of the record field layout; bumped when a field is added, removed or changes meaning."""

EventStats = dict[str, Any]
"""``events[name][device]``: ``is_gpu`` (bool), ``duration_ms``, ``cpu_ms``, ``gpu_ms`` (float, ms),
``n_calls`` (int); each None when the rank did not send it."""


class _Record:
    """What every record class has: ``STREAM``, ``SCHEMA_VERSION``, ``COLUMNS``, ``TABLE``, ``to_dict``."""

    STREAM: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION
    COLUMNS: ClassVar[tuple[str, ...]]
    TABLE: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """``{"stream": STREAM, "schema_version": SCHEMA_VERSION, <every field in COLUMNS order>}``.

        Values are the record's own (the ``events`` map of a step record is not copied); None stays None.
        """
        return {"stream": self.STREAM, "schema_version": self.SCHEMA_VERSION, **self.__dict__}


@dataclass(frozen=True)
class StepTimeRecord(_Record):
    """One step of one rank: the step-time breakdown by phase and device (table ``step_time_samples``).

    ``events[name][device]`` holds ``is_gpu``, ``duration_ms``, ``cpu_ms``, ``gpu_ms`` (ms) and
    ``n_calls``; the map is empty, never None, when the row had no events. ``cpu_ms`` is CPU wall
    time and ``gpu_ms`` CUDA event time, each summed over the step's calls. Key: ``(global_rank, step)``.
    """

    STREAM: ClassVar[str] = "step_time"
    TABLE: ClassVar[str] = schema.STEP_TIME_SAMPLES.name

    observed_timestamp_unix_ns: int
    rank: int | None
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    timestamp_unix_ns: int | None
    seq: int | None
    step: int | None
    events: dict[str, dict[str, EventStats]]


@dataclass(frozen=True)
class StepMemoryRecord(_Record):
    """One step and device of one rank: PyTorch's peak allocated and reserved memory in bytes
    (table ``step_memory_samples``). Key: ``(global_rank, device, step)``."""

    STREAM: ClassVar[str] = "step_memory"
    TABLE: ClassVar[str] = schema.STEP_MEMORY_SAMPLES.name

    observed_timestamp_unix_ns: int
    rank: int | None
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    timestamp_unix_ns: int | None
    seq: int | None
    device: str | None
    step: int | None
    peak_alloc_bytes: float | None
    peak_reserved_bytes: float | None


@dataclass(frozen=True)
class SystemRecord(_Record):
    """One host-level system snapshot sent by a node's local rank 0 (table ``system_samples``).

    ``cpu_percent`` is host CPU utilization in percent; ``gpu_available`` an integer boolean (1/0).
    No ``rank`` field: the row has none. Its GPUs are separate :class:`SystemGpuRecord` records.
    Key: ``(global_rank, seq)``.
    """

    STREAM: ClassVar[str] = "system"
    TABLE: ClassVar[str] = schema.SYSTEM_SAMPLES.name

    observed_timestamp_unix_ns: int
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    timestamp_unix_ns: int | None
    seq: int | None
    cpu_percent: float | None
    ram_used_bytes: float | None
    ram_total_bytes: float | None
    gpu_available: int | None
    gpu_count: int | None


@dataclass(frozen=True)
class SystemGpuRecord(_Record):
    """One GPU of a system snapshot (table ``system_gpu_samples``): ``util`` in percent,
    ``temperature_c`` in degrees C, power in watts; ``gpu_idx`` is the GPU's position in the
    snapshot, never None. No ``rank`` field. Key: ``(global_rank, seq, gpu_idx)``."""

    STREAM: ClassVar[str] = "system_gpu"
    TABLE: ClassVar[str] = schema.SYSTEM_GPU_SAMPLES.name

    observed_timestamp_unix_ns: int
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    timestamp_unix_ns: int | None
    seq: int | None
    gpu_idx: int
    util: float | None
    mem_used_bytes: float | None
    mem_total_bytes: float | None
    temperature_c: float | None
    power_usage_w: float | None
    power_limit_w: float | None


@dataclass(frozen=True)
class ProcessRecord(_Record):
    """One training-process snapshot of one rank (table ``process_samples``).

    ``cpu_percent`` is in percent of one logical core (can exceed 100); ``ram_used_bytes`` is the
    resident memory; ``gpu_mem_*`` are PyTorch's allocated, reserved and total memory on the
    process's device (bytes); ``gpu_available`` an integer boolean. Key: ``(global_rank, seq)``.
    """

    STREAM: ClassVar[str] = "process"
    TABLE: ClassVar[str] = schema.PROCESS_SAMPLES.name

    observed_timestamp_unix_ns: int
    rank: int | None
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    timestamp_unix_ns: int | None
    seq: int | None
    cpu_percent: float | None
    cpu_logical_core_count: int | None
    ram_used_bytes: float | None
    ram_total_bytes: float | None
    gpu_available: int | None
    gpu_count: int | None
    gpu_device_index: int | None
    gpu_mem_used_bytes: float | None
    gpu_mem_reserved_bytes: float | None
    gpu_mem_total_bytes: float | None


@dataclass(frozen=True)
class RuntimeEnvironmentRecord(_Record):
    """The runtime environment of one rank: topology, torch.distributed state, detected training
    strategy (table ``runtime_environment``); ``pid`` sits between ``hostname`` and
    ``timestamp_unix_ns``; ``distributed_initialized`` is an integer boolean. Key: ``global_rank``."""

    STREAM: ClassVar[str] = "runtime_environment"
    TABLE: ClassVar[str] = schema.RUNTIME_ENVIRONMENT_TABLE.name

    observed_timestamp_unix_ns: int
    rank: int | None
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    pid: int | None
    timestamp_unix_ns: int | None
    seq: int | None
    topology: str | None
    distributed_initialized: int | None
    distributed_backend: str | None
    training_strategy: str | None
    strategy_source: str | None
    strategy_confidence: str | None


@dataclass(frozen=True)
class StdoutStderrRecord(_Record):
    """One captured stdout or stderr line of a rank (table ``stdout_stderr_samples``); ``rank`` is the
    rank's global_rank; ``line`` is never None or empty. No key: read the lines in file order."""

    STREAM: ClassVar[str] = "stdout_stderr"
    TABLE: ClassVar[str] = schema.STDOUT_STDERR_SAMPLES.name

    observed_timestamp_unix_ns: int
    rank: int | None
    timestamp_unix_ns: int | None
    line: str


ExportRecord = (
    StepTimeRecord
    | StepMemoryRecord
    | SystemRecord
    | SystemGpuRecord
    | ProcessRecord
    | RuntimeEnvironmentRecord
    | StdoutStderrRecord
)
"""Any of the seven record types."""

RECORD_TYPES: tuple[type[ExportRecord], ...] = (
    StepTimeRecord,
    StepMemoryRecord,
    SystemRecord,
    SystemGpuRecord,
    ProcessRecord,
    RuntimeEnvironmentRecord,
    StdoutStderrRecord,
)
"""The record classes in the order of the 000 seed's record table (the writer's table order)."""

BUILDERS: dict[type[_Record], Callable[..., Any]] = {}
"""Each record class's unfrozen twin: ``BUILDERS[cls](*row)`` then ``__class__ = cls`` (see module doc)."""

for _cls in RECORD_TYPES:
    _cls.COLUMNS = tuple(f.name for f in dataclasses.fields(_cls))
    BUILDERS[_cls] = dataclasses.make_dataclass(
        f"_{_cls.__name__}Builder", [(name, Any) for name in _cls.COLUMNS], eq=False, repr=False
    )
del _cls

RECORD_STREAMS: tuple[str, ...] = tuple(cls.STREAM for cls in RECORD_TYPES)
"""Every record ``STREAM`` name, in record table order."""

RECORD_TYPE_BY_TABLE: dict[str, type[ExportRecord]] = {cls.TABLE: cls for cls in RECORD_TYPES}
"""The record class of each SQLite table name."""

RECORD_TYPE_BY_STREAM: dict[str, type[ExportRecord]] = {cls.STREAM: cls for cls in RECORD_TYPES}
"""The record class of each record ``STREAM`` name."""

_R = TypeVar("_R", bound=_Record)


def from_row(cls: type[_R], row: tuple[Any, ...]) -> _R:
    """A ``cls`` record from one projected row (the table's columns in order, without ``id``).

    The values are taken as they are: the projection already gave each column its type.

    Raises:
        ValueError: ``row`` does not have one value per field of ``cls`` (it does not fit its record).
    """
    try:
        record = BUILDERS[cls](*row)
    except TypeError:
        raise ValueError(
            f"a {cls.TABLE} row has {len(row)} values for the {len(cls.COLUMNS)} fields of {cls.__name__}"
        ) from None
    record.__class__ = cls
    return record  # type: ignore[no-any-return]
