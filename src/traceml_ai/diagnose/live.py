"""The live tail of a run's ``aggregator/telemetry.sqlite`` and the step-time breakdown over its
last steps, for the terminal view of ``traceml run --mode cli`` (DESIGN §3.5; docs/diagnoses.md).

:class:`TelemetryTail` reads only what is new since its last :meth:`~TelemetryTail.refresh` (the
aggregator is the only writer; the database is opened read-only through
:func:`traceml_ai.telemetry.sqlite.read_only_uri`) and turns rows into the same typed samples as
:func:`traceml_ai.diagnose.read_telemetry`, with the same phase arithmetic (GPU, else CPU, else
the legacy ``duration_ms``; several devices: the longest). :func:`recent_breakdown` derives the
iteration and *other* with :func:`~traceml_ai.diagnose.timeline.build_step_table` and picks the
worst rank with the straggler rule's measure (:func:`~traceml_ai.diagnose.rules.local_work`, the
work outside backward), so the live view and the diagnoses cannot disagree on what a step costs.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traceml_ai.diagnose.readers import (
    GPU_COLS,
    PROCESS_COLS,
    STEP_COLS,
    SYSTEM_COLS,
    GpuSample,
    ProcessSample,
    StepSample,
    SystemSample,
    gpu_sample,
    process_sample,
    rank_key,
    step_sample,
    system_sample,
)
from traceml_ai.diagnose.rules import local_work, rank_skew
from traceml_ai.diagnose.timeline import ITERATION, OTHER, build_step_table
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.sqlite import read_only_uri

RECENT_STEPS = 50
"""Steps per rank the breakdown is computed over."""
MAX_ROWS_PER_REFRESH = 20000
"""New step rows read per :meth:`TelemetryTail.refresh` at most (the rest come with the next one)."""


class TelemetryTail:
    """Incremental read-only reader of a live telemetry database.

    After each :meth:`refresh`: ``steps`` holds the last :data:`RECENT_STEPS` step samples of each
    rank (rows without a rank are left out: the view compares ranks), ``last_step`` each rank's
    highest step, ``process`` each rank's newest process sample, ``system`` the newest host sample
    and ``gpus`` that snapshot's GPUs, ``peaks`` the newest step's peak allocated bytes per
    ``(rank, device)``. ``error`` is the last SQLite error (tables not created yet, a busy
    moment), None after a good read. Never raises for the database's state.
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._last_step_id = 0
        self.steps: dict[int, deque[StepSample]] = defaultdict(lambda: deque(maxlen=RECENT_STEPS))
        self.last_step: dict[int, int] = {}
        self.process: dict[int | None, ProcessSample] = {}
        self.system: SystemSample | None = None
        self.gpus: tuple[GpuSample, ...] = ()
        self.peaks: dict[tuple[int | None, str | None], float | None] = {}
        self.error: str | None = None
        self._breakdown: tuple[int, Breakdown | None] | None = None

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None:
            if not self.db_path.exists():
                return None
            self._conn = sqlite3.connect(read_only_uri(self.db_path), uri=True, timeout=0.2)
        return self._conn

    def refresh(self) -> None:
        """Read what was written since the last call (see the class docs)."""
        try:
            conn = self._connect()
            if conn is None:
                return
            self._read(conn)
            self.error = None
        except sqlite3.Error as exc:
            # Tables appear when the first rows arrive; a busy moment is retried next time.
            self.error = str(exc)
            if self._conn is not None and "no such table" not in str(exc):
                self._conn.close()
                self._conn = None

    def _read(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute(
            f"SELECT id, {STEP_COLS} FROM {schema.STEP_TIME_SAMPLES.name} WHERE id > ? ORDER BY id LIMIT ?",
            (self._last_step_id, MAX_ROWS_PER_REFRESH),
        ).fetchall()
        for row_id, *row in rows:
            self._last_step_id = row_id
            sample = step_sample(tuple(row))
            if type(sample) is not StepSample or sample.rank is None:
                continue
            self.steps[sample.rank].append(sample)
            self.last_step[sample.rank] = max(sample.step, self.last_step.get(sample.rank, sample.step))
        for row in conn.execute(
            f"SELECT {PROCESS_COLS} FROM {schema.PROCESS_SAMPLES.name} "
            f"WHERE id IN (SELECT MAX(id) FROM {schema.PROCESS_SAMPLES.name} GROUP BY global_rank)"
        ):
            p = process_sample(row)
            self.process[p.rank] = p
        sys_row = conn.execute(
            f"SELECT {SYSTEM_COLS} FROM {schema.SYSTEM_SAMPLES.name} ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if sys_row:
            self.system = system_sample(sys_row)
            self.gpus = tuple(
                g for row in conn.execute(
                    f"SELECT {GPU_COLS} FROM {schema.SYSTEM_GPU_SAMPLES.name} WHERE seq = ? AND global_rank IS ? "
                    "ORDER BY gpu_idx", (sys_row[2], sys_row[0]))
                if (g := gpu_sample(row)) is not None
            )
        for rank, device, peak in conn.execute(
            f"SELECT global_rank, device, peak_alloc_bytes FROM {schema.STEP_MEMORY_SAMPLES.name} "
            f"WHERE id IN (SELECT MAX(id) FROM {schema.STEP_MEMORY_SAMPLES.name} GROUP BY global_rank, device)"
        ):
            self.peaks[(rank, device)] = peak if isinstance(peak, (int, float)) else None

    def breakdown(self) -> Breakdown | None:
        """:func:`recent_breakdown` of :attr:`steps`, computed again only after new step rows came
        (the view draws more often than rows arrive; a breakdown of 64 ranks costs tens of ms)."""
        if self._breakdown is None or self._breakdown[0] != self._last_step_id:
            self._breakdown = (self._last_step_id, recent_breakdown(self.steps))
        return self._breakdown[1]

    def close(self) -> None:
        """Close the connection (a later :meth:`refresh` opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True)
class PhaseRow:
    """One row of the breakdown: a phase's median over the recent steps (ms) on the median rank and
    on the worst rank, its ``share`` of the median rank's iteration (fraction; None for the
    iteration itself) and ``skew``, the slowest rank's median over the median of all ranks
    (ratio; None with one rank)."""

    name: str
    median_rank_ms: float | None
    worst_rank_ms: float | None
    share: float | None
    skew: float | None


@dataclass(frozen=True)
class Breakdown:
    """The step-time breakdown over each rank's recent steps: ``rows`` are the built-in phases in
    loop order, ``other``, user regions (sorted), then ``iteration`` last. ``median_rank`` is the
    rank with the median iteration (the lower one of an even count); ``worst_rank`` the slowest by
    the straggler rule's measure (:func:`~traceml_ai.diagnose.rules.rank_skew`; with too few steps
    for it, the one with the longest work outside backward, the iteration without backward)."""

    ranks: int
    median_rank: int | None
    worst_rank: int | None
    rows: tuple[PhaseRow, ...]


def recent_breakdown(steps: dict[int, deque[StepSample]]) -> Breakdown | None:
    """The :class:`Breakdown` of the step samples per rank (e.g. :attr:`TelemetryTail.steps`);
    None when no rank has a step."""
    samples = [s for rank_steps in steps.values() for s in rank_steps]
    if not samples:
        return None
    table = build_step_table(samples, warmup_steps=0)
    names = (*table.phase_names, ITERATION)
    per_rank: dict[int | None, dict[str, float]] = {}
    work: dict[int | None, float] = {}
    for tl in table.ranks:
        per_rank[tl.rank] = {name: m for name in names if (m := _median(tl.phase(name))) is not None}
        w = _median(local_work(tl))
        if w is not None:
            work[tl.rank] = w
    ranks = sorted(per_rank, key=lambda r: (per_rank[r].get(ITERATION, 0.0), rank_key(r)))
    median_rank = ranks[(len(ranks) - 1) // 2]
    # The straggler rule's measure (rules.rank_skew), as the summary's worst_rank and the viewer;
    # over too few steps for it, the rank with the most work outside backward.
    measured = rank_skew(table.ranks)
    worst_rank = (measured.rank if not isinstance(measured, str)
                  else max(work, key=lambda r: work[r]) if work else ranks[-1])
    step_median = per_rank[median_rank].get(ITERATION)
    rows = []
    for name in names:
        values = [per_rank[r][name] for r in per_rank if name in per_rank[r]]
        if not values:
            continue
        mid = per_rank[median_rank].get(name)
        med_all = float(np.median(values))
        rows.append(PhaseRow(
            name=name,
            median_rank_ms=mid,
            worst_rank_ms=per_rank[worst_rank].get(name),
            share=mid / step_median if mid is not None and step_median and name != ITERATION else None,
            skew=max(values) / med_all if len(values) > 1 and med_all > 0 else None,
        ))
    return Breakdown(ranks=len(per_rank), median_rank=median_rank, worst_rank=worst_rank, rows=tuple(rows))


def _median(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else None


__all__ = ["OTHER", "RECENT_STEPS", "Breakdown", "PhaseRow", "TelemetryTail", "recent_breakdown"]
