"""The Performance view's per-rank data: ``GET /api/runs/{key}/performance`` (issue 13 item 2;
shape in docs/viewer-api.md).

The rest of the Performance view (diagnoses, the step breakdown by phase, memory, host and GPU, the
captured output, what was lost) comes from the inspector's telemetry answer
(:mod:`traceml_ai.ui.telemetry`), which the page asks for too. This module adds what that answer
does not hold: each rank's iteration time over the steps, for the ranks × steps heatmap, with the
steps put into at most :data:`MAX_BUCKETS` buckets (the median of each rank's steps in a bucket),
and the step broken down by phase on one rank over the whole run: the slowest by the straggler
rule's measure (:func:`traceml_ai.diagnose.rules.rank_skew`, the final summary's ``worst_rank``),
so the phases add up to that rank's step and the rank shown is the one the diagnosis, the per-rank
panel and the run table's ``perf.worst_rank`` name.

It reads ``aggregator/telemetry.sqlite`` through :func:`traceml_ai.diagnose.read_telemetry`
(read-only; never creates a file beside it) and the step math of
:mod:`traceml_ai.diagnose.timeline`, so the numbers are those of the final summary. Answers are
cached per run by the ``(mtime_ns, size)`` of the database and its ``-wal`` file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from traceml_ai.diagnose.readers import Telemetry, read_telemetry
from traceml_ai.diagnose.rules import local_work, rank_skew
from traceml_ai.diagnose.stats import FloatArray
from traceml_ai.diagnose.summary import AGGREGATOR_DIR, FINAL_SUMMARY, TELEMETRY_DB
from traceml_ai.diagnose.thresholds import WARMUP_STEPS
from traceml_ai.diagnose.timeline import INNER_PHASES, OTHER, RankTimeline, StepTable, build_step_table
from traceml_ai.runs.discovery import stat_confined
from traceml_ai.runs.model import RunSummary
from traceml_ai.ui.reads import missing_database_detail, shared_read, shared_step_table

MAX_BUCKETS = 240
"""Columns of the heatmap at most (steps are bucketed beyond that)."""
MAX_BREAKDOWN_POINTS = 1000
"""Points of the phase breakdown at most."""
CACHE_RUNS = 16


def performance(db_path: str, max_buckets: int = MAX_BUCKETS,
                max_points: int = MAX_BREAKDOWN_POINTS) -> dict[str, Any]:
    """``{"heatmap": heatmap(...), "breakdown": breakdown(...)}`` of one telemetry database, read once
    (the read is shared with the telemetry answer asked at the same time: :mod:`traceml_ai.ui.reads`)."""
    # Without totals (only the step rows are used here) unless the telemetry answer asked at the
    # same time needs them: a run without a final summary, which it diagnoses now.
    summary = os.path.join(os.path.dirname(db_path), FINAL_SUMMARY)
    tel = shared_read(db_path, totals=not os.path.isfile(summary))
    table = shared_step_table(tel) if tel.status == "ok" else None
    hm = _heatmap(tel, max_buckets, table)
    return {"heatmap": hm, "breakdown": _breakdown(table, max_points) if table is not None else None}


def heatmap_of(tel: Telemetry, max_buckets: int = MAX_BUCKETS) -> dict[str, Any]:
    """:func:`heatmap` of telemetry already read."""
    return _heatmap(tel, max_buckets)


def breakdown_of(tel: Telemetry, max_points: int | None = MAX_BREAKDOWN_POINTS) -> dict[str, Any] | None:
    """:func:`breakdown` of telemetry already read; ``max_points=None``: every step, not bucketed."""
    if tel.status != "ok":
        return None
    table = build_step_table(tel.steps, warmup_steps=0)
    return _breakdown(table, max_points if max_points is not None else max(1, len(tel.steps)))


def rank_medians(tel: Telemetry) -> dict[int | None, dict[str, float | None]]:
    """Per rank, after warm-up: ``{"median_ms": median iteration, "outside_backward_ms": median of
    the iteration minus backward}`` (ms; the final summary's ``per_rank`` numbers). Under DDP the
    fast ranks wait for a straggler inside backward's all-reduce, so their iterations equal (or, by
    where each rank's clock starts the step, even exceed) the straggler's; the work outside backward
    is what tells it (the straggler rule reads that)."""
    if tel.status != "ok":
        return {}
    return _rank_medians(build_step_table(tel.steps, warmup_steps=0))


def _rank_medians(table: StepTable) -> dict[int | None, dict[str, float | None]]:
    """:func:`rank_medians` from a table built with ``warmup_steps=0``: each rank's first
    :data:`WARMUP_STEPS` steps (in step order, as :func:`build_step_table` drops them) left out."""
    out: dict[int | None, dict[str, float | None]] = {}
    for tl in table.ranks:
        out[tl.rank] = {"median_ms": _median(tl.iteration_ms[WARMUP_STEPS:]),
                        "outside_backward_ms": _median(local_work(tl)[WARMUP_STEPS:])}
    return out


def _median(values: FloatArray) -> float | None:
    got = values[np.isfinite(values)]
    return round(float(np.median(got)), 4) if got.size else None


def breakdown(db_path: str, max_points: int = MAX_BREAKDOWN_POINTS) -> dict[str, Any] | None:
    """The step broken down by phase, per step, on one rank (:func:`shown_rank`): the slowest by the
    straggler rule's measure over the run, so its phases add up to its iteration time at every step
    (``other`` is the rest). ``{"x": [step, ...], "bucket_steps": int, "last_step": the last step
    (where the last bucket ends; ``x`` holds each bucket's first), "series": [{"name": phase,
    "y": [ms|None, ...]}], "iteration": [ms|None, ...], "rank": shown rank, "rank_basis": why that
    rank}``, the steps put into at most ``max_points`` buckets (the mean of each phase over a
    bucket's steps). None without step rows or a readable database."""
    tel = read_telemetry(db_path)
    if tel.status != "ok":
        return None
    return _breakdown(build_step_table(tel.steps, warmup_steps=0), max_points)


def _after_warmup(tl: RankTimeline) -> RankTimeline:
    """``tl`` (of a table built with ``warmup_steps=0``) without its first :data:`WARMUP_STEPS`
    steps, as :func:`build_step_table` leaves them out for the diagnosis."""
    cut = slice(WARMUP_STEPS, None)
    return dataclasses.replace(tl, steps=tl.steps[cut], timestamps_ns=tl.timestamps_ns[cut],
                               iteration_ms=tl.iteration_ms[cut],
                               phases={k: v[cut] for k, v in tl.phases.items()})


def shown_rank(ranks: list[RankTimeline]) -> tuple[RankTimeline, str]:
    """The one rank the phase breakdown shows, and why (``only rank`` / ``straggler measure`` /
    ``highest median iteration``): the slowest rank by :func:`rank_skew` after warm-up, the final
    summary's ``worst_rank``; with too few steps to measure, the rank with the highest median
    iteration."""
    if len(ranks) == 1:
        return ranks[0], "only rank"
    measured = rank_skew([_after_warmup(tl) for tl in ranks])
    if not isinstance(measured, str):
        return next(tl for tl in ranks if tl.rank == measured.rank), "straggler measure"

    def med(tl: RankTimeline) -> float:
        got = tl.iteration_ms[np.isfinite(tl.iteration_ms)]
        return float(np.median(got)) if got.size else -math.inf

    return max(ranks, key=med), "highest median iteration"


def _breakdown(table: StepTable, max_points: int) -> dict[str, Any] | None:
    shown = breakdown_rank(table)
    return None if shown is None else rank_breakdown(*shown, max_points)


def breakdown_rank(table: StepTable) -> tuple[RankTimeline, str, list[str]] | None:
    """The rank the phase breakdown shows (:func:`shown_rank`), why, and the phases it draws
    (the inner phases and ``other``, in the table's order); None without step rows."""
    ranks = [tl for tl in table.ranks if tl.steps.size]
    if not ranks:
        return None
    tl, basis = shown_rank(ranks)
    return tl, basis, [name for name in table.phase_names if name in INNER_PHASES or name == OTHER]


def rank_breakdown(tl: RankTimeline, basis: str, names: list[str], max_points: int,
                   steps_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """:func:`breakdown` of one rank's timeline; ``steps_range``: only the steps in ``[lo, hi]``
    (a zoomed chart's range, at the same ``max_points``: finer buckets), with ``"range": [lo, hi]``."""
    steps = tl.steps
    keep = slice(None)
    if steps_range is not None:
        lo, hi = steps_range
        start, stop = np.searchsorted(steps, lo, side="left"), np.searchsorted(steps, hi, side="right")
        keep = slice(int(start), int(max(start, stop)))
        steps = steps[keep]
    n = steps.size
    width = max(1, math.ceil(n / max_points))

    def bucketed(values: FloatArray) -> list[float | None]:
        values = values[keep]
        pad = (-values.size) % width
        padded = np.concatenate([values, np.full(pad, np.nan)]).reshape(-1, width)
        counts = np.isfinite(padded).sum(axis=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            sums = np.nansum(padded, axis=1)
        return [round(float(t / c), 4) if c else None for t, c in zip(sums, counts, strict=True)]

    series = []
    for name in names:
        y = tl.phase(name)
        if np.isfinite(y[keep]).any():
            series.append({"name": name, "y": bucketed(y)})
    out: dict[str, Any] = {"x": [int(v) for v in steps[::width]], "bucket_steps": width,
                           "last_step": int(steps[-1]) if n else None, "series": series,
                           "iteration": bucketed(tl.iteration_ms), "rank": tl.rank, "rank_basis": basis}
    if steps_range is not None:
        out["range"] = [steps_range[0], steps_range[1]]
    return out


def heatmap(db_path: str, max_buckets: int = MAX_BUCKETS) -> dict[str, Any]:
    """The per-rank step times of one telemetry database.

    Returns ``{"state": "ok|missing|empty|corrupt|unreadable", "detail": str|None, "ranks": [rank,
    ...], "first_step": int|None, "last_step": int|None, "bucket_steps": int, "z": [[ms|None per
    bucket] per rank],
    "warmup_steps": int, "unit": "ms", "z_local": [[ms|None per bucket] per rank], "medians":
    [{"median_ms": ms|None, "outside_backward_ms": ms|None} per rank]}``: ``z[i][j]`` is the median
    iteration time (ms) of rank ``ranks[i]`` over steps ``first_step + j * bucket_steps`` ..
    ``+ bucket_steps - 1`` (None: no measured step there; the last bucket ends at ``last_step``, the
    highest step any rank measured, so it may be narrower), ``z_local`` the same of the work outside
    backward (the iteration minus backward: what tells a DDP straggler, see :func:`rank_medians`).
    Warm-up steps are included; ``warmup_steps`` says how many per rank the diagnosis skips (the
    page shades them); ``medians`` are each rank's after warm-up (:func:`rank_medians`). ``ranks``
    holds None for a rank that sent no identity. Never raises for what is in the file.
    """
    return _heatmap(read_telemetry(db_path), max_buckets)


def _heatmap(tel: Telemetry, max_buckets: int, table: StepTable | None = None) -> dict[str, Any]:
    out: dict[str, Any] = _empty_heatmap(tel.status, tel.detail)
    if tel.status != "ok":
        return out
    if table is None:
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
    z_local: list[list[float | None]] = []
    for tl in ranks:
        idx = (tl.steps - first) // width
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(buckets + 1))
        z.append(_bucket_medians(tl.iteration_ms[order], bounds, width))
        z_local.append(_bucket_medians(local_work(tl)[order], bounds, width))
    medians = _rank_medians(table)
    out.update(ranks=[tl.rank for tl in ranks], first_step=first, last_step=last, bucket_steps=width, z=z,
               z_local=z_local,
               medians=[medians.get(tl.rank, {"median_ms": None, "outside_backward_ms": None}) for tl in ranks])
    return out


def _bucket_medians(values: FloatArray, bounds: npt.NDArray[np.int64], width: int) -> list[float | None]:
    """The median of each bucket ``values[bounds[j]:bounds[j + 1]]`` (NaN skipped; None when empty).
    One bucket per step (width 1) needs no median; wider ones are sorted once as a padded matrix."""
    buckets = bounds.size - 1
    if width == 1 or values.size == 0:
        row = np.full(buckets, np.nan)
        counts = np.diff(bounds)
        one = counts == 1
        row[one] = values[bounds[:-1][one]]
        for j in np.flatnonzero(counts > 1):  # duplicates of one step (rare): their median
            chunk = values[bounds[j]:bounds[j + 1]]
            chunk = chunk[np.isfinite(chunk)]
            row[j] = np.median(chunk) if chunk.size else np.nan
    else:
        counts = np.diff(bounds)
        wide = int(counts.max()) if counts.size else 0
        mat = np.full((buckets, max(1, wide)), np.nan)
        cols = np.arange(values.size) - np.repeat(bounds[:-1], counts)
        mat[np.repeat(np.arange(buckets), counts), cols] = values
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN bucket: None below
            row = np.nanmedian(mat, axis=1)
    return [round(float(v), 4) if math.isfinite(v) else None for v in row]


def _empty_heatmap(state: str, detail: str | None) -> dict[str, Any]:
    return {"state": state, "detail": detail, "ranks": [], "first_step": None, "last_step": None, "bucket_steps": 1,
            "z": [], "z_local": [], "medians": [], "warmup_steps": 0, "unit": "ms"}


LIVE_MIN_INTERVAL_S = 1.0
LIVE_STATUSES = ("running", "running?")


class PerformanceViews:
    """``GET /api/runs/{key}/performance`` answers, cached per run by the database's stamps. A live
    run's database changes all the time: its answer is built again at most every
    ``live_min_interval_s`` seconds, or twice as long as the last build took (a big run's read
    must not pin the CPU while a page follows it), as the telemetry answer is."""

    def __init__(self, *, max_buckets: int = MAX_BUCKETS, live_min_interval_s: float = LIVE_MIN_INTERVAL_S,
                 live_cost_factor: float = 2.0) -> None:
        self.max_buckets = max_buckets
        self.live_min_interval_s = live_min_interval_s
        self.live_cost_factor = live_cost_factor
        self._cache: OrderedDict[str, tuple[tuple[Any, ...], dict[str, Any], float, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def payload(self, run: RunSummary, *, fresh: bool = False) -> dict[str, Any]:
        """The answer for a known run: ``{"heatmap": ..., "breakdown": ...}`` (see :func:`heatmap`
        and :func:`breakdown`); the heatmap's state is ``none`` for a run that was not captured.
        ``fresh``: built again from the database, whatever is cached (the Performance page's answer
        builds it with the telemetry answer from one read)."""
        agg = os.path.join(run.key, AGGREGATOR_DIR)
        db = os.path.join(agg, TELEMETRY_DB)
        st, reason = stat_confined(db, run.root)
        if st is None:
            state = "missing" if os.path.isdir(agg) and not os.path.islink(agg) else "none"
            detail = reason or ("this run was not captured by TraceML (no aggregator/ folder)" if state == "none"
                                else missing_database_detail(run.key))
            return {"heatmap": _empty_heatmap(state, detail), "breakdown": None}
        wal, _ = stat_confined(db + "-wal", run.root)
        stamps = (st.st_mtime_ns, st.st_size, None if wal is None else (wal.st_mtime_ns, wal.st_size))
        with self._lock:
            hit = self._cache.get(run.key)
        if hit is not None and not fresh:
            old, answer, read_at, build_s = hit
            wait = max(self.live_min_interval_s, self.live_cost_factor * build_s)
            if old == stamps or (run.display_status in LIVE_STATUSES and time.monotonic() - read_at < wait):
                return answer
        t = time.monotonic()
        answer = performance(os.path.realpath(db), self.max_buckets)
        self.reads += 1
        with self._lock:
            self._cache[run.key] = (stamps, answer, time.monotonic(), time.monotonic() - t)
            self._cache.move_to_end(run.key)
            while len(self._cache) > CACHE_RUNS:
                self._cache.popitem(last=False)
        return answer


class CompareViews:
    """``GET /api/runs/{key}/compare?baseline=KEY`` answers: ``traceml compare``'s verdict per metric
    of a run against a baseline run (:func:`traceml_ai.diagnose.compare.compare_telemetry`, the same
    call ``traceml compare`` makes), cached by both databases' stamps.

    The answer is :meth:`Comparison.to_dict <traceml_ai.diagnose.compare.Comparison.to_dict>` with
    ``run_a``/``run_b`` the two runs' names and ``live`` true when either database may still grow
    (its verdicts are then provisional). A run that was not captured has every metric
    ``inconclusive`` and a ``problems`` line saying so. While either run is live the verdicts are
    computed again at most every ``live_min_interval_s`` seconds (or twice the last computation).
    """

    def __init__(self, *, live_min_interval_s: float = 5.0, live_cost_factor: float = 2.0) -> None:
        self.live_min_interval_s = live_min_interval_s
        self.live_cost_factor = live_cost_factor
        self._cache: OrderedDict[tuple[str, str], tuple[tuple[Any, ...], dict[str, Any], float, float]] = \
            OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def payload(self, baseline: RunSummary, run: RunSummary) -> dict[str, Any]:
        from traceml_ai.diagnose.compare import compare_telemetry

        paths: list[str | None] = []
        stamps: list[Any] = []
        for r in (baseline, run):
            db = os.path.join(r.key, AGGREGATOR_DIR, TELEMETRY_DB)
            st, _reason = stat_confined(db, r.root)
            wal, _ = stat_confined(db + "-wal", r.root)
            paths.append(None if st is None else os.path.realpath(db))
            stamps.append(None if st is None else (st.st_mtime_ns, st.st_size,
                                                   None if wal is None else (wal.st_mtime_ns, wal.st_size)))
        key = (baseline.key, run.key)
        live = any(r.display_status in LIVE_STATUSES for r in (baseline, run))
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            old, cached, done_at, took = hit
            wait = max(self.live_min_interval_s, self.live_cost_factor * took)
            if old == tuple(stamps) or (live and time.monotonic() - done_at < wait):
                return cached
        t = time.monotonic()
        tels = [shared_read(p) if p is not None else _no_database(r)
                for p, r in zip(paths, (baseline, run), strict=True)]
        result = compare_telemetry(tels[0], tels[1], run_a=baseline.name or baseline.id, run_b=run.name or run.id)
        answer = {**result.to_dict(), "live": not (baseline.finished and run.finished)}
        self.reads += 1
        with self._lock:
            self._cache[key] = (tuple(stamps), answer, time.monotonic(), time.monotonic() - t)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_RUNS:
                self._cache.popitem(last=False)
        return answer


def _no_database(run: RunSummary) -> Telemetry:
    """The telemetry of a run without ``aggregator/telemetry.sqlite``: not captured at all (no
    ``aggregator/`` folder), or captured and the database removed since (review 13h: such a run was
    called "not captured" beside its own PERF badge and verdict)."""
    name = run.name or run.id
    folder = os.path.join(run.key, AGGREGATOR_DIR)
    why = (missing_database_detail(run.key) if os.path.isdir(folder)
           else f"no {AGGREGATOR_DIR}/{TELEMETRY_DB} (not captured by TraceML)")
    return Telemetry(path=os.path.join(folder, TELEMETRY_DB), status="missing", detail=f"{name}: {why}")
