"""The telemetry view of a captured run for the inspector: ``GET /api/runs/{key}/telemetry``
(DESIGN §4: "step-time breakdown over steps, rank skew, memory, system/GPU, the diagnoses, and the
captured logs"; shape in docs/viewer-api.md).

Everything is read from the run folder's ``aggregator/`` files, read-only:

- ``telemetry.sqlite`` through :func:`traceml_ai.diagnose.read_telemetry` (``mode=ro``, or
  ``immutable`` once the writer is gone, so no ``-wal``/``-shm`` file is ever created beside it);
  the iteration and ``other`` times per step come from :mod:`traceml_ai.diagnose.timeline` and the
  per-rank medians from :func:`traceml_ai.diagnose.summary.summarise`, the same math the final
  summary uses;
- ``final_summary.json`` (the findings) through :func:`traceml_ai.diagnose.summary.read_final_summary`;
- ``manifest.json``, ``finalization_warning.json`` (its ``summary`` lines) and the last
  :data:`LOG_TAIL_LINES` lines of each ``rank_<g>.log`` through :mod:`traceml_ai.runs.aggregator_files`.

This module opens no run file itself (DESIGN §1): it lists the ``aggregator/`` folder, asks those
readers, and shapes their typed answers into the JSON of the page.

A run without an ``aggregator/`` folder answers ``state: "none"``; a database that is missing,
empty, corrupt or locked answers that ``state`` plus a warning, never an error. Every series is
downsampled with the run package's min/max buckets (:func:`traceml_ai.runs.series.downsample_indices`)
to about :data:`MAX_POINTS` points per chart.

Answers are cached per run by the ``(mtime_ns, size)`` of every file they come from, so polling a
finished run costs a few ``stat`` calls; a live run is read again once its files change, at most every
:data:`LIVE_MIN_INTERVAL_S` (or twice the time the last read took, for a big database).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from traceml_ai.diagnose.perf import aggregator_finalizing
from traceml_ai.diagnose.readers import GpuSample, Telemetry, rank_key
from traceml_ai.diagnose.summary import (
    AGGREGATOR_DIR,
    FINAL_SUMMARY,
    TELEMETRY_DB,
    Summary,
    SummaryFileError,
    read_final_summary,
    summarise,
    verdict,
)
from traceml_ai.diagnose.thresholds import WARMUP_STEPS
from traceml_ai.diagnose.timeline import ITERATION
from traceml_ai.runs.aggregator_files import (
    FINALIZATION_WARNING,
    MANIFEST,
    RANK_LOG,
    Stamp,
    list_aggregator_files,
    rank_log_order,
    read_finalization_warning,
    read_manifest,
    read_rank_log_tail,
)
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.series import downsample_indices
from traceml_ai.ui.reads import missing_database_detail, shared_read, shared_step_table

MAX_POINTS = 2000
"""Points per chart (steps or snapshots), after min/max downsampling."""
LOG_TAIL_LINES = 500
"""Lines sent of each rank log (its last ones)."""
LIVE_MIN_INTERVAL_S = 1.0
CACHE_RUNS = 16
LIVE_STATUSES = ("running", "running?")


@dataclass
class _Cached:
    stamps: tuple[Stamp, ...]
    payload: dict[str, Any]
    read_at: float
    build_s: float
    running: bool = False  # the run was live when built (its verdict's words depend on it)


class TelemetryViews:
    """The ``GET /api/runs/{key}/telemetry`` answers, cached per run (thread-safe)."""

    def __init__(self, *, max_points: int = MAX_POINTS, tail_lines: int = LOG_TAIL_LINES,
                 live_min_interval_s: float = LIVE_MIN_INTERVAL_S, live_cost_factor: float = 2.0) -> None:
        self.max_points = max_points
        self.tail_lines = tail_lines
        self.live_min_interval_s = live_min_interval_s
        # A live run is read again no sooner than this many times the last read took, so that a big
        # database polled by several pages does not keep a core busy.
        self.live_cost_factor = live_cost_factor
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self.reads = 0  # how many answers were built from the files (not from the cache)

    def payload(self, run: RunSummary, *, fresh: bool = False) -> dict[str, Any]:
        """The telemetry answer of a known run (see docs/viewer-api.md). Never raises for what is in
        the run folder: problems become ``warnings``. ``fresh``: built again from the files,
        whatever is cached (the Performance page's answer builds it with the per-rank answer from
        one read)."""
        with self._lock:
            run_lock = self._run_locks[run.key]
        with run_lock:  # two pages asking at once: the second gets the first one's answer
            live = run.display_status in LIVE_STATUSES
            stamps, agg, refused = answer_stamps(run.key)
            # Ended, but its aggregator is still writing the verdict: followed like a live run meanwhile.
            finalizing = not live and aggregator_finalizing(run.key)
            live = live or finalizing
            with self._lock:
                hit = self._cache.get(run.key)
            wait = max(self.live_min_interval_s, self.live_cost_factor * hit.build_s) if hit is not None else 0.0
            recent = live and time.monotonic() - hit.read_at < wait if hit is not None else False
            if hit is not None and not fresh and hit.running == live and (hit.stamps == stamps or recent):
                return {**hit.payload, "live": live, "finalizing": finalizing}
            started = time.monotonic()
            answer = self._build(run.key, agg, stamps, running=live)
            if refused:
                answer["warnings"].append(refused)
            self.reads += 1
            with self._lock:
                self._cache[run.key] = _Cached(stamps, answer, time.monotonic(), time.monotonic() - started, live)
                self._cache.move_to_end(run.key)
                while len(self._cache) > CACHE_RUNS:
                    old, _ = self._cache.popitem(last=False)
                    self._run_locks.pop(old, None)
            return {**answer, "live": live, "finalizing": finalizing}

    # -- building --------------------------------------------------------------------------------

    def _build(self, run_dir: str, agg: str | None, stamps: tuple[Stamp, ...], *,
               running: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": "none",
            "detail": None,
            "warnings": [],
            "manifest": None,
            "diagnoses": None,
            "finalization": None,
            "steps": None,
            "ranks": None,
            "memory": None,
            "rss": None,
            "host": None,
            "gpu": None,
            "gpu_power": None,
            "gpu_temperature": None,
            "logs": [],
            "t0_unix_ns": None,
            "final_summary_error": None,
        }
        if agg is None:
            out["detail"] = "this run was not captured by TraceML (no aggregator/ folder)"
            return out
        warnings: list[str] = out["warnings"]
        names = {name for name, _, _ in stamps}
        manifest = read_manifest(agg, warnings) if MANIFEST in names else None
        out["manifest"] = None if manifest is None else manifest.to_dict()
        lost = read_finalization_warning(agg, warnings) if FINALIZATION_WARNING in names else None
        out["finalization"] = None if lost is None else {"summary": list(lost.summary)}
        if lost is None and FINALIZATION_WARNING in names:  # there, but unreadable: what was lost is unknown
            out["finalization"] = {"summary": [], "unreadable": next(
                (w for w in warnings if FINALIZATION_WARNING in w), f"{AGGREGATOR_DIR}/{FINALIZATION_WARNING}")}
        final: Summary | None = None
        if FINAL_SUMMARY in names:
            try:
                final = read_final_summary(run_dir)
            except SummaryFileError as err:
                # Said as the verdict's reason (the page shows it there, not as "no final summary").
                out["final_summary_error"] = f"{AGGREGATOR_DIR}/{err.one_line()}"
                warnings.append(out["final_summary_error"])
            except OSError as err:
                out["final_summary_error"] = f"{AGGREGATOR_DIR}/{FINAL_SUMMARY} cannot be read ({err.strerror or err})"
                warnings.append(out["final_summary_error"])
        out["logs"] = [
            read_rank_log_tail(agg, name, self.tail_lines, warnings).to_dict()
            for name in sorted((n for n in names if RANK_LOG.match(n)), key=rank_log_order)
        ]

        telemetry: Telemetry | None = None
        live: Summary | None = None
        if TELEMETRY_DB in names:
            # The Performance view reads it too. With a final summary the rules are not run, so
            # the whole-table totals only they read are left out (issue 13 item 5).
            telemetry = shared_read(os.path.join(agg, TELEMETRY_DB), totals=final is None)
            out["state"] = telemetry.status
            out["detail"] = telemetry.detail
            if telemetry.status != "ok":
                warnings.append(f"{AGGREGATOR_DIR}/{TELEMETRY_DB}: {telemetry.detail or telemetry.status}")
            warnings.extend(f"{AGGREGATOR_DIR}/{TELEMETRY_DB}: {p}" for p in telemetry.problems)
            if telemetry.status == "ok":
                try:
                    if final is None:  # live, or the summary was never written: judge what is there now
                        live = summarise(telemetry, source=f"{AGGREGATOR_DIR}/{TELEMETRY_DB}")
                    self._charts(telemetry, out)
                except Exception as err:  # a reader/rule bug must cost the charts, not the page
                    warnings.append(f"telemetry could not be charted ({type(err).__name__}: {err})")
        elif final is not None or out["logs"] or out["manifest"] is not None:
            out["state"] = "missing"
            out["detail"] = missing_database_detail(run_dir)
        elif out["state"] == "none":  # an aggregator/ folder with nothing readable in it
            out["state"] = "missing"
            out["detail"] = f"no readable telemetry in {AGGREGATOR_DIR}/"
        code = None if manifest is None else manifest.exit_code
        out["diagnoses"] = _diagnoses(final, live, running=running,
                                      watch=manifest is not None and manifest.mode == "watch",
                                      exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None)
        out["ranks"] = _ranks(final, live)
        return out

    def _charts(self, tel: Telemetry, out: dict[str, Any]) -> None:
        starts = [s.timestamp_ns for s in tel.steps if s.timestamp_ns is not None]
        starts += [p.timestamp_ns for p in tel.process if p.timestamp_ns is not None]
        starts += [s.timestamp_ns for s in tel.system if s.timestamp_ns is not None]
        t0 = min(starts) if starts else None
        out["t0_unix_ns"] = t0
        out["steps"] = self._steps(tel)
        out["memory"] = self._memory(tel)
        if t0 is not None:
            out["rss"] = self._rss(tel, t0)
            out["host"] = self._host(tel, t0)
            out["gpu"] = self._gpu(tel, t0)
            out["gpu_power"] = self._gpu_readings(tel, t0, "power")
            out["gpu_temperature"] = self._gpu_readings(tel, t0, "temperature")

    def _steps(self, tel: Telemetry) -> dict[str, Any] | None:
        """Phase times per step, the slowest rank's per step (as the job waits for it), warm-up
        steps included (the chart marks them; the medians leave them out)."""
        if not tel.steps:
            return None
        table = shared_step_table(tel)  # build_step_table(tel.steps, warmup_steps=0), shared with /performance
        names = (ITERATION, *table.phase_names)
        series = []
        for name in names:
            x, y = table.job_series(name)
            if np.isfinite(y).any():
                series.append((name, x.astype(np.float64), y))
        if not series:
            return None
        chart = aligned(series, self.max_points)
        return {
            **chart,
            "unit": "ms",
            "first_step": table.first_step,
            "last_step": table.last_step,
            "warmup_steps": WARMUP_STEPS,  # what the medians (and build_step_table by default) leave out
            "ranks": len(table.ranks),
            "sampled_every": tel.sampled_every,
        }

    def _memory(self, tel: Telemetry) -> dict[str, Any] | None:
        """PyTorch's per-step peak allocated and reserved bytes, one line each per rank and device;
        ``rows`` the per-step memory rows read and ``devices`` the devices they name. None only
        without any row: a CPU run's rows (device ``cpu``, no peak measured) give a chart with no
        series (issue 13 review: the page said "no per-step memory rows" of a run with 92)."""
        # Three plain lists per (rank, device), NaN for "not measured": one pass over the samples.
        by: dict[tuple[int | None, str | None], tuple[list[int], list[float], list[float]]] = {}
        nan = math.nan
        for m in tel.memory:
            lists = by.get((m.rank, m.device))
            if lists is None:
                lists = by[(m.rank, m.device)] = ([], [], [])
            lists[0].append(m.step)
            lists[1].append(nan if (a := m.peak_alloc_bytes) is None else a)
            lists[2].append(nan if (r := m.peak_reserved_bytes) is None else r)
        series = []
        for (rank, device), rows in sorted(by.items(), key=lambda kv: (rank_key(kv[0][0]), kv[0][1] or "")):
            x = np.asarray(rows[0], dtype=np.float64)
            label = f"rank {_rank_text(rank)} {device or '?'}"
            for i, kind in ((1, "alloc"), (2, "reserved")):
                y = np.asarray(rows[i], dtype=np.float64)
                if np.isfinite(y).any():
                    series.append((f"{label} {kind}", x, y))
        if not tel.memory:
            return None
        devices = sorted({device or "?" for _, device in by})
        return {**aligned(series, self.max_points), "unit": "bytes", "rows": len(tel.memory), "devices": devices}

    def _rss(self, tel: Telemetry, t0: int) -> dict[str, Any] | None:
        """Each rank's process RSS (bytes) over wall time (seconds since ``t0_unix_ns``)."""
        by: dict[int | None, list[tuple[int, float]]] = defaultdict(list)
        for p in tel.process:
            if p.timestamp_ns is not None and p.rss_bytes is not None:
                by[p.rank].append((p.timestamp_ns, p.rss_bytes))
        series = [
            (f"rank {_rank_text(rank)}", _seconds([r[0] for r in rows], t0), np.asarray([r[1] for r in rows]))
            for rank, rows in sorted(by.items(), key=lambda kv: rank_key(kv[0]))
        ]
        return {**aligned(series, self.max_points), "unit": "bytes"} if series else None

    def _host(self, tel: Telemetry, t0: int) -> dict[str, Any] | None:
        """Host CPU percent and RAM used percent over wall time, per host."""
        by: dict[str, list[tuple[int, float | None, float | None]]] = defaultdict(list)
        hosts = {s.hostname for s in tel.system}
        for s in tel.system:
            if s.timestamp_ns is None:
                continue
            ram = (s.ram_used_bytes / s.ram_total_bytes * 100.0
                   if s.ram_used_bytes is not None and s.ram_total_bytes else None)
            by[s.hostname or "host"].append((s.timestamp_ns, s.cpu_percent, ram))
        series = []
        for host, rows in sorted(by.items()):
            prefix = f"{host} " if len(hosts) > 1 else ""
            x = _seconds([r[0] for r in rows], t0)
            for i, what in ((1, "CPU"), (2, "RAM")):
                y = np.asarray([math.nan if r[i] is None else r[i] for r in rows], dtype=np.float64)
                if np.isfinite(y).any():
                    series.append((f"{prefix}{what}", x, y))
        return {**aligned(series, self.max_points), "unit": "percent"} if series else None

    def _gpu(self, tel: Telemetry, t0: int) -> dict[str, Any] | None:
        """Each GPU's utilisation and memory used (percent of its total) over wall time."""
        by: dict[tuple[str | None, int], list[tuple[int, float | None, float | None]]] = defaultdict(list)
        hosts = {g.hostname for g in tel.gpus}
        for g in tel.gpus:
            if g.timestamp_ns is None:
                continue
            mem = (g.mem_used_bytes / g.mem_total_bytes * 100.0
                   if g.mem_used_bytes is not None and g.mem_total_bytes else None)
            by[(g.hostname, g.gpu_idx)].append((g.timestamp_ns, g.util, mem))
        series = []
        for (host, idx), rows in sorted(by.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
            name = f"{host} GPU {idx}" if len(hosts) > 1 else f"GPU {idx}"
            x = _seconds([r[0] for r in rows], t0)
            for i, what in ((1, "util"), (2, "memory")):
                y = np.asarray([math.nan if r[i] is None else r[i] for r in rows], dtype=np.float64)
                if np.isfinite(y).any():
                    series.append((f"{name} {what}", x, y))
        return {**aligned(series, self.max_points), "unit": "percent"} if series else None

    def _gpu_readings(self, tel: Telemetry, t0: int, what: Literal["power", "temperature"]) -> dict[str, Any] | None:
        """Each GPU's power draw and its limit (``what="power"``, watts: ``GPU 0 power``, ``GPU 0
        power limit``) or its temperature (``"temperature"``, degrees Celsius: ``GPU 0``) over wall
        time; None when no sample measured it (a CPU run, or NVML without the reading)."""
        by: dict[tuple[str | None, int], list[GpuSample]] = defaultdict(list)
        hosts = {g.hostname for g in tel.gpus}
        for g in tel.gpus:
            if g.timestamp_ns is not None:
                by[(g.hostname, g.gpu_idx)].append(g)
        fields = ((("power", "power_usage_w"), ("power limit", "power_limit_w")) if what == "power"
                  else (("", "temperature_c"),))
        series = []
        for (host, idx), rows in sorted(by.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
            name = f"{host} GPU {idx}" if len(hosts) > 1 else f"GPU {idx}"
            x = _seconds([r.timestamp_ns or 0 for r in rows], t0)
            for label, field in fields:
                y = np.asarray([math.nan if (v := getattr(r, field)) is None else v for r in rows], dtype=np.float64)
                if np.isfinite(y).any():
                    series.append((f"{name} {label}".rstrip(), x, y))
        unit = "watts" if what == "power" else "celsius"
        return {**aligned(series, self.max_points), "unit": unit} if series else None


# -- series --------------------------------------------------------------------------------------


def aligned(series: Sequence[tuple[str, np.ndarray, np.ndarray]], max_points: int) -> dict[str, Any]:
    """Several ``(name, x, y)`` series on one shared x axis of at most about ``max_points`` values.

    Each series keeps its own min/max-downsampled points (an equal share of the budget); the shared
    x is the union of the kept x values, and each series gives its value wherever it has that x
    (null elsewhere: the page draws across those gaps). NaN is null. A repeated x keeps the series'
    last value. Returns ``{"x": [...], "series": [{"name", "y": [...]}], "raw_points", "downsampled"}``.
    """
    share = max(5, max_points // max(1, len(series)))
    clean: list[tuple[str, np.ndarray, np.ndarray]] = []
    kept: list[np.ndarray] = []
    raw = 0
    for name, x, y in series:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        ok = np.isfinite(x)
        x, y = x[ok], y[ok]
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
        if x.size:
            last = np.r_[x[1:] != x[:-1], True]  # the last of each run of equal x
            x, y = x[last], y[last]
        raw = max(raw, int(x.size))
        clean.append((name, x, y))
        kept.append(x[downsample_indices(y, share)] if x.size else x)
    xs = np.unique(np.concatenate(kept)) if kept else np.empty(0)
    out = []
    for name, x, y in clean:
        values = np.full(xs.size, np.nan)
        if x.size:
            pos = np.clip(np.searchsorted(x, xs), 0, x.size - 1)
            hit = x[pos] == xs
            values[hit] = y[pos[hit]]
        out.append({"name": name, "y": _nullable(values)})
    downsampled = any(c[1].size > k.size for c, k in zip(clean, kept, strict=True))
    return {"x": xs.tolist(), "series": out, "raw_points": raw, "downsampled": downsampled}


def _nullable(values: np.ndarray) -> list[float | None]:
    return [v if v - v == 0.0 else None for v in values.tolist()]


def _seconds(ts_ns: Iterable[int], t0: int) -> np.ndarray:
    return (np.asarray(list(ts_ns), dtype=np.int64) - t0).astype(np.float64) / 1e9


def _rank_text(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


# -- diagnoses and ranks -------------------------------------------------------------------------


def _diagnoses(final: Summary | None, live: Summary | None, *, watch: bool = False,
               exit_code: int | None = None, running: bool = False) -> dict[str, Any] | None:
    """The findings of final_summary.json, or (a live run, or no summary written) the rules run
    over the telemetry read now, marked ``source: "live"``. ``watch``: ``traceml watch`` made the
    run (its manifest says so), whose verdict is "not judged"; ``exit_code``: the training's, from the
    manifest (a script that failed before its first step is said to have failed)."""
    if final is not None:
        summary, source = final, "final_summary"
    elif live is not None:
        summary, source = live, "live"
    else:
        return None
    doc = summary.to_dict()
    kind, text = verdict(summary, watch=watch, exit_code=exit_code, running=running and final is None)
    return {
        "source": source,
        "generated_at": summary.generated_at,
        "status": summary.telemetry_status,
        "detail": summary.telemetry_detail,
        "problems": list(summary.problems),
        "findings": doc["findings"],
        "abstained": doc["abstained"],
        "rules_checked": list(summary.rules_checked),
        "healthy": kind == "healthy",  # a rule judged and found nothing serious; never for a run not judged
        "unread_findings": summary.unread_findings,
        "verdict": {"kind": kind, "text": text},
        "steps": doc["steps"],
        "ranks": doc["ranks"],
    }


def _ranks(final: Summary | None, live: Summary | None) -> dict[str, Any] | None:
    """Per-rank median iteration and work outside backward (ms) for the skew view: the final
    summary's when the run has one, else the live summary's."""
    summary = final if final is not None else live
    st = None if summary is None else summary.to_dict()["step_time"]
    if st is None:
        return None
    return {"per_rank": st["per_rank"], "worst_rank": st["worst_rank"], "skew": st["skew"],
            "skew_measure": st["skew_measure"],
            "iteration_median_ms": st["iteration_median_ms"], "iteration_p95_ms": st["iteration_p95_ms"],
            "throughput_steps_per_s": st["throughput_steps_per_s"], "phases": st["phases"]}


# -- files ---------------------------------------------------------------------------------------


def answer_stamps(run_dir: str) -> tuple[tuple[Stamp, ...], str | None, str | None]:
    """The stamps of the files a telemetry or Performance page answer reads (the database's
    ``-wal`` too, which is what changes while a run is live): ``(stamps, aggregator folder or None,
    why the folder was refused or None)``, as
    :func:`traceml_ai.runs.aggregator_files.list_aggregator_files` gives them."""
    wanted = frozenset({TELEMETRY_DB, TELEMETRY_DB + "-wal", FINAL_SUMMARY, FINALIZATION_WARNING, MANIFEST})
    return list_aggregator_files(run_dir, lambda name: name in wanted or RANK_LOG.match(name) is not None)
