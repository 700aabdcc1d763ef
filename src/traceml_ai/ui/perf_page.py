"""The Performance view's answer: ``GET /api/runs/{key}/performance-page`` (issue 13 items 2, 3 and 5;
shape in docs/viewer-api.md).

One answer per run holds what the page draws: the telemetry answer (:mod:`traceml_ai.ui.telemetry`)
and the per-rank answer (:mod:`traceml_ai.ui.performance`), built together from one read of
``aggregator/telemetry.sqlite`` (:func:`traceml_ai.ui.reads.pinned_read`). So the page makes one
request, not two, and while a run is live the step count of its diagnoses and the last step of its
charts come from the same rows (asked separately, each answer was cached and rate-limited on its
own, and the count ran ahead of the chart). ``stamp`` names the files the answer was built from:
the page keeps the answer under it and asks again only when the run changed.

``?from=A&to=B`` answers only ``{"breakdown": ...}``: the phase breakdown of the steps ``A..B`` at
the same number of points (finer buckets: a zoomed chart's range), from the shown rank's steps
kept with the last answer (the database is not read again).

Answers are cached per run by the ``(mtime_ns, size)`` of every file they come from, like the two
answers they hold; a live run is built again at most every :data:`LIVE_MIN_INTERVAL_S` seconds
(or twice the time the last build took).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from traceml_ai.diagnose.perf import aggregator_finalizing
from traceml_ai.diagnose.summary import FINAL_SUMMARY, TELEMETRY_DB
from traceml_ai.diagnose.timeline import RankTimeline
from traceml_ai.runs.model import RunSummary
from traceml_ai.ui.performance import MAX_BREAKDOWN_POINTS, PerformanceViews, breakdown_rank, rank_breakdown
from traceml_ai.ui.reads import pinned_read, shared_step_table
from traceml_ai.ui.telemetry import LIVE_STATUSES, TelemetryViews, answer_stamps

LIVE_MIN_INTERVAL_S = 1.0
CACHE_RUNS = 16
KEEP_TIMELINES = 4
"""Runs whose shown rank's steps are kept for zoomed ranges (about 7 MB each for 100,000 steps)."""


@dataclass
class _Entry:
    stamps: tuple[Any, ...]
    answer: dict[str, Any]
    built_at: float
    build_s: float


class PerformancePageViews:
    """The ``GET /api/runs/{key}/performance-page`` answers, cached per run (thread-safe)."""

    def __init__(self, telemetry: TelemetryViews, performance: PerformanceViews, *,
                 live_min_interval_s: float = LIVE_MIN_INTERVAL_S, live_cost_factor: float = 2.0,
                 max_points: int = MAX_BREAKDOWN_POINTS) -> None:
        self.telemetry = telemetry
        self.performance = performance
        self.live_min_interval_s = live_min_interval_s
        self.live_cost_factor = live_cost_factor
        self.max_points = max_points
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._timelines: OrderedDict[str, tuple[RankTimeline, str, list[str]]] = OrderedDict()
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}
        self.reads = 0  # answers built from the files (not from the cache)

    def payload(self, run: RunSummary) -> dict[str, Any]:
        """``{"telemetry": <the telemetry answer>, "performance": <the per-rank answer>, "stamp":
        str, "live": bool}`` of a known run. Never raises for what is in the run folder."""
        with self._lock:
            run_lock = self._run_locks.setdefault(run.key, threading.Lock())
        with run_lock:
            stamps, agg, _refused = answer_stamps(run.key)
            with self._lock:
                hit = self._cache.get(run.key)
            # Rate-limited only while the run is still being written (training, or its aggregator
            # writing the verdict): once it is not, the answer after its last change must be built
            # from that change, or the page would keep a "live" answer no event replaces.
            live = run.display_status in LIVE_STATUSES or aggregator_finalizing(run.key)
            if hit is not None:
                wait = max(self.live_min_interval_s, self.live_cost_factor * hit.build_s)
                # (the same files but a run that stopped being live, e.g. run.json says completed:
                # built again, so the answer says so)
                if (hit.stamps == stamps and hit.answer["live"] == live) or (
                        live and time.monotonic() - hit.built_at < wait):
                    return hit.answer
            started = time.monotonic()
            names = {name for name, _, _ in stamps}
            db = os.path.join(agg, TELEMETRY_DB) if agg is not None and TELEMETRY_DB in names else None
            pin: contextlib.AbstractContextManager[Any] = (
                pinned_read(db, totals=FINAL_SUMMARY not in names) if db is not None else contextlib.nullcontext())
            with pin as tel:
                telemetry = self.telemetry.payload(run, fresh=True)
                performance = self.performance.payload(run, fresh=True)
                shown = breakdown_rank(shared_step_table(tel)) if tel is not None and tel.status == "ok" else None
            answer = {"telemetry": telemetry, "performance": performance,
                      "stamp": hashlib.sha1(repr(stamps).encode()).hexdigest()[:16],
                      "live": bool(telemetry.get("live"))}
            self.reads += 1
            with self._lock:
                self._cache[run.key] = _Entry(stamps, answer, time.monotonic(), time.monotonic() - started)
                self._cache.move_to_end(run.key)
                while len(self._cache) > CACHE_RUNS:
                    gone, _ = self._cache.popitem(last=False)
                    self._run_locks.pop(gone, None)
                if shown is None:
                    self._timelines.pop(run.key, None)
                else:
                    self._timelines[run.key] = shown
                    self._timelines.move_to_end(run.key)
                    while len(self._timelines) > KEEP_TIMELINES:
                        self._timelines.popitem(last=False)
            return answer

    def zoomed(self, run: RunSummary, lo: float, hi: float) -> dict[str, Any]:
        """``{"breakdown": ...}``: the phase breakdown of the steps in ``[lo, hi]`` at the same
        number of points as the whole run's (None without step rows)."""
        if lo > hi:
            lo, hi = hi, lo
        with self._lock:
            shown = self._timelines.get(run.key)
        if shown is None:
            self.payload(run)  # the whole run's answer keeps its shown rank
            with self._lock:
                shown = self._timelines.get(run.key)
        if shown is None:
            return {"breakdown": None}
        return {"breakdown": rank_breakdown(*shown, self.max_points, steps_range=(lo, hi))}
