"""The run's verdict: :func:`diagnose` a telemetry database into a :class:`Summary`, and write it
as ``<run>/aggregator/final_summary.json`` (DESIGN §2.1, §3.5; shape in docs/diagnoses.md).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast, get_args

import numpy as np
import orjson

from traceml_ai.diagnose.model import Abstention, Finding, number, order_findings, round_sig
from traceml_ai.diagnose.perf import real_problems
from traceml_ai.diagnose.readers import Telemetry, TelemetryStatus, rank_key, read_telemetry
from traceml_ai.diagnose.rules import RULES, Context, build_context, local_work, post_warmup, rank_skew
from traceml_ai.diagnose.stats import median, percentile
from traceml_ai.diagnose.timeline import ITERATION, StepTable, share
from traceml_ai.verdicts import STEP_RULES

SCHEMA_VERSION = 1
"""Version of the final_summary.json shape; readers refuse a newer one."""

AGGREGATOR_DIR = "aggregator"
TELEMETRY_DB = "telemetry.sqlite"
FINAL_SUMMARY = "final_summary.json"


class SummaryFileError(ValueError):
    """final_summary.json exists but cannot be used (not JSON, not an object, a newer schema).

    ``str()`` names the file by its path; ``reason`` is the same without it (``not valid JSON
    (...)``) and ``damaged`` is True when the file is not valid JSON (cut short, garbage written
    over it): readers then say :data:`~traceml_ai.diagnose.perf.SUMMARY_DAMAGED`.
    """

    def __init__(self, message: str, *, reason: str | None = None, damaged: bool = False) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason
        self.damaged = damaged

    def one_line(self) -> str:
        """The problem as the viewer and the run table word it, after ``aggregator/``:
        ``final_summary.json cannot be read (damaged): not valid JSON (...)`` for a damaged file,
        ``final_summary.json: <reason>`` otherwise."""
        from traceml_ai.diagnose.perf import SUMMARY_DAMAGED

        return f"{SUMMARY_DAMAGED}: {self.reason}" if self.damaged else f"{FINAL_SUMMARY}: {self.reason}"


@dataclass(frozen=True)
class PhaseStats:
    """One phase of the step-time breakdown: median and 90th percentile (ms) over every rank's
    post-warm-up steps, its time-weighted ``share`` of the iteration, and the ``steps`` measured."""

    name: str
    median_ms: float | None
    p90_ms: float | None
    share: float | None
    steps: int


@dataclass(frozen=True)
class RankStats:
    """One rank's post-warm-up iteration time (ms) over ``steps`` measured steps, and the median of
    its work outside backward (iteration - backward, ms): synchronised ranks have equal iterations,
    and this is where a straggler among them shows (docs/diagnoses.md, straggler)."""

    rank: int | None
    steps: int
    median_ms: float | None
    p90_ms: float | None
    outside_backward_median_ms: float | None


@dataclass(frozen=True)
class StepTimeSummary:
    """Where the step time goes.

    ``iteration_*`` are of the step's wall time: per step the slowest rank's iteration (a
    synchronous job waits for it), after warm-up (ms): the one definition of "step time" the run
    table's ``perf.step_ms.*``, ``traceml compare``'s ``step_time_ms`` and the Performance view share
    (issue 13 review: the column was the median pooled over every rank's rows, compare and the card
    the per-step one). ``throughput_steps_per_s`` = 1000 / ``iteration_median_ms``. The phases'
    ``median_ms``/``p90_ms`` are over every rank's steps; per rank in ``per_rank``. ``worst_rank``
    is the slowest rank by the straggler rule's measure (:func:`~traceml_ai.diagnose.rules.rank_skew`:
    the higher median iteration or median
    work outside backward) and ``skew`` its excess over the other ranks as a fraction of their
    median iteration (None with one rank, or fewer than two ranks with enough steps);
    ``skew_measure`` says which of the two (``iteration`` / ``outside_backward``);
    ``dataloader_outside_step`` counts steps whose dataloader wait was timed outside ``traceml:step``;
    ``micro_batches_per_step`` is the median number of micro-batches one step (one optimizer update)
    held: above 1 with gradient accumulation (None when the rows do not say).
    ``iteration_p95_ms`` is its 95th percentile (the run table's ``perf.step_ms.p95``).
    """

    iteration_median_ms: float | None
    iteration_p90_ms: float | None
    throughput_steps_per_s: float | None
    phases: tuple[PhaseStats, ...]
    per_rank: tuple[RankStats, ...]
    worst_rank: int | None
    skew: float | None
    dataloader_outside_step: int
    micro_batches_per_step: int | None = None
    iteration_p95_ms: float | None = None
    skew_measure: str | None = None


@dataclass(frozen=True)
class MemorySummary:
    """Memory high-water marks (bytes; None = not measured).

    ``device`` is ``gpu`` when any step had a measured peak on a non-CPU device, ``cpu`` when step
    memory rows name only CPU devices, None without rows. ``peak_*`` are maxima over every step and
    rank; ``device_total_bytes`` the smallest GPU total seen; ``rss_peak_bytes`` the peak RSS per
    rank (keys are ranks as text, ``"?"`` for unknown); ``ram_total_bytes`` the largest host total.
    """

    device: str | None
    peak_alloc_bytes: float | None
    peak_reserved_bytes: float | None
    device_total_bytes: float | None
    rss_peak_bytes: dict[str, float]
    ram_total_bytes: float | None


@dataclass(frozen=True)
class SystemSummary:
    """Host and GPU load after warm-up: host CPU percent (median, p90), host RAM used fraction
    (median, max), the number of GPUs sampled, and their utilisation percent (median, p90, mean)."""

    samples: int
    cpu_percent_median: float | None
    cpu_percent_p90: float | None
    ram_used_fraction_median: float | None
    ram_used_fraction_max: float | None
    gpu_count: int
    gpu_util_median: float | None
    gpu_util_p90: float | None
    gpu_util_mean: float | None = None


@dataclass(frozen=True)
class StepCounts:
    """Steps that left no row by design, summed over the ranks that reported them at their end
    (the ``rank_finished`` frame; docs/diagnoses.md ``steps.discarded``).

    ``discarded``: ``trace_step`` blocks that raised (caught by the training loop, e.g. an OOM
    retry), each discarded whole; an update with a raising micro-batch counts once.
    ``dropped_updates``: incomplete gradient-accumulation updates at the end (no optimizer step
    followed), ``dropped_micro_batches`` the micro-batches they held. ``failed``: steps whose timing
    failed (a fault of TraceML's, not by design: a loss, also in finalization_warning.json).
    """

    discarded: int = 0
    dropped_updates: int = 0
    dropped_micro_batches: int = 0
    failed: int = 0

    @classmethod
    def from_counts(cls, counts: Mapping[str, int] | None) -> StepCounts | None:
        """From the summed ``rank_finished`` ``step_counts`` (keys ``discarded_steps``,
        ``dropped_updates``, ``dropped_micro_batches``, ``failed_steps``; others ignored); None when ``counts`` is
        None or empty (no rank reported)."""
        if not counts:
            return None
        return cls(discarded=int(counts.get("discarded_steps", 0)),
                   dropped_updates=int(counts.get("dropped_updates", 0)),
                   dropped_micro_batches=int(counts.get("dropped_micro_batches", 0)),
                   failed=int(counts.get("failed_steps", 0)))


@dataclass(frozen=True)
class Summary:
    """Everything ``final_summary.json`` holds (see :meth:`to_dict` and docs/diagnoses.md).

    ``findings`` are ordered most severe, then strongest, first; ``abstained`` lists each rule that
    could not judge and why; ``rules_checked`` the rules that ran to a verdict (a finding or none).
    """

    schema_version: int
    generated_at: str
    source: str
    telemetry_status: TelemetryStatus
    telemetry_detail: str | None
    row_counts: dict[str, int]
    problems: tuple[str, ...]
    steps_seen: int
    first_step: int | None
    last_step: int | None
    ranks: tuple[int | None, ...]
    world_size: int | None
    warmup_steps: int
    steps_analysed: int
    sampled_every: int
    step_time: StepTimeSummary | None
    memory: MemorySummary
    system: SystemSummary
    findings: tuple[Finding, ...]
    abstained: tuple[Abstention, ...]
    rules_checked: tuple[str, ...]
    step_counts: StepCounts | None = None
    unread_findings: int = 0
    """Findings of a summary document that could not be read (an unknown severity, a wrong shape):
    left out, so "no finding" cannot be said of such a summary."""

    @property
    def healthy(self) -> bool:
        """No warning or critical finding, and none that could not be read."""
        return not self.unread_findings and not any(f.severity != "info" for f in self.findings)

    @property
    def missing_ranks(self) -> list[int]:
        """The ranks below ``world_size`` that sent nothing (empty when the world size is unknown)."""
        return [r for r in range(self.world_size) if r not in self.ranks] if self.world_size is not None else []

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Summary:
        """The summary a final_summary.json document (shape: :meth:`to_dict`) holds.

        Tolerant like every reader of a run file: a missing or wrong-typed field is "not given"
        (None, 0, empty), an unknown telemetry status reads as ``unreadable``, and findings or
        abstentions that cannot be read are left out and counted in ``problems``. Never raises.
        """
        tel, steps, ranks = _obj(doc.get("telemetry")), _obj(doc.get("steps")), _obj(doc.get("ranks"))
        found = tel.get("status")
        status = cast(TelemetryStatus, found if found in get_args(TelemetryStatus) else "unreadable")
        # A summary written before steps.sampled_every had the sampling note among its problems.
        problems = [p for p in real_problems(_items(tel.get("problems"))) if isinstance(p, str)]
        findings = [Finding.from_dict(f) for f in _items(doc.get("findings"))]
        abstained = [Abstention.from_dict(a) for a in _items(doc.get("abstained"))]
        for what, parsed in (("finding", findings), ("abstention", abstained)):
            bad = sum(1 for x in parsed if x is None)
            if bad:
                problems.append(f"{bad} {what}(s) in the summary could not be read and are left out")
        rows = _obj(tel.get("rows"))
        return cls(
            schema_version=_int(doc.get("schema_version")) or SCHEMA_VERSION,
            generated_at=str(doc.get("generated_at") or ""),
            source=str(tel.get("source") or ""),
            telemetry_status=status,
            telemetry_detail=tel["detail"] if isinstance(tel.get("detail"), str) else None,
            row_counts={k: v for k, v in rows.items() if isinstance(k, str) and _int(v) is not None},
            problems=tuple(problems),
            steps_seen=_int(steps.get("seen")) or 0,
            first_step=_int(steps.get("first")),
            last_step=_int(steps.get("last")),
            ranks=tuple(r for r in _items(ranks.get("seen")) if r is None or _int(r) is not None),
            world_size=_int(ranks.get("world_size")),
            warmup_steps=_int(_obj(doc.get("warmup")).get("steps_skipped_per_rank")) or 0,
            steps_analysed=_int(steps.get("analysed")) or 0,
            sampled_every=_int(steps.get("sampled_every")) or 1,
            step_time=_step_time_from(doc.get("step_time")),
            memory=_memory_from(_obj(doc.get("memory"))),
            system=_system_from(_obj(doc.get("system"))),
            findings=tuple(f for f in findings if f is not None),
            abstained=tuple(a for a in abstained if a is not None),
            rules_checked=tuple(r for r in _items(doc.get("rules_checked")) if isinstance(r, str)),
            step_counts=_step_counts_from(steps),
            unread_findings=sum(1 for f in findings if f is None),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of final_summary.json (every number rounded to 6 significant digits)."""
        missing = self.missing_ranks
        st = self.step_time
        return {
            "schema_version": self.schema_version,
            "generated_at": self.generated_at,
            "telemetry": {
                "source": self.source,
                "status": self.telemetry_status,
                "detail": self.telemetry_detail,
                "rows": dict(self.row_counts),
                "problems": list(self.problems),
            },
            "steps": {
                "seen": self.steps_seen,
                "first": self.first_step,
                "last": self.last_step,
                "analysed": self.steps_analysed,
                "sampled_every": self.sampled_every,
                "discarded": None if self.step_counts is None else self.step_counts.discarded,
                "dropped_updates": None if self.step_counts is None else self.step_counts.dropped_updates,
                "dropped_micro_batches": None if self.step_counts is None else self.step_counts.dropped_micro_batches,
                "failed": None if self.step_counts is None else self.step_counts.failed,
            },
            "ranks": {"seen": list(self.ranks), "world_size": self.world_size, "missing": missing},
            "warmup": {"steps_skipped_per_rank": self.warmup_steps},
            "step_time": None if st is None else {
                "iteration_median_ms": round_sig(st.iteration_median_ms),
                "iteration_p90_ms": round_sig(st.iteration_p90_ms),
                "iteration_p95_ms": round_sig(st.iteration_p95_ms),
                "throughput_steps_per_s": round_sig(st.throughput_steps_per_s),
                "dataloader_outside_step": st.dataloader_outside_step,
                "micro_batches_per_step": st.micro_batches_per_step,
                "phases": [
                    {"name": p.name, "median_ms": round_sig(p.median_ms), "p90_ms": round_sig(p.p90_ms),
                     "share": round_sig(p.share), "steps": p.steps}
                    for p in st.phases
                ],
                "per_rank": [
                    {"rank": r.rank, "steps": r.steps, "median_ms": round_sig(r.median_ms),
                     "p90_ms": round_sig(r.p90_ms),
                     "outside_backward_median_ms": round_sig(r.outside_backward_median_ms)}
                    for r in st.per_rank
                ],
                "worst_rank": st.worst_rank,
                "skew": round_sig(st.skew),
                "skew_measure": st.skew_measure,
            },
            "memory": {
                "device": self.memory.device,
                "peak_alloc_bytes": round_sig(self.memory.peak_alloc_bytes),
                "peak_reserved_bytes": round_sig(self.memory.peak_reserved_bytes),
                "device_total_bytes": round_sig(self.memory.device_total_bytes),
                "rss_peak_bytes": {k: round_sig(v) for k, v in self.memory.rss_peak_bytes.items()},
                "ram_total_bytes": round_sig(self.memory.ram_total_bytes),
            },
            "system": {
                "samples": self.system.samples,
                "cpu_percent_median": round_sig(self.system.cpu_percent_median),
                "cpu_percent_p90": round_sig(self.system.cpu_percent_p90),
                "ram_used_fraction_median": round_sig(self.system.ram_used_fraction_median),
                "ram_used_fraction_max": round_sig(self.system.ram_used_fraction_max),
                "gpu_count": self.system.gpu_count,
                "gpu_util_median": round_sig(self.system.gpu_util_median),
                "gpu_util_p90": round_sig(self.system.gpu_util_p90),
                "gpu_util_mean": round_sig(self.system.gpu_util_mean),
            },
            "findings": [f.to_dict() for f in self.findings],
            "abstained": [a.to_dict() for a in self.abstained],
            "rules_checked": list(self.rules_checked),
        }


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _step_time_from(value: Any) -> StepTimeSummary | None:
    if not isinstance(value, dict):
        return None
    phases = tuple(
        PhaseStats(p["name"], number(p.get("median_ms")), number(p.get("p90_ms")), number(p.get("share")),
                   _int(p.get("steps")) or 0)
        for p in _items(value.get("phases")) if isinstance(p, dict) and isinstance(p.get("name"), str)
    )
    per_rank = tuple(
        RankStats(_int(r.get("rank")), _int(r.get("steps")) or 0, number(r.get("median_ms")),
                  number(r.get("p90_ms")), number(r.get("outside_backward_median_ms")))
        for r in _items(value.get("per_rank")) if isinstance(r, dict)
    )
    return StepTimeSummary(
        iteration_median_ms=number(value.get("iteration_median_ms")),
        iteration_p90_ms=number(value.get("iteration_p90_ms")),
        throughput_steps_per_s=number(value.get("throughput_steps_per_s")),
        phases=phases,
        per_rank=per_rank,
        worst_rank=_int(value.get("worst_rank")),
        skew=number(value.get("skew")),
        dataloader_outside_step=_int(value.get("dataloader_outside_step")) or 0,
        micro_batches_per_step=_int(value.get("micro_batches_per_step")),
        iteration_p95_ms=number(value.get("iteration_p95_ms")),
        skew_measure=measure if isinstance(measure := value.get("skew_measure"), str) else None,
    )


def _memory_from(m: dict[str, Any]) -> MemorySummary:
    rss = {k: n for k, v in _obj(m.get("rss_peak_bytes")).items() if (n := number(v)) is not None}
    return MemorySummary(
        device=m["device"] if isinstance(m.get("device"), str) else None,
        peak_alloc_bytes=number(m.get("peak_alloc_bytes")),
        peak_reserved_bytes=number(m.get("peak_reserved_bytes")),
        device_total_bytes=number(m.get("device_total_bytes")),
        rss_peak_bytes=rss,
        ram_total_bytes=number(m.get("ram_total_bytes")),
    )


def _system_from(s: dict[str, Any]) -> SystemSummary:
    return SystemSummary(
        samples=_int(s.get("samples")) or 0,
        cpu_percent_median=number(s.get("cpu_percent_median")),
        cpu_percent_p90=number(s.get("cpu_percent_p90")),
        ram_used_fraction_median=number(s.get("ram_used_fraction_median")),
        ram_used_fraction_max=number(s.get("ram_used_fraction_max")),
        gpu_count=_int(s.get("gpu_count")) or 0,
        gpu_util_median=number(s.get("gpu_util_median")),
        gpu_util_p90=number(s.get("gpu_util_p90")),
        gpu_util_mean=number(s.get("gpu_util_mean")),
    )


def _step_counts_from(steps: dict[str, Any]) -> StepCounts | None:
    counts = {k: _int(steps.get(k)) for k in ("discarded", "dropped_updates", "dropped_micro_batches", "failed")}
    if all(v is None for v in counts.values()):
        return None
    return StepCounts(counts["discarded"] or 0, counts["dropped_updates"] or 0, counts["dropped_micro_batches"] or 0,
                      counts["failed"] or 0)


def verdict(summary: Summary, *, watch: bool = False, exit_code: int | None = None,
            running: bool = False) -> tuple[str, str]:
    """The one-line verdict of a run's summary (e.g. :func:`read_final_summary`).

    Returns ``(kind, text)``: ``findings`` (a warning or critical finding; the text says how
    many), ``healthy`` ("no bottleneck found": a step-time rule judged and found nothing),
    ``not_judged`` ("not judged: <why>": no step-time rule could judge, e.g. 0 steps, a watch run,
    a script without ``trace_step``; never shown as a green verdict) or ``no_verdict`` (the
    telemetry could not be read). ``watch`` names a ``traceml watch`` run in the reason;
    ``exit_code`` (the script's, when known) says a script that failed before its first step did;
    ``running``: the run is still going (a provisional verdict), so 0 steps may only mean not yet.
    A partial (degraded) telemetry still gets one of the first three; the caller says it is partial.
    """
    if summary.telemetry_status not in ("ok", "degraded"):
        return "no_verdict", "no verdict: the telemetry could not be read"
    serious = [f for f in summary.findings if f.severity in ("warning", "critical")]
    if serious:
        return "findings", f"{len(serious)} finding{'s' if len(serious) != 1 else ''}"
    seen = summary.steps_seen
    # A rule listed as checked judged nothing when no step was timed (a summary written from what an
    # aggregator that died had committed): that is never a green verdict. Nor is a watch run's, even
    # one recorded before watch ignored trace_step: watch is the mode that times no steps.
    if seen and not watch and any(r in STEP_RULES for r in summary.rules_checked):
        return "healthy", "no bottleneck found"
    if watch:
        why = "a watch run times no steps (use traceml run with trace_step for the step-time rules)"
    elif not seen and exit_code is not None and exit_code > 128:
        why = f"the script was stopped by a signal (exit code {exit_code}) before its first step"
    elif not seen and exit_code not in (None, 0):
        why = f"the script failed (exit code {exit_code}) before its first step"
    elif not seen and summary.step_counts is not None and summary.step_counts.failed:
        # (review 11e: every step's timing failed, and the verdict blamed a missing trace_step)
        why = (f"no training step was timed: the timing of all {summary.step_counts.failed} traced step(s) failed "
               "(a TraceML fault; see finalization_warning.json and the [TraceML] notes)")
    elif not seen and running:
        # (review 13i: a live run before its first step was told it has no trace_step)
        why = ("no training step timed yet (the run has not reached its first `trace_step`, or the script "
               "has none)")
    elif not seen:
        why = ("no training step was timed (0 steps: the script has no `with traceml_ai.trace_step(model):`, "
               "or it ended before its first step)")
    else:
        given = {a.rule: a.reason for a in summary.abstained if a.rule in STEP_RULES and a.reason}
        # compute_bound judges any timed run, whichever phases it timed: its reason is what decided
        # it (e.g. too few steps after the warm-up), not one phase rule's "the script did not time
        # this phase", which is as true of a run that is judged.
        why = given.get("compute_bound") or next(iter(given.values()), "no step-time rule had the data to judge")
    return "not_judged", f"not judged: {why}"


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def diagnose(db_path: str | os.PathLike[str], *, source: str | None = None) -> Summary:
    """Run every rule over the telemetry database at ``db_path`` (opened read-only; works while the
    run is live) and summarise the run (DESIGN §3.5).

    ``source`` is the path written in the summary (default: ``db_path`` as given). Never raises for a
    missing, empty or corrupt database: the summary's ``telemetry_status``/``telemetry_detail`` say so
    and every rule abstains with that reason.
    """
    telemetry = read_telemetry(db_path)
    return summarise(telemetry, source=source if source is not None else str(db_path))


def summarise(telemetry: Telemetry, *, source: str | None = None) -> Summary:
    """:func:`diagnose` over telemetry already read (pure; the rules never see the file)."""
    ctx = build_context(telemetry)
    findings: list[Finding] = []
    abstained: list[Abstention] = []
    checked: list[str] = []
    for name, rule in RULES:
        if telemetry.status != "ok":
            abstained.append(Abstention(name, telemetry.detail or telemetry.status))
            continue
        try:
            result = rule(ctx)
        except Exception as e:  # one rule's bug must not cost the run its whole summary
            abstained.append(Abstention(name, f"internal error in this rule: {type(e).__name__}: {e}"))
            continue
        if isinstance(result, Abstention):
            abstained.append(result)
        else:
            checked.append(name)
            findings.extend(result)
    table = ctx.table
    return Summary(
        schema_version=SCHEMA_VERSION,
        generated_at=_now_iso(),
        source=source if source is not None else telemetry.path,
        telemetry_status=telemetry.status,
        telemetry_detail=telemetry.detail,
        row_counts=dict(telemetry.row_counts),
        problems=telemetry.problems,
        steps_seen=telemetry.step_span.distinct if telemetry.step_span else table.steps_seen,
        first_step=telemetry.step_span.first if telemetry.step_span else table.first_step,
        last_step=telemetry.step_span.last if telemetry.step_span else table.last_step,
        ranks=_ranks_seen(telemetry),
        world_size=telemetry.world_size,
        warmup_steps=table.warmup_steps,
        steps_analysed=sum(int(tl.steps.size) for tl in table.ranks),
        sampled_every=telemetry.sampled_every,
        step_time=_step_time(table, telemetry),
        memory=_memory(ctx),
        system=_system(ctx),
        findings=tuple(order_findings(findings)),
        abstained=tuple(abstained),
        rules_checked=tuple(checked),
    )


def _ranks_seen(telemetry: Telemetry) -> tuple[int | None, ...]:
    ranks = {s.rank for s in telemetry.steps} | {m.rank for m in telemetry.memory} | {p.rank for p in telemetry.process}
    return tuple(sorted(ranks, key=rank_key))


def _step_time(table: StepTable, telemetry: Telemetry) -> StepTimeSummary | None:
    if not table.ranks or not any(tl.steps.size for tl in table.ranks):
        return None
    # The step's wall time: per step the slowest rank's iteration (the job waits for it).
    _, iters = table.job_series(ITERATION)
    phases = []
    for name in table.phase_names:
        values = [tl.phase(name) for tl in table.ranks]
        pooled = np.concatenate(values)
        both_phase = np.concatenate([v[np.isfinite(v) & np.isfinite(tl.iteration_ms)]
                                     for v, tl in zip(values, table.ranks, strict=True)])
        both_iter = np.concatenate([tl.iteration_ms[np.isfinite(v) & np.isfinite(tl.iteration_ms)]
                                    for v, tl in zip(values, table.ranks, strict=True)])
        phases.append(PhaseStats(name, median(pooled), percentile(pooled, 90), share(both_phase, both_iter),
                                 int(np.isfinite(pooled).sum())))
    per_rank = tuple(
        RankStats(tl.rank, int(np.isfinite(tl.iteration_ms).sum()), median(tl.iteration_ms),
                  percentile(tl.iteration_ms, 90), median(local_work(tl)))
        for tl in table.ranks
    )
    slowest = rank_skew(table.ranks)
    worst, skew, measure = (None, None, None) if isinstance(slowest, str) else (
        slowest.rank, slowest.skew, slowest.measure)
    job_median = median(iters)
    return StepTimeSummary(
        iteration_median_ms=median(iters),
        iteration_p90_ms=percentile(iters, 90),
        throughput_steps_per_s=1000.0 / job_median if job_median else None,
        phases=tuple(phases),
        per_rank=per_rank,
        worst_rank=worst,
        skew=skew,
        dataloader_outside_step=sum(tl.dataloader_outside for tl in table.ranks),
        micro_batches_per_step=_micro_batches(telemetry),
        iteration_p95_ms=percentile(iters, 95),
        skew_measure=measure,
    )


def _micro_batches(telemetry: Telemetry) -> int | None:
    """The median number of traced micro-batches per step (gradient accumulation), over every step
    that says; None when none does."""
    counts = [s.micro_batches for s in telemetry.steps if s.micro_batches is not None]
    if not counts:
        return None
    return int(np.median(counts))


def _memory(ctx: Context) -> MemorySummary:
    tel = ctx.telemetry
    gpu_peaks = [m for m in tel.memory_peaks if m.device is not None and not m.device.startswith("cpu")]
    alloc = [m.peak_alloc_bytes for m in gpu_peaks if m.peak_alloc_bytes is not None]
    reserved = [m.peak_reserved_bytes for m in gpu_peaks if m.peak_reserved_bytes is not None]
    device = "gpu" if alloc or reserved else ("cpu" if tel.memory_peaks else None)
    totals = [p.gpu_mem_total_bytes for p in tel.process if p.gpu_mem_total_bytes is not None]
    totals += [g.mem_total_bytes for g in ctx.gpus_in_use if g.mem_total_bytes is not None]
    rss: dict[str, float] = {}
    for p in sorted(tel.process, key=lambda p: rank_key(p.rank)):
        if p.rss_bytes is not None:
            key = "?" if p.rank is None else str(p.rank)
            rss[key] = max(rss.get(key, 0.0), p.rss_bytes)
    ram = [p.ram_total_bytes for p in tel.process if p.ram_total_bytes is not None]
    ram += [s.ram_total_bytes for s in tel.system if s.ram_total_bytes is not None]
    return MemorySummary(
        device=device,
        peak_alloc_bytes=max(alloc) if alloc else None,
        peak_reserved_bytes=max(reserved) if reserved else None,
        device_total_bytes=min(totals) if totals else None,
        rss_peak_bytes=rss,
        ram_total_bytes=max(ram) if ram else None,
    )


def _system(ctx: Context) -> SystemSummary:
    system = post_warmup(ctx.telemetry.system, ctx.warmup_end_ns)
    cpu = [s.cpu_percent for s in system if s.cpu_percent is not None]
    ram = [s.ram_used_bytes / s.ram_total_bytes for s in system
           if s.ram_used_bytes is not None and s.ram_total_bytes]
    gpus = post_warmup(ctx.gpus_in_use, ctx.warmup_end_ns)
    util = [g.util for g in gpus if g.util is not None]
    per_host: dict[str | None, set[int]] = defaultdict(set)
    for g in ctx.gpus_in_use:
        per_host[g.hostname].add(g.gpu_idx)
    return SystemSummary(
        samples=len(system),
        cpu_percent_median=median(cpu),
        cpu_percent_p90=percentile(cpu, 90),
        ram_used_fraction_median=median(ram),
        ram_used_fraction_max=max(ram) if ram else None,
        gpu_count=sum(len(v) for v in per_host.values()),
        gpu_util_median=median(util),
        gpu_util_p90=percentile(util, 90),
        gpu_util_mean=sum(util) / len(util) if util else None,
    )


def telemetry_path(run_dir: str | os.PathLike[str]) -> Path:
    """``<run_dir>/aggregator/telemetry.sqlite``."""
    return Path(run_dir) / AGGREGATOR_DIR / TELEMETRY_DB


def final_summary_path(run_dir: str | os.PathLike[str]) -> Path:
    """``<run_dir>/aggregator/final_summary.json``."""
    return Path(run_dir) / AGGREGATOR_DIR / FINAL_SUMMARY


def dumps(summary: Summary) -> bytes:
    """The summary as indented JSON bytes with a trailing newline."""
    return orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a unique dot-prefixed temp file in the same folder, fsync
    and rename, so a reader sees the old file or the new one, never half of one, and two writers
    never share a temp file. The mode follows the umask like every other run file (0644 under the
    usual 022; ``tempfile.mkstemp`` would make it 0600 and a teammate could not read it).

    Raises:
        OSError: the folder is missing or not writable, or the disk is full (``path`` unchanged).
    """
    folder = os.fspath(Path(path).parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f".{Path(path).name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"cannot create a temp file in {folder}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_final_summary(
    run_dir: str | os.PathLike[str], *, degraded: str | None = None, step_counts: Mapping[str, int] | None = None
) -> Path:
    """Diagnose ``<run_dir>/aggregator/telemetry.sqlite`` and write
    ``<run_dir>/aggregator/final_summary.json`` atomically (temporary file in the same folder, fsync,
    rename), so a reader sees the old file or the new one, never half of one. Returns its path.

    A missing, empty or corrupt database still gives a summary that says so. ``degraded`` is the
    reason the telemetry stops early (the aggregator died during the run, written by the launcher):
    a readable database then gets telemetry status ``"degraded"`` with that reason as its detail,
    and the findings cover only the rows committed before. ``step_counts`` are the ranks' summed
    ``rank_finished`` step counts (:meth:`StepCounts.from_counts`; the aggregator passes them);
    without them ``steps.discarded`` and its siblings are null.

    Raises:
        OSError: the aggregator folder cannot be created or written.
    """
    target = final_summary_path(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    summary = diagnose(telemetry_path(run_dir), source=f"{AGGREGATOR_DIR}/{TELEMETRY_DB}")
    if degraded is not None and summary.telemetry_status == "ok":
        summary = dataclasses.replace(summary, telemetry_status="degraded", telemetry_detail=degraded)
    counted = StepCounts.from_counts(step_counts)
    if counted is not None:
        summary = dataclasses.replace(summary, step_counts=counted)
    write_atomic(target, dumps(summary))
    return target


def read_final_summary(run_dir: str | os.PathLike[str]) -> Summary | None:
    """The typed :class:`Summary` of ``<run_dir>/aggregator/final_summary.json`` (see
    :meth:`Summary.from_dict`), or None when the run has none. Errors as :func:`load_final_summary`.
    """
    doc = load_final_summary(run_dir)
    return None if doc is None else Summary.from_dict(doc)


def load_final_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON document of ``<run_dir>/aggregator/final_summary.json`` (shape: :meth:`Summary.to_dict`),
    or None when the run has none.

    Raises:
        SummaryFileError: the file is not JSON, not an object, has a newer ``schema_version``, or
            holds a value no TraceML writes (a share outside 0-1, a negative time, a median that is
            text, an unknown telemetry status: :func:`~traceml_ai.diagnose.perf_summary.checked_summary_facts`).
        OSError: the file exists but cannot be read.
    """
    path = final_summary_path(run_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        what = f"not valid JSON ({e})"
        raise SummaryFileError(f"{path} is {what}", reason=what, damaged=True) from None
    if not isinstance(doc, dict):
        what = f"holds {type(doc).__name__}, not a JSON object"
        raise SummaryFileError(f"{path} {what}", reason=what)
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        what = f"has schema_version {version!r}; this TraceML reads up to {SCHEMA_VERSION} (upgrade traceml-ai)"
        raise SummaryFileError(f"{path} {what}", reason=what)
    from traceml_ai.diagnose.perf_summary import checked_summary_facts

    odd = checked_summary_facts(doc)[1]
    if odd:  # values no TraceML writes (a share of 1.7, a median of "fast"): the file is not to be believed
        what = f"holds values TraceML never writes ({'; '.join(odd)})"
        raise SummaryFileError(f"{path} {what}", reason=what)
    return doc
