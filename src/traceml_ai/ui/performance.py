"""The Performance view's per-rank data: ``GET /api/runs/{key}/performance`` (issue 13 item 2;
shape in docs/viewer-api.md).

The rest of the Performance view (diagnoses, the step breakdown by phase, memory, host and GPU, the
captured output, what was lost) comes from the inspector's telemetry answer
(:mod:`traceml_ai.ui.telemetry`), which the page asks for too. This module adds what that answer
does not hold: each rank's iteration time over the steps, for the ranks × steps heatmap, with the
steps put into at most :data:`MAX_BUCKETS` buckets (the median of each rank's steps in a bucket),
and the step broken down by phase on the rank the job waited for at each step (so the phases add up
to the step, which the inspector's per-phase maxima over ranks do not).

It reads ``aggregator/telemetry.sqlite`` through :func:`traceml_ai.diagnose.read_telemetry`
(read-only; never creates a file beside it) and the step math of
:mod:`traceml_ai.diagnose.timeline`, so the numbers are those of the final summary. Answers are
cached per run by the ``(mtime_ns, size)`` of the database and its ``-wal`` file.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from traceml_ai.diagnose.readers import Telemetry, read_telemetry
from traceml_ai.diagnose.stats import FloatArray
from traceml_ai.diagnose.summary import AGGREGATOR_DIR, TELEMETRY_DB
from traceml_ai.diagnose.thresholds import WARMUP_STEPS
from traceml_ai.diagnose.timeline import INNER_PHASES, OTHER, StepTable, build_step_table
from traceml_ai.runs.discovery import stat_confined
from traceml_ai.runs.model import RunSummary

MAX_BUCKETS = 240
"""Columns of the heatmap at most (steps are bucketed beyond that)."""
MAX_BREAKDOWN_POINTS = 1000
"""Points of the phase breakdown at most."""
CACHE_RUNS = 16


def performance(db_path: str, max_buckets: int = MAX_BUCKETS,
                max_points: int = MAX_BREAKDOWN_POINTS) -> dict[str, Any]:
    """``{"heatmap": heatmap(...), "breakdown": breakdown(...)}`` of one telemetry database, read once."""
    tel = read_telemetry(db_path)
    hm = _heatmap(tel, max_buckets)
    table = build_step_table(tel.steps, warmup_steps=0) if tel.status == "ok" else None
    return {"heatmap": hm, "breakdown": _breakdown(table, max_points) if table is not None else None}


def breakdown(db_path: str, max_points: int = MAX_BREAKDOWN_POINTS) -> dict[str, Any] | None:
    """The step of the job broken down by phase, per step: the phases of the rank whose iteration
    was the longest at that step (the one the others waited for), so the phases add up to that
    step's iteration time (``other`` is the rest). ``{"x": [step, ...], "bucket_steps": int,
    "series": [{"name": phase, "y": [ms|None, ...]}], "iteration": [ms|None, ...], "rank":
    [rank|None, ...]}``, the steps put into at most ``max_points`` buckets (the mean of each
    phase over a bucket's steps). None without step rows or a readable database."""
    tel = read_telemetry(db_path)
    if tel.status != "ok":
        return None
    return _breakdown(build_step_table(tel.steps, warmup_steps=0), max_points)


def _breakdown(table: StepTable, max_points: int) -> dict[str, Any] | None:
    ranks = [tl for tl in table.ranks if tl.steps.size]
    if not ranks:
        return None
    steps = np.unique(np.concatenate([tl.steps for tl in ranks]))
    n = steps.size
    iters = np.full((len(ranks), n), np.nan)
    where = [np.searchsorted(steps, tl.steps) for tl in ranks]
    for i, (tl, idx) in enumerate(zip(ranks, where, strict=True)):
        iters[i, idx] = tl.iteration_ms
    measured = np.isfinite(iters).any(axis=0)
    slowest = np.where(np.isfinite(iters), iters, -np.inf).argmax(axis=0)
    cols = np.arange(n)
    names = [name for name in table.phase_names if name in INNER_PHASES or name == OTHER]
    width = max(1, math.ceil(n / max_points))

    def bucketed(values: FloatArray) -> list[float | None]:
        pad = (-values.size) % width
        padded = np.concatenate([values, np.full(pad, np.nan)]).reshape(-1, width)
        counts = np.isfinite(padded).sum(axis=1)
        sums = np.nansum(padded, axis=1)
        return [round(float(t / c), 4) if c else None for t, c in zip(sums, counts, strict=True)]

    series = []
    for name in names:
        mat = np.full((len(ranks), n), np.nan)
        for i, (tl, idx) in enumerate(zip(ranks, where, strict=True)):
            mat[i, idx] = tl.phase(name)
        y = np.where(measured, mat[slowest, cols], np.nan)
        if np.isfinite(y).any():
            series.append({"name": name, "y": bucketed(y)})
    iteration = np.where(measured, iters[slowest, cols], np.nan)
    rank_of = [ranks[int(r)].rank if ok else None for r, ok in zip(slowest, measured, strict=True)]
    return {"x": [int(v) for v in steps[::width]], "bucket_steps": width, "series": series,
            "iteration": bucketed(iteration), "rank": rank_of[::width]}


def heatmap(db_path: str, max_buckets: int = MAX_BUCKETS) -> dict[str, Any]:
    """The per-rank step times of one telemetry database.

    Returns ``{"state": "ok|missing|empty|corrupt|unreadable", "detail": str|None, "ranks": [rank,
    ...], "first_step": int|None, "bucket_steps": int, "z": [[ms|None per bucket] per rank],
    "warmup_steps": int, "unit": "ms"}``: ``z[i][j]`` is the median iteration time (ms) of rank
    ``ranks[i]`` over steps ``first_step + j * bucket_steps`` .. ``+ bucket_steps - 1`` (None: no
    measured step there). Warm-up steps are included; ``warmup_steps`` says how many per rank the
    diagnosis skips (the page shades them). ``ranks`` holds None for a rank that sent no identity.
    Never raises for what is in the file.
    """
    return _heatmap(read_telemetry(db_path), max_buckets)


def _heatmap(tel: Telemetry, max_buckets: int) -> dict[str, Any]:
    out: dict[str, Any] = {"state": tel.status, "detail": tel.detail, "ranks": [], "first_step": None,
                           "bucket_steps": 1, "z": [], "warmup_steps": 0, "unit": "ms"}
    if tel.status != "ok":
        return out
    table = build_step_table(tel.steps, warmup_steps=0)  # warm-up included: the page shades it
    ranks = [tl for tl in table.ranks if tl.steps.size]
    out["warmup_steps"] = WARMUP_STEPS
    if not ranks:
        return out
    first = min(int(tl.steps.min()) for tl in ranks)
    last = max(int(tl.steps.max()) for tl in ranks)
    width = max(1, math.ceil((last - first + 1) / max_buckets))
    buckets = math.ceil((last - first + 1) / width)
    z: list[list[float | None]] = []
    for tl in ranks:
        idx = (tl.steps - first) // width
        order = np.argsort(idx, kind="stable")
        idx, values = idx[order], tl.iteration_ms[order]
        bounds = np.searchsorted(idx, np.arange(buckets + 1))
        row: list[float | None] = []
        for j in range(buckets):
            chunk = values[bounds[j]:bounds[j + 1]]
            chunk = chunk[np.isfinite(chunk)]
            row.append(round(float(np.median(chunk)), 4) if chunk.size else None)
        z.append(row)
    out.update(ranks=[tl.rank for tl in ranks], first_step=first, bucket_steps=width, z=z)
    return out


class PerformanceViews:
    """``GET /api/runs/{key}/performance`` answers, cached per run by the database's stamps."""

    def __init__(self, *, max_buckets: int = MAX_BUCKETS) -> None:
        self.max_buckets = max_buckets
        self._cache: OrderedDict[str, tuple[tuple[Any, ...], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def payload(self, run: RunSummary) -> dict[str, Any]:
        """The answer for a known run: ``{"heatmap": ..., "breakdown": ...}`` (see :func:`heatmap`
        and :func:`breakdown`); the heatmap's state is ``none`` for a run that was not captured."""
        agg = os.path.join(run.key, AGGREGATOR_DIR)
        db = os.path.join(agg, TELEMETRY_DB)
        st, reason = stat_confined(db, run.root)
        if st is None:
            state = "missing" if os.path.isdir(agg) and not os.path.islink(agg) else "none"
            detail = reason or ("this run was not captured by TraceML (no aggregator/ folder)" if state == "none"
                                else f"no {AGGREGATOR_DIR}/{TELEMETRY_DB} in this run")
            return {"heatmap": {"state": state, "detail": detail, "ranks": [], "first_step": None,
                                "bucket_steps": 1, "z": [], "warmup_steps": 0, "unit": "ms"}, "breakdown": None}
        wal, _ = stat_confined(db + "-wal", run.root)
        stamps = (st.st_mtime_ns, st.st_size, None if wal is None else (wal.st_mtime_ns, wal.st_size))
        with self._lock:
            hit = self._cache.get(run.key)
        if hit is not None and hit[0] == stamps:
            return hit[1]
        answer = performance(os.path.realpath(db), self.max_buckets)
        self.reads += 1
        with self._lock:
            self._cache[run.key] = (stamps, answer)
            self._cache.move_to_end(run.key)
            while len(self._cache) > CACHE_RUNS:
                self._cache.popitem(last=False)
        return answer
