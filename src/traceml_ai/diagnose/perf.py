"""The performance facts of one captured run, as run-table columns (issue 13 item 1; DESIGN §1, §3.5;
the column names in docs/viewer-api.md, "Performance columns").

:func:`perf_facts` turns a ``final_summary.json`` document (shape: :meth:`Summary.to_dict
<traceml_ai.diagnose.summary.Summary.to_dict>`) into a flat ``{key: value}`` dict whose keys are the
run table's ``perf.<key>`` columns; :class:`PerfIndex` keeps those facts for many run folders, read
again only when the summary's ``(mtime_ns, size)`` stamp changed, so a poll of the viewer that finds
no change costs nothing for finished runs and two ``stat`` calls for an unfinished one. Only
``final_summary.json`` (and ``finalization_warning.json``, for the status) is read: the raw telemetry
tables are read on demand by the inspector and the Performance view, never for the table.

Layering: this module imports nothing above :mod:`traceml_ai.diagnose`. The run layer
(:mod:`traceml_ai.runs`) may import nothing of ours, so it cannot call this reader; instead
:class:`~traceml_ai.runs.model.RunSummary` has a ``perf`` dict that the layer above fills through
:meth:`RunStore.set_perf <traceml_ai.runs.store.RunStore.set_perf>`: the viewer and ``traceml runs
ls`` (:mod:`traceml_ai.ui.perf`) ask a :class:`PerfIndex` for each run folder and hand the answer to
the store. The arrows keep pointing down: ``ui``/``cli`` → ``runs`` and ``ui``/``cli`` → ``diagnose``.

The facts (every key optional; a missing one is an empty cell, ``–`` in the page):

=======================  ======================================================================
``telemetry``            ``ok`` / ``degraded`` (the aggregator stopped early) / ``partial`` (a rank
                         sent nothing, rows were lost, or the database could not be read) /
                         ``pending`` (an ``aggregator/`` folder but no final summary yet). Every
                         captured run has it; its presence marks a run as captured.
``verdict``              the top finding's kind (``input_bound``, ``straggler``, ...), ``healthy``
                         when the rules judged and found nothing; none when they could not judge
``severity``             the top finding's severity (``info`` / ``warning`` / ``critical``)
``findings``             how many findings
``steps``                distinct steps seen
``ranks``                ranks that sent telemetry
``step_ms.p50``          median iteration time over every rank's post-warm-up steps (ms)
``step_ms.p95``          its 95th percentile (ms; none for summaries written before it existed)
``steps_per_s``          throughput: 1000 / median of the per-step slowest rank's iteration
``share.<phase>``        the time-weighted share (0-1) of the iteration spent in ``dataloader``,
                         ``h2d``, ``forward``, ``backward``, ``optimizer`` and ``other``
``skew_pct``             the slowest rank's excess over the median of the others (%, multi-rank)
``worst_rank``           the rank with the highest median iteration (multi-rank)
``straggler``            the ranks the straggler finding names, joined with ``;``
``peak_mem.gpu``         highest per-step peak allocated device memory on a GPU (bytes)
``peak_mem.host``        highest resident set size of any rank's process (bytes)
``gpu_util_pct``         mean GPU utilisation after warm-up (%; median for older summaries)
=======================  ======================================================================
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from traceml_ai.diagnose.summary import AGGREGATOR_DIR, FINAL_SUMMARY, SCHEMA_VERSION
from traceml_ai.telemetry import schema

FINALIZATION_WARNING: Final = "finalization_warning.json"
MAX_SUMMARY_BYTES: Final = 16 * 1024 * 1024
"""A larger final_summary.json is not read (a real one is a few KB)."""

PHASE_KEYS: Final[dict[str, str]] = {
    schema.DATALOADER_NEXT: "dataloader",
    schema.H2D: "h2d",
    schema.FORWARD: "forward",
    schema.BACKWARD: "backward",
    schema.OPTIMIZER_STEP: "optimizer",
    "other": "other",
}
"""Phase name in final_summary.json → the ``share.<key>`` of its column."""

PERF_KEYS: Final = (
    "telemetry", "verdict", "severity", "findings", "steps", "ranks", "step_ms.p50", "step_ms.p95",
    "steps_per_s", *(f"share.{k}" for k in PHASE_KEYS.values()), "skew_pct", "worst_rank", "straggler",
    "peak_mem.gpu", "peak_mem.host", "gpu_util_pct",
)
"""Every key :func:`perf_facts` may return, in the order the column chooser lists them."""

PerfValue = str | int | float | None
Stamp = tuple[int, int]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def telemetry_state(doc: Mapping[str, Any], *, lost: bool = False) -> str:
    """``ok`` / ``degraded`` / ``partial`` of a final summary (see the module table). ``lost``: the
    run has a ``finalization_warning.json`` (something was dropped during capture)."""
    tel = _obj(doc.get("telemetry"))
    status = tel.get("status")
    if status == "degraded":
        return "degraded"
    if status != "ok" or lost or _list(_obj(doc.get("ranks")).get("missing")) or _list(tel.get("problems")):
        return "partial"
    return "ok"


def perf_facts(doc: Mapping[str, Any], *, lost: bool = False) -> dict[str, PerfValue]:
    """The ``perf.*`` cells of one run from its final_summary.json document (``perf.`` left off the
    keys; see the module table). A field that is missing or of the wrong type is left out, never an
    error: a hand-edited summary shows empty cells, not a broken table."""
    out: dict[str, PerfValue] = {"telemetry": telemetry_state(doc, lost=lost)}
    findings = [f for f in _list(doc.get("findings")) if isinstance(f, dict)]
    out["findings"] = len(findings)
    if findings:
        top = findings[0]
        if isinstance(top.get("kind"), str):
            out["verdict"] = top["kind"]
        if isinstance(top.get("severity"), str):
            out["severity"] = top["severity"]
    elif _list(doc.get("rules_checked")):
        out["verdict"] = "healthy"
    stragglers = sorted(
        {r for f in findings if f.get("kind") == "straggler"
         for r in _list(_obj(f.get("evidence")).get("ranks")) if _int(r) is not None}
    )
    if stragglers:
        out["straggler"] = ";".join(str(r) for r in stragglers)
    steps = _obj(doc.get("steps"))
    if (seen := _int(steps.get("seen"))) is not None:
        out["steps"] = seen
    ranks = _list(_obj(doc.get("ranks")).get("seen"))
    if ranks:
        out["ranks"] = len(ranks)
    st = _obj(doc.get("step_time"))
    for key, field in (("step_ms.p50", "iteration_median_ms"), ("step_ms.p95", "iteration_p95_ms"),
                       ("steps_per_s", "throughput_steps_per_s")):
        if (value := _num(st.get(field))) is not None:
            out[key] = value
    for phase in _list(st.get("phases")):
        name = _obj(phase).get("name")
        share = _num(_obj(phase).get("share"))
        if isinstance(name, str) and name in PHASE_KEYS and share is not None:
            out[f"share.{PHASE_KEYS[name]}"] = share
    if (skew := _num(st.get("skew"))) is not None:
        out["skew_pct"] = float(f"{skew * 100:.6g}")
    if len(ranks) > 1 and (worst := _int(st.get("worst_rank"))) is not None:
        out["worst_rank"] = worst
    memory = _obj(doc.get("memory"))
    if memory.get("device") == "gpu" and (gpu := _num(memory.get("peak_alloc_bytes"))) is not None:
        out["peak_mem.gpu"] = gpu
    rss = [v for v in map(_num, _obj(memory.get("rss_peak_bytes")).values()) if v is not None]
    if rss:
        out["peak_mem.host"] = max(rss)
    system = _obj(doc.get("system"))
    util = _num(system.get("gpu_util_mean"))
    if util is None:
        util = _num(system.get("gpu_util_median"))
    if util is not None:
        out["gpu_util_pct"] = util
    return {k: _whole(v) for k, v in out.items()}


def _whole(value: PerfValue) -> PerfValue:
    """Byte counts read as floats (JSON numbers rounded to 6 digits) become ints when whole."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**20:
        return int(value)
    return value


PENDING: Final[dict[str, PerfValue]] = {"telemetry": "pending"}
NOT_CAPTURED: Final[dict[str, PerfValue]] = {}


def _regular(path: str) -> os.stat_result | None:
    """The ``lstat`` of a regular file, None for a missing file, a symlink or anything else (a run
    folder is read only through its own files, never through a link leaving it)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def read_perf_facts(run_dir: str | os.PathLike[str]) -> tuple[dict[str, PerfValue], str | None]:
    """The ``perf.*`` facts of one run folder, and a one-line warning when its final summary could
    not be used (None otherwise).

    ``{}`` for a run without an ``aggregator/`` folder (not captured), :data:`PENDING` for a
    captured run without a final summary yet. A final summary that is not JSON, not an object, too
    big or of a newer schema gives ``{"telemetry": "partial"}`` and the warning. Never raises.
    """
    facts, warning, _stamps, _captured = _read(os.fspath(run_dir))
    return facts, warning


def _read(run_dir: str) -> tuple[dict[str, PerfValue], str | None, tuple[Stamp | None, Stamp | None], bool]:
    """(facts, warning, (summary stamp, finalization-warning stamp), aggregator folder present)."""
    agg = os.path.join(run_dir, AGGREGATOR_DIR)
    summary_path = os.path.join(agg, FINAL_SUMMARY)
    st = _regular(summary_path)
    if st is None:
        try:
            captured = stat.S_ISDIR(os.lstat(agg).st_mode)
        except OSError:
            captured = False
        return (dict(PENDING) if captured else {}), None, (None, None), captured
    lost_st = _regular(os.path.join(agg, FINALIZATION_WARNING))
    stamps = ((st.st_mtime_ns, st.st_size), None if lost_st is None else (lost_st.st_mtime_ns, lost_st.st_size))
    name = f"{AGGREGATOR_DIR}/{FINAL_SUMMARY}"
    if st.st_size > MAX_SUMMARY_BYTES:
        return {"telemetry": "partial"}, f"{name}: {st.st_size:,} bytes, too big to read", stamps, True
    try:
        with open(summary_path, "rb") as f:
            doc = orjson.loads(f.read(MAX_SUMMARY_BYTES + 1))
    except OSError as err:
        return {"telemetry": "partial"}, f"{name}: cannot be read ({err.strerror or err})", stamps, True
    except orjson.JSONDecodeError as err:
        return {"telemetry": "partial"}, f"{name}: not valid JSON ({err})", stamps, True
    if not isinstance(doc, dict):
        return {"telemetry": "partial"}, f"{name}: holds {type(doc).__name__}, not an object", stamps, True
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        return ({"telemetry": "partial"},
                f"{name}: schema_version {version!r} is newer than this TraceML reads (upgrade traceml-ai)",
                stamps, True)
    return perf_facts(doc, lost=lost_st is not None), None, stamps, True


@dataclass(slots=True)
class _Entry:
    stamps: tuple[Stamp | None, Stamp | None]
    facts: dict[str, PerfValue]
    warning: str | None
    frozen: bool


class PerfIndex:
    """The ``perf.*`` facts of many run folders, each read again only when its files changed
    (thread-safe).

    :meth:`update` checks the given run folders: a folder whose run is finished and whose final
    summary has been read (or that has no ``aggregator/`` folder at all) is frozen and costs nothing
    until ``force=True`` (the viewer's Refresh); any other folder costs one or two ``stat`` calls, and
    its final summary is parsed again only when its ``(mtime_ns, size)`` changed.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.reads = 0
        """How many final summaries were parsed (tests and the benchmark count them)."""

    def update(self, runs: Iterable[tuple[str, bool]], *, force: bool = False) -> dict[str, dict[str, PerfValue]]:
        """Check ``runs`` (``(run folder, finished)`` pairs) and return the facts of those whose facts
        changed since the last call (a folder seen for the first time counts as changed when it has
        any). Folders not listed are forgotten."""
        changed: dict[str, dict[str, PerfValue]] = {}
        with self._lock:
            seen: set[str] = set()
            for run_dir, finished in runs:
                seen.add(run_dir)
                entry = self._entries.get(run_dir)
                if entry is not None and entry.frozen and not force:
                    continue
                facts, warning, stamps, captured = self._check(run_dir, entry)
                frozen = finished and (not captured or stamps[0] is not None)
                if entry is None:
                    self._entries[run_dir] = _Entry(stamps, facts, warning, frozen)
                    if facts:
                        changed[run_dir] = facts
                    continue
                entry.frozen = frozen
                if facts != entry.facts:
                    changed[run_dir] = facts
                entry.stamps, entry.facts, entry.warning = stamps, facts, warning
            for gone in [k for k in self._entries if k not in seen]:
                del self._entries[gone]
        return changed

    def _check(self, run_dir: str, entry: _Entry | None) -> tuple[dict[str, PerfValue], str | None,
                                                                   tuple[Stamp | None, Stamp | None], bool]:
        if entry is not None and entry.stamps[0] is not None:
            agg = os.path.join(run_dir, AGGREGATOR_DIR)
            st = _regular(os.path.join(agg, FINAL_SUMMARY))
            lost = _regular(os.path.join(agg, FINALIZATION_WARNING))
            stamps = (None if st is None else (st.st_mtime_ns, st.st_size),
                      None if lost is None else (lost.st_mtime_ns, lost.st_size))
            if stamps == entry.stamps:
                return entry.facts, entry.warning, entry.stamps, True
        facts, warning, stamps, captured = _read(run_dir)
        if stamps[0] is not None:
            self.reads += 1
        return facts, warning, stamps, captured

    def facts(self, run_dir: str) -> dict[str, PerfValue]:
        """The facts last read for ``run_dir`` (``{}`` when unknown or not captured)."""
        with self._lock:
            entry = self._entries.get(run_dir)
            return dict(entry.facts) if entry is not None else {}

    def warning(self, run_dir: str) -> str | None:
        """The one-line problem of ``run_dir``'s final summary, if its last read found one."""
        with self._lock:
            entry = self._entries.get(run_dir)
            return entry.warning if entry is not None else None
