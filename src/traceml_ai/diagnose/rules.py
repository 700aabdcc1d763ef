"""The diagnosis rules (DESIGN §3.5; thresholds and reasoning in docs/diagnoses.md).

Every rule is a pure function ``rule(ctx) -> list[Finding] | Abstention`` over a :class:`Context`
built once from what :func:`~traceml_ai.diagnose.readers.read_telemetry` returned. A rule that lacks
the data to judge returns an :class:`Abstention` saying which data; it never guesses. An empty list
means "checked, nothing wrong".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from traceml_ai.diagnose import thresholds as th
from traceml_ai.diagnose.model import Abstention, Evidence, Finding, Severity
from traceml_ai.diagnose.readers import GpuSample, ProcessSample, SystemSample, Telemetry, rank_key
from traceml_ai.diagnose.stats import CreepTest, FloatArray, creep_test, median, percentile, slope_per_unit
from traceml_ai.diagnose.timeline import (
    COMPUTE_PHASES,
    INNER_PHASES,
    OTHER,
    RankTimeline,
    StepTable,
    build_step_table,
    share,
)
from traceml_ai.telemetry import schema
from traceml_ai.verdicts import RULE_KINDS

RuleResult = list[Finding] | Abstention
Rule = Callable[["Context"], RuleResult]

_MIB = float(th.MIB)


@dataclass(frozen=True)
class Context:
    """What every rule reads: the telemetry, its step table, and derived facts.

    ``warmup_end_ns`` is when the last rank finished its warm-up steps (None when no step has a
    timestamp); ``gpu_run`` whether the run used a GPU (a non-CPU device with a measured peak, or a
    process on a GPU device); ``gpus_in_use`` the GPU samples of the GPUs the ranks used.
    """

    telemetry: Telemetry
    table: StepTable
    warmup_end_ns: int | None
    gpu_run: bool
    gpus_in_use: tuple[GpuSample, ...]
    gpu_ranks: dict[tuple[str | None, int], tuple[int | None, ...]]


def build_context(telemetry: Telemetry, warmup_steps: int = th.WARMUP_STEPS) -> Context:
    """Derive the :class:`Context` of one run's telemetry."""
    table = build_step_table(telemetry.steps, warmup_steps)
    ends = [tl.warmup_end_ns for tl in table.ranks if tl.warmup_end_ns is not None]
    gpu_memory = any(
        m.device is not None and not m.device.startswith("cpu") and m.peak_alloc_bytes is not None
        for m in telemetry.memory
    )
    used: dict[tuple[str | None, int], set[int | None]] = defaultdict(set)
    for p in telemetry.process:
        if p.gpu_device_index is not None:
            used[(p.hostname, p.gpu_device_index)].add(p.rank)
    gpu_run = gpu_memory or bool(used)
    # The GPUs the ranks named (torch device index = NVML position without CUDA_VISIBLE_DEVICES
    # remapping); when no rank named one, every GPU of the host counts.
    in_use = tuple(g for g in telemetry.gpus if (g.hostname, g.gpu_idx) in used) if used else telemetry.gpus
    return Context(
        telemetry=telemetry,
        table=table,
        warmup_end_ns=max(ends) if ends else None,
        gpu_run=gpu_run,
        gpus_in_use=in_use,
        gpu_ranks={k: tuple(sorted(v, key=rank_key)) for k, v in used.items()},
    )


# -- helpers ------------------------------------------------------------------------------------------


def _severity(value: float, warn: float, critical: float, *, low_is_bad: bool = False) -> Severity | None:
    if low_is_bad:
        return "critical" if value < critical else "warning" if value < warn else None
    return "critical" if value >= critical else "warning" if value >= warn else None


def _crossed(severity: Severity, warn: float, critical: float) -> float:
    """The threshold a finding of ``severity`` crossed: the critical one for a critical finding."""
    return critical if severity == "critical" else warn


def _strength(value: float, threshold: float, *, low_is_bad: bool = False) -> float:
    if low_is_bad:
        return threshold / value if value > 0 else float("inf")
    return value / threshold if threshold > 0 else float("inf")


def _lower_median(values: Sequence[float]) -> float:
    """The median for odd counts, the lower middle for even ones: with two ranks, the less affected
    one. A job-level verdict then holds on at least half the ranks, and one odd rank is left to the
    straggler rule."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def _step_window(timelines: Iterable[RankTimeline]) -> tuple[int, int] | None:
    ranges = [r for tl in timelines if (r := tl.step_range) is not None]
    if not ranges:
        return None
    return (min(a for a, _ in ranges), max(b for _, b in ranges))


def _ranks_text(ranks: Sequence[int | None]) -> str:
    names = ["?" if r is None else str(r) for r in ranks]
    return ("rank " if len(names) == 1 else "ranks ") + ", ".join(names)


def _pct(x: float) -> str:
    """``x`` (a fraction) in whole percent, except just below a multiple of 5 % (where every
    threshold lies), which is floored to one decimal: 0.197 is "19.7%", never the "20%" of a warning
    it is not (review 11e)."""
    v = x * 100
    whole = round(v)
    # (the 1e-6: 0.346 * 100 is 34.599999999999994, which must floor to 34.6, review 11f)
    if whole > v and whole % 5 == 0 and v < whole - 0.05:
        return f"{math.floor(v * 10 + 1e-6) / 10:.1f}%"
    if whole > v and whole % 5 == 0:
        return f"{min(math.floor(v * 100 + 1e-6) / 100, whole - 0.01):.2f}%"
    return f"{v:.0f}%"


def _mib(x: float) -> str:
    return f"{x / _MIB:,.0f} MiB"


_Snapshot = TypeVar("_Snapshot", ProcessSample, SystemSample, GpuSample)


def post_warmup(samples: Sequence[_Snapshot], warmup_end_ns: int | None) -> list[_Snapshot]:
    """Snapshots after warm-up, in time order: those measured after the last rank's warm-up steps,
    or, when no step or no snapshot has a timestamp, all but the first ``WARMUP_SAMPLES``."""
    ordered = sorted(samples, key=lambda s: (s.timestamp_ns is None, s.timestamp_ns or 0, s.seq or 0))
    if warmup_end_ns is not None and any(s.timestamp_ns is not None for s in ordered):
        return [s for s in ordered if s.timestamp_ns is not None and s.timestamp_ns > warmup_end_ns]
    return ordered[th.WARMUP_SAMPLES :]


# -- phase-share rules --------------------------------------------------------------------------------


def _rank_shares(table: StepTable, phase: str) -> dict[int | None, tuple[float, int]]:
    """Per rank with enough measured steps: (time-weighted share of ``phase``, steps used)."""
    out: dict[int | None, tuple[float, int]] = {}
    for tl in table.ranks:
        values = tl.phase(phase)
        both = np.isfinite(values) & np.isfinite(tl.iteration_ms)
        n = int(both.sum())
        if n < th.MIN_STEPS:
            continue
        s = share(values, tl.iteration_ms)
        if s is not None:
            out[tl.rank] = (s, n)
    return out


def _share_abstention(table: StepTable, rule: str, phase: str) -> Abstention:
    if not table.ranks:
        return Abstention(rule, "no step_time rows")
    if phase not in table.phase_names:
        return Abstention(rule, f"no {phase} events were recorded (the script did not time this phase)")
    return Abstention(
        rule,
        f"fewer than {th.MIN_STEPS} post-warm-up steps (after skipping {table.warmup_steps} per rank) with both "
        f"{phase} and traceml:step measured on any rank",
    )


def _share_rule(
    ctx: Context, rule: str, phase: str, warn: float, critical: float, what: str, action: str
) -> RuleResult:
    shares = _rank_shares(ctx.table, phase)
    if not shares:
        return _share_abstention(ctx.table, rule, phase)
    job = _lower_median([s for s, _ in shares.values()])
    severity = _severity(job, warn, critical)
    if severity is None:
        return []
    ranks = tuple(r for r, (s, _) in shares.items() if s >= warn)
    timelines = [tl for tl in ctx.table.ranks if tl.rank in shares]
    median_ms = median(np.concatenate([tl.phase(phase) for tl in timelines]))
    scope = "" if len(shares) == 1 else f" on {_ranks_text(ranks)}"
    summary = f"{_pct(job)} of each training step is spent {what} ({phase}, median {median_ms or 0:.1f} ms){scope}."
    return [
        Finding(
            kind=rule,
            severity=severity,
            summary=summary,
            action=action,
            evidence=Evidence(f"{phase.removeprefix(schema.PHASE_PREFIX)}_share", job,
                              _crossed(severity, warn, critical), ranks, _step_window(timelines)),
            strength=_strength(job, _crossed(severity, warn, critical)),
        )
    ]


def input_bound(ctx: Context) -> RuleResult:
    """Input-bound: the dataloader wait takes at least ``INPUT_BOUND_INFO`` of the iteration (info),
    ``INPUT_BOUND_WARN`` (warning), ``INPUT_BOUND_CRITICAL`` (critical), and its median is at least
    ``INPUT_BOUND_MIN_MS`` per step (a smaller wait is never flagged, whatever its share). The summary
    gives the time lost: the median wait per step (ms) and the share as minutes per hour of training."""
    rule = "input_bound"
    phase = schema.DATALOADER_NEXT
    shares = _rank_shares(ctx.table, phase)
    if not shares:
        return _share_abstention(ctx.table, rule, phase)
    job = _lower_median([s for s, _ in shares.values()])
    severity: Severity | None = _severity(job, th.INPUT_BOUND_WARN, th.INPUT_BOUND_CRITICAL)
    threshold = th.INPUT_BOUND_WARN
    if severity is None:
        if job < th.INPUT_BOUND_INFO:
            return []
        severity, threshold = "info", th.INPUT_BOUND_INFO
    ranks = tuple(r for r, (s, _) in shares.items() if s >= threshold)
    timelines = [tl for tl in ctx.table.ranks if tl.rank in shares]
    median_ms = median(np.concatenate([tl.phase(phase) for tl in timelines])) or 0.0
    if median_ms < th.INPUT_BOUND_MIN_MS:
        return []  # a large share of a tiny step: too little time to win back
    if severity == "critical":
        threshold = th.INPUT_BOUND_CRITICAL
    scope = "" if len(shares) == 1 else f" on {_ranks_text(ranks)}"
    summary = (
        f"{_pct(job)} of each training step is spent waiting for the next batch ({phase}, median "
        f"{median_ms:.1f} ms per step, {job * 60:.0f} min of every hour of training){scope}."
    )
    return [
        Finding(
            kind=rule,
            severity=severity,
            summary=summary,
            action="Feed the loop faster: raise DataLoader num_workers, set persistent_workers=True and a "
            "prefetch_factor, cache or pre-decode a slow dataset, and move heavy augmentation off the training "
            "process.",
            evidence=Evidence(f"{phase.removeprefix(schema.PHASE_PREFIX)}_share", job, threshold, ranks,
                              _step_window(timelines)),
            strength=_strength(job, threshold),
        )
    ]


def h2d_bound(ctx: Context) -> RuleResult:
    """Host-to-device-bound: copying the batch takes at least ``H2D_BOUND_WARN`` of the iteration."""
    return _share_rule(
        ctx, "h2d_bound", schema.H2D, th.H2D_BOUND_WARN, th.H2D_BOUND_CRITICAL,
        "copying the batch to the device",
        "Use DataLoader(pin_memory=True) with .to(device, non_blocking=True), send compact dtypes (e.g. uint8 "
        "images, converted on the device), and copy only the tensors the step uses.",
    )


def optimizer_bound(ctx: Context) -> RuleResult:
    """Optimizer-bound: ``optimizer.step()`` takes at least ``OPTIMIZER_BOUND_WARN`` of the iteration."""
    return _share_rule(
        ctx, "optimizer_bound", schema.OPTIMIZER_STEP, th.OPTIMIZER_BOUND_WARN, th.OPTIMIZER_BOUND_CRITICAL,
        "in optimizer.step()",
        "Make the update cheaper: a foreach or fused optimizer (e.g. AdamW(foreach=True), fused=True on GPU), "
        "fewer parameter groups, no per-parameter Python work around the step (clipping loops, EMA copies), or "
        "step less often with gradient accumulation.",
    )


def compute_bound(ctx: Context) -> RuleResult:
    """Compute-bound (info): forward + backward + optimizer take at least ``COMPUTE_BOUND_SHARE`` of the
    iteration; on a GPU run the GPUs' median utilisation says whether the GPU is the busy part."""
    rule = "compute_bound"
    table = ctx.table
    present = [p for p in COMPUTE_PHASES if p in table.phase_names]
    if not present:
        return Abstention(rule, "no forward, backward or optimizer_step events were recorded")
    shares: dict[int | None, float] = {}
    per_phase: dict[str, list[float]] = defaultdict(list)
    for tl in table.ranks:
        stack = np.vstack([tl.phase(p) for p in present])
        measured = np.isfinite(stack).any(axis=0)
        compute = np.where(measured, np.nansum(stack, axis=0), np.nan)
        if int((np.isfinite(compute) & np.isfinite(tl.iteration_ms)).sum()) < th.MIN_STEPS:
            continue
        s = share(compute, tl.iteration_ms)
        if s is None:
            continue
        shares[tl.rank] = s
        for p in present:
            ps = share(tl.phase(p), tl.iteration_ms)
            if ps is not None:
                per_phase[p].append(ps)
    if not shares:
        return _share_abstention(table, rule, present[0])
    job = _lower_median(list(shares.values()))
    if job < th.COMPUTE_BOUND_SHARE:
        return []
    dominant = max(per_phase, key=lambda p: float(np.median(per_phase[p])))
    dom_share = float(np.median(per_phase[dominant]))
    parts = f"{_pct(job)} of each step is forward/backward/optimizer, most in {dominant} ({_pct(dom_share)})"
    util = median([g.util for g in post_warmup(ctx.gpus_in_use, ctx.warmup_end_ns) if g.util is not None])
    if ctx.gpu_run and util is not None:
        if util >= th.COMPUTE_BOUND_GPU_UTIL:
            summary = f"GPU compute-bound: {parts}, and the GPUs are {util:.0f}% busy."
        else:
            summary = (f"Compute phases dominate ({parts}) but the GPUs are only {util:.0f}% busy: likely CPU-side "
                       "kernel-launch overhead or small kernels.")
    else:
        summary = f"CPU compute-bound: {parts}."
    return [
        Finding(
            kind=rule,
            severity="info",
            summary=summary,
            action="To go faster, make the compute cheaper: mixed precision, a larger batch per step, "
            "torch.compile, or a smaller model.",
            evidence=Evidence("compute_share", job, th.COMPUTE_BOUND_SHARE, tuple(shares),
                              _step_window(tl for tl in table.ranks if tl.rank in shares)),
            strength=_strength(job, th.COMPUTE_BOUND_SHARE),
        )
    ]


# -- ranks --------------------------------------------------------------------------------------------


def local_work(tl: RankTimeline) -> FloatArray:
    """Per step, the iteration minus backward. Synchronous data parallelism makes the fast ranks
    wait for the slow one inside backward (gradient all-reduce), which evens out iteration times;
    the time outside backward is what each rank did on its own."""
    backward = tl.phase(schema.BACKWARD)
    if not np.isfinite(backward).any():
        return tl.iteration_ms
    return tl.iteration_ms - backward


@dataclass(frozen=True)
class RankSkew:
    """The slowest rank by the straggler measure (see :func:`rank_skew`).

    ``measure`` is ``iteration`` (its median iteration against the other ranks' median) or
    ``outside_backward`` (its median work outside backward against the other ranks', see
    :func:`local_work`); ``skew`` the excess as a fraction of the other ranks' median iteration
    either way; ``mine`` / ``theirs`` the two medians compared (ms); ``above_noise`` whether the gap
    clears the step-to-step spread the straggler rule asks for.
    """

    rank: int | None
    skew: float
    measure: str
    mine: float
    theirs: float
    above_noise: bool


def rank_skew(ranks: Sequence[RankTimeline]) -> RankSkew | str:
    """The one measure of rank skew: the straggler rule's, the run table's ``perf.worst_rank`` /
    ``perf.skew_pct`` and the viewer's per-rank panels all read it, so they name the same rank.

    Over the ranks with at least ``MIN_STRAGGLER_STEPS`` measured steps, two candidates: the rank
    with the highest median iteration, and the rank with the highest median work outside backward
    (what tells a straggler under DDP, where the others wait for it in backward). Of those whose gap
    clears the steps' noise (the interquartile range of the iteration, the larger of the suspect's
    own and the other ranks' median; for the work outside backward, its spread too), the larger skew
    wins; when neither clears it, the larger skew all the same (``above_noise`` False). A string
    (why) when there is nothing to compare.
    """
    if len(ranks) < 2:
        seen = "no rank" if not ranks else "one rank"
        return f"{seen} reported step times; comparing ranks needs two or more"
    usable = [tl for tl in ranks if int(np.isfinite(tl.iteration_ms).sum()) >= th.MIN_STRAGGLER_STEPS]
    if len(usable) < 2:
        return f"fewer than two ranks have {th.MIN_STRAGGLER_STEPS} measured post-warm-up steps"
    it_med = {tl.rank: float(np.nanmedian(tl.iteration_ms)) for tl in usable}
    it_iqr = {tl.rank: _iqr(tl.iteration_ms) for tl in usable}
    local = {tl.rank: lw for tl in usable if np.isfinite(lw := local_work(tl)).any()}
    local_med = {r: float(np.nanmedian(lw)) for r, lw in local.items()}
    local_iqr = {r: _iqr(lw) for r, lw in local.items()}
    candidates: list[RankSkew] = []
    worst = max(it_med, key=lambda r: it_med[r])
    others = float(np.median([v for r, v in it_med.items() if r != worst]))

    def step_noise(rank: int | None) -> float:
        # The spread a gap must clear: the suspect's own (a rank starved of CPU jitters too) or the
        # other ranks' median, whichever is larger.
        return max(it_iqr[rank], float(np.median([v for r, v in it_iqr.items() if r != rank])))

    if others > 0:
        gap = it_med[worst] - others
        candidates.append(RankSkew(worst, gap / others, "iteration", it_med[worst], others, gap > step_noise(worst)))
    if len(local_med) >= 2:
        lworst = max(local_med, key=lambda r: local_med[r])
        lothers = float(np.median([v for r, v in local_med.items() if r != lworst]))
        lnoise = max(local_iqr[lworst], float(np.median([v for r, v in local_iqr.items() if r != lworst])),
                     step_noise(lworst))
        base = float(np.median([v for r, v in it_med.items() if r != lworst]))
        if base > 0:
            gap = local_med[lworst] - lothers
            candidates.append(RankSkew(lworst, gap / base, "outside_backward", local_med[lworst], lothers,
                                       gap > lnoise))
    if not candidates:
        return "the other ranks' median step time is 0 ms; no ratio exists"
    clear = [c for c in candidates if c.above_noise]
    return max(clear or candidates, key=lambda c: c.skew)


def straggler(ctx: Context) -> RuleResult:
    """Straggler: the slowest rank by :func:`rank_skew` (its median iteration, or its work outside
    backward, see :func:`local_work`) exceeds the median of the other ranks by at least
    ``STRAGGLER_WARN`` of their iteration time, and by more than the step-to-step spread
    (interquartile range) of the iteration, the larger of the suspect rank's own and the other
    ranks' median (and, for the work outside backward, of that work's spread too): a gap the steps'
    noise covers, such as ranks jostling for the cores of a busy host, is no evidence. Both measures
    face the iteration's spread, because the skew is a share of the iteration either way and the
    work outside backward is less noisy than the whole step."""
    rule = "straggler"
    measured = rank_skew(ctx.table.ranks)
    if isinstance(measured, str):
        return Abstention(rule, measured)
    if not measured.above_noise:
        return []  # the slowest rank is within the ranks' own step-to-step noise
    usable = [tl for tl in ctx.table.ranks if int(np.isfinite(tl.iteration_ms).sum()) >= th.MIN_STRAGGLER_STEPS]
    skew, rank, mine, theirs = measured.skew, measured.rank, measured.mine, measured.theirs
    how = "total" if measured.measure == "iteration" else "local"
    severity = _severity(skew, th.STRAGGLER_WARN, th.STRAGGLER_CRITICAL)
    if severity is None:
        return []
    crossed = _crossed(severity, th.STRAGGLER_WARN, th.STRAGGLER_CRITICAL)
    slow = next(tl for tl in usable if tl.rank == rank)
    rest = [tl for tl in usable if tl.rank != rank]
    phase, excess = _excess_phase(slow, rest)
    label = "time outside the timed phases" if phase == OTHER else phase
    where = f", mostly in {label} (+{excess:.1f} ms)" if phase is not None else ""
    if how == "total":
        summary = (f"Rank {_rank_name(rank)} is a straggler: its steps take {mine:.1f} ms against {theirs:.1f} ms on "
                   f"the other ranks (+{_pct(skew)}){where}.")
    else:
        summary = (f"Rank {_rank_name(rank)} is a straggler: outside backward it works {mine:.1f} ms per step against "
                   f"{theirs:.1f} ms on the other ranks (+{_pct(skew)} of a step){where}; the other ranks wait "
                   "for it in backward's gradient all-reduce.")
    return [
        Finding(
            kind=rule,
            severity=severity,
            summary=summary,
            action=f"Find what rank {_rank_name(rank)} does differently: a slower data shard, a busier or throttled "
            "host, or work only that rank does inside the step (logging, checkpointing, evaluation); balance it or "
            "move it out of the step.",
            evidence=Evidence("rank_step_time_skew" if how == "total" else "rank_local_time_skew", skew,
                              crossed, (rank,), _step_window(usable)),
            strength=_strength(skew, crossed),
        )
    ]


def _iqr(values: FloatArray) -> float:
    """Interquartile range (p75 − p25) of the finite values, 0 when there are none."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 0.0
    p25, p75 = np.percentile(finite, [25, 75])
    return float(p75 - p25)


def _rank_name(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _excess_phase(slow: RankTimeline, rest: Sequence[RankTimeline]) -> tuple[str | None, float]:
    """The phase (built-in or ``other``) where ``slow`` spends the most extra ms per step over the
    median of the other ranks; (None, 0) when no phase is longer."""
    best: tuple[str | None, float] = (None, 0.0)
    for phase in (*INNER_PHASES, OTHER):
        mine = median(slow.phase(phase))
        theirs = [m for tl in rest if (m := median(tl.phase(phase))) is not None]
        if mine is None or not theirs:
            continue
        excess = mine - float(np.median(theirs))
        if excess > best[1]:
            best = (phase, excess)
    return best


# -- memory -------------------------------------------------------------------------------------------


def _is_gpu_device(device: str | None) -> bool:
    return device is not None and not device.startswith("cpu")


def memory_pressure(ctx: Context) -> RuleResult:
    """Memory pressure: a rank's peak reserved GPU memory near its device's total, or the summed
    peak RSS of the ranks on one host near its RAM total. Uses every step, warm-up included: an
    out-of-memory kill does not wait for warm-up to end."""
    rule = "memory_pressure"
    findings: list[Finding] = []
    reasons: list[str] = []
    tel = ctx.telemetry

    reserved: dict[int | None, float] = {}
    steps: dict[int | None, list[int]] = defaultdict(list)
    for peak in tel.memory_peaks:
        if _is_gpu_device(peak.device) and peak.peak_reserved_bytes is not None:
            reserved[peak.rank] = max(reserved.get(peak.rank, 0.0), peak.peak_reserved_bytes)
            steps[peak.rank].extend(s for s in (peak.first_step, peak.last_step) if s is not None)
    if reserved:
        totals: dict[int | None, float] = {}
        for p in tel.process:
            if p.gpu_mem_total_bytes is not None:
                totals[p.rank] = max(totals.get(p.rank, 0.0), p.gpu_mem_total_bytes)
        device_totals = [g.mem_total_bytes for g in ctx.gpus_in_use if g.mem_total_bytes is not None]
        fractions = {}
        for rank, most in reserved.items():
            total = totals.get(rank) or (min(device_totals) if device_totals else None)
            if total:
                fractions[rank] = most / total
        if fractions:
            worst = max(fractions, key=lambda r: fractions[r])
            value = fractions[worst]
            severity = _severity(value, th.GPU_MEMORY_PRESSURE_WARN, th.GPU_MEMORY_PRESSURE_CRITICAL)
            if severity is not None:
                ranks = tuple(r for r, f in fractions.items() if f >= th.GPU_MEMORY_PRESSURE_WARN)
                all_steps = [s for r in ranks for s in steps[r]]
                crossed = _crossed(severity, th.GPU_MEMORY_PRESSURE_WARN, th.GPU_MEMORY_PRESSURE_CRITICAL)
                findings.append(Finding(
                    kind=rule,
                    severity=severity,
                    summary=f"GPU memory is nearly full: peak reserved {_mib(reserved[worst])} is {_pct(value)} of "
                    f"the device on rank {_rank_name(worst)}.",
                    action="Lower the batch size or sequence length, use mixed precision or activation "
                    "checkpointing, and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
                    evidence=Evidence("gpu_peak_reserved_fraction", value, crossed, ranks,
                                      (min(all_steps), max(all_steps)) if all_steps else None),
                    strength=_strength(value, crossed),
                ))
        else:
            reasons.append("the GPU's total memory is unknown (no gpu_mem_total_bytes or GPU mem_total_bytes)")
    else:
        reasons.append("no per-step peak GPU memory (CPU run, or peaks not measured)")

    host_finding = _host_memory_pressure(ctx)
    if isinstance(host_finding, str):
        reasons.append(host_finding)
    elif host_finding is not None:
        findings.append(host_finding)
    if findings:
        return findings
    if len(reasons) == 2:
        return Abstention(rule, "; ".join(reasons))
    return []


def _host_memory_pressure(ctx: Context) -> Finding | str | None:
    """The host part of :func:`memory_pressure`: a Finding, None (checked, fine) or why it abstains."""
    rss: dict[tuple[str | None, int | None], float] = {}
    ram_total: dict[str | None, float] = {}
    for p in ctx.telemetry.process:
        if p.rss_bytes is not None:
            key = (p.hostname, p.rank)
            rss[key] = max(rss.get(key, 0.0), p.rss_bytes)
        if p.ram_total_bytes is not None:
            ram_total[p.hostname] = p.ram_total_bytes
    for s in ctx.telemetry.system:
        if s.ram_total_bytes is not None:
            ram_total.setdefault(s.hostname, s.ram_total_bytes)
    if not rss:
        return "no process RSS samples"
    per_host: dict[str | None, float] = defaultdict(float)
    host_ranks: dict[str | None, list[int | None]] = defaultdict(list)
    for (host, rank), peak in rss.items():
        per_host[host] += peak  # summed per-rank peaks: an upper bound when peaks happen at different times
        host_ranks[host].append(rank)
    fractions = {h: used / ram_total[h] for h, used in per_host.items() if ram_total.get(h)}
    if not fractions:
        return "the host's RAM total is unknown"
    host = max(fractions, key=lambda h: fractions[h])
    value = fractions[host]
    severity = _severity(value, th.HOST_MEMORY_PRESSURE_WARN, th.HOST_MEMORY_PRESSURE_CRITICAL)
    if severity is None:
        return None
    ranks = tuple(sorted(host_ranks[host], key=rank_key))
    crossed = _crossed(severity, th.HOST_MEMORY_PRESSURE_WARN, th.HOST_MEMORY_PRESSURE_CRITICAL)
    return Finding(
        kind="memory_pressure",
        severity=severity,
        summary=f"The training processes use {_pct(value)} of the host's RAM ({_mib(per_host[host])} peak RSS on "
        f"{_ranks_text(ranks)}).",
        action="Lower the batch size, DataLoader num_workers or prefetch_factor, or keep less of the dataset in "
        "memory; near the limit the host swaps or the kernel kills a rank.",
        evidence=Evidence("host_rss_fraction", value, crossed, ranks, _step_window(
            tl for tl in ctx.table.ranks if tl.rank in ranks)),
        strength=_strength(value, crossed),
    )


@dataclass(frozen=True)
class _Creep:
    rank: int | None
    test: CreepTest
    rate: float | None
    rate_unit: str
    steps: tuple[int, int] | None


def memory_creep(ctx: Context) -> RuleResult:
    """Memory creep: after warm-up, a rank's per-step peak allocated GPU memory, or its process RSS
    over time, rises steadily (:func:`~traceml_ai.diagnose.stats.creep_test`)."""
    gpu_series, gpu_tested, gpu_creeps = _gpu_creeps(ctx)
    rss_series, training_end_ns, rss_tested, rss_creeps = _rss_creeps(ctx)
    if not gpu_tested and not rss_tested:
        return _creep_abstention(ctx, bool(gpu_series), rss_series, training_end_ns)
    return [_creep_finding(metric, found) for metric, found in
            (("gpu_peak_alloc", gpu_creeps), ("process_rss", rss_creeps)) if found]


def _gpu_creeps(ctx: Context) -> tuple[dict[int | None, list[tuple[int, float]]], int, list[_Creep]]:
    """Each rank's post-warm-up per-step peak allocated GPU memory, how many series could be
    tested, and those that creep (rate in bytes per step)."""
    series: dict[int | None, list[tuple[int, float]]] = defaultdict(list)
    for m in ctx.telemetry.memory:
        if _is_gpu_device(m.device) and m.peak_alloc_bytes is not None:
            series[m.rank].append((m.step, m.peak_alloc_bytes))
    tested = 0
    creeps = []
    for rank, points in series.items():
        pts = sorted(points)[ctx.table.warmup_steps :]
        test = creep_test([v for _, v in pts])
        if test is None:
            continue
        tested += 1
        if test.creeping:
            rate = slope_per_unit([s for s, _ in pts], [v for _, v in pts])
            creeps.append(_Creep(rank, test, rate, "step", (pts[0][0], pts[-1][0])))
    return series, tested, creeps


def _rss_creeps(ctx: Context) -> tuple[dict[int | None, list[ProcessSample]], int | None, int, list[_Creep]]:
    """Each rank's RSS snapshots up to the last training step, the time of that step (ns; None
    without steps), how many series could be tested, and those that creep (bytes per second)."""
    series: dict[int | None, list[ProcessSample]] = defaultdict(list)
    # RSS is judged over the training steps only: before them it grows with imports and data loading,
    # after the last step it falls as the script frees what it held. A run without steps (no
    # trace_step, `traceml watch`) has no such window, so RSS creep is not judged there.
    step_times = [s.timestamp_ns for s in ctx.telemetry.steps if s.timestamp_ns is not None]
    training_end_ns = max(step_times) if step_times else None
    if ctx.warmup_end_ns is not None and training_end_ns is not None:
        for p in ctx.telemetry.process:
            if p.rss_bytes is not None and (p.timestamp_ns is None or p.timestamp_ns <= training_end_ns):
                series[p.rank].append(p)
    tested = 0
    creeps = []
    for rank, samples in series.items():
        kept = post_warmup(samples, ctx.warmup_end_ns)
        rss = [s.rss_bytes if s.rss_bytes is not None else np.nan for s in kept]
        test = creep_test(rss)
        if test is None:
            continue
        tested += 1
        if test.creeping:
            times = [s.timestamp_ns / 1e9 if s.timestamp_ns is not None else np.nan for s in kept]
            creeps.append(_Creep(rank, test, slope_per_unit(times, rss), "s", _steps_between(ctx, rank, kept)))
    return series, training_end_ns, tested, creeps


def _creep_abstention(ctx: Context, any_gpu: bool, rss_series: Mapping[int | None, Sequence[ProcessSample]],
                      training_end_ns: int | None) -> Abstention:
    """Why no memory series had enough post-warm-up points to judge."""
    gpu_note = "too few steps" if any_gpu else "none"
    if training_end_ns is None or ctx.warmup_end_ns is None:
        rss_note = "judged over training steps only, and this run recorded none (no trace_step)"
    elif not rss_series:
        rss_note = "none"
    else:
        most = max(len(post_warmup(v, ctx.warmup_end_ns)) for v in rss_series.values())
        rss_note = (f"at most {most} per rank between the end of warm-up and the last step; "
                    "sample more often with --interval, or train longer")
    return Abstention(
        "memory_creep",
        f"no series with {th.MIN_CREEP_SAMPLES} post-warm-up points: per-step peak GPU memory ({gpu_note}), "
        f"process RSS snapshots ({rss_note})",
    )


def _creep_finding(metric: str, found: Sequence[_Creep]) -> Finding:
    """One finding for every rank whose ``metric`` creeps, with the numbers of the worst of them."""
    worst = max(found, key=lambda c: c.test.relative)
    t = worst.test
    what = "Peak allocated GPU memory per step" if metric == "gpu_peak_alloc" else "Process memory (RSS)"
    rate_text = ""
    if worst.rate is not None and worst.rate > 0:
        rate_text = (f", about {worst.rate * 100 / _MIB:,.1f} MiB per 100 steps" if worst.rate_unit == "step"
                     else f", about {worst.rate * 60 / _MIB:,.1f} MiB per minute")
    ranks = tuple(sorted((c.rank for c in found), key=rank_key))
    windows = [c.steps for c in found if c.steps is not None]
    severity: Severity = "critical" if t.relative >= th.CREEP_CRITICAL_GROWTH else "warning"
    crossed = _crossed(severity, th.CREEP_MIN_GROWTH, th.CREEP_CRITICAL_GROWTH)
    return Finding(
        kind="memory_creep",
        severity=severity,
        summary=f"{what} of {_ranks_text(ranks)} grows steadily after warm-up: {_mib(t.early)} → {_mib(t.late)} "
        f"(+{_pct(t.relative)}){rate_text}.",
        action="Something keeps references across steps: e.g. a list that collects tensors (append loss.item(), "
        "not loss), caches keyed by batch, or growing histories; detach and convert, or clear them.",
        evidence=Evidence(f"{metric}_growth", t.relative, crossed, ranks,
                          (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None),
        strength=_strength(t.relative, crossed),
    )


def _steps_between(ctx: Context, rank: int | None, samples: Sequence[ProcessSample]) -> tuple[int, int] | None:
    """The rank's steps measured within the time span of ``samples`` (None without timestamps)."""
    times = [s.timestamp_ns for s in samples if s.timestamp_ns is not None]
    tl = ctx.table.rank(rank)
    if not times or tl is None:
        return None
    inside = tl.steps[(tl.timestamps_ns >= min(times)) & (tl.timestamps_ns <= max(times))]
    return (int(inside.min()), int(inside.max())) if inside.size else None


# -- system -------------------------------------------------------------------------------------------


def low_gpu_util(ctx: Context) -> RuleResult:
    """Low GPU utilisation: the median utilisation of the GPUs the run uses is under ``LOW_GPU_UTIL_WARN``."""
    rule = "low_gpu_util"
    if not ctx.telemetry.gpus:
        return Abstention(rule, "no GPU utilisation samples (CPU-only run, or NVML unavailable)")
    if not ctx.gpu_run:
        return Abstention(rule, "the run used no GPU (no CUDA memory rows), though the host has GPUs")
    samples = post_warmup(ctx.gpus_in_use, ctx.warmup_end_ns)
    utils = [g.util for g in samples if g.util is not None]
    if len(utils) < th.MIN_SERIES_SAMPLES:
        return Abstention(rule, f"fewer than {th.MIN_SERIES_SAMPLES} post-warm-up GPU utilisation samples")
    value = float(np.median(utils))
    severity = _severity(value, th.LOW_GPU_UTIL_WARN, th.LOW_GPU_UTIL_CRITICAL, low_is_bad=True)
    if severity is None:
        return []
    ranks = tuple(sorted({r for g in samples for r in ctx.gpu_ranks.get((g.hostname, g.gpu_idx), ())}, key=rank_key))
    crossed = _crossed(severity, th.LOW_GPU_UTIL_WARN, th.LOW_GPU_UTIL_CRITICAL)
    return [Finding(
        kind=rule,
        severity=severity,
        summary=f"The GPUs are busy only {value:.0f}% of the time (median utilisation after warm-up).",
        action="The GPU waits on the host: see the input and host-to-device findings; use more DataLoader "
        "workers, a larger batch, non_blocking copies, and avoid CPU syncs (.item(), .cpu()) inside the step.",
        evidence=Evidence("gpu_util_percent", value, crossed, ranks, _step_window(ctx.table.ranks)),
        strength=_strength(value, crossed, low_is_bad=True),
    )]


def cpu_pressure(ctx: Context) -> RuleResult:
    """Host CPU saturated (median ≥ ``CPU_PRESSURE``): a warning when it feeds GPUs, info on a CPU run
    (a CPU training is expected to use the CPU)."""
    rule = "cpu_pressure"
    samples = post_warmup(ctx.telemetry.system, ctx.warmup_end_ns)
    cpu = [s.cpu_percent for s in samples if s.cpu_percent is not None]
    if len(cpu) < th.MIN_SERIES_SAMPLES:
        return Abstention(rule, f"fewer than {th.MIN_SERIES_SAMPLES} post-warm-up host CPU samples")
    value = float(np.median(cpu))
    if value < th.CPU_PRESSURE:
        return []
    if ctx.gpu_run:
        severity: Severity = "warning"
        summary = f"The host CPU is saturated ({value:.0f}% median) while it has to feed the GPUs."
        action = ("Free CPU for the input pipeline: fewer competing processes, cheaper augmentation, or a machine "
                  "with more cores per GPU; check the input-bound finding.")
    else:
        severity = "info"
        summary = f"The host CPU is saturated ({value:.0f}% median), as expected for training on the CPU."
        action = "Nothing to fix unless other work shares this host; set torch.set_num_threads to the cores you own."
    return [Finding(
        kind=rule, severity=severity, summary=summary, action=action,
        evidence=Evidence("host_cpu_percent", value, th.CPU_PRESSURE, (), _step_window(ctx.table.ranks)),
        strength=_strength(value, th.CPU_PRESSURE),
    )]


def ram_pressure(ctx: Context) -> RuleResult:
    """Host RAM nearly full: the 90th percentile of used/total on a host is at least ``RAM_PRESSURE_WARN``."""
    rule = "ram_pressure"
    by_host: dict[str | None, list[float]] = defaultdict(list)
    for s in post_warmup(ctx.telemetry.system, ctx.warmup_end_ns):
        if s.ram_used_bytes is not None and s.ram_total_bytes:
            by_host[s.hostname].append(s.ram_used_bytes / s.ram_total_bytes)
    usable = {h: v for h, v in by_host.items() if len(v) >= th.MIN_SERIES_SAMPLES}
    if not usable:
        return Abstention(rule, f"fewer than {th.MIN_SERIES_SAMPLES} post-warm-up host RAM samples with a total")
    p90 = {h: percentile(v, 90) or 0.0 for h, v in usable.items()}
    host = max(p90, key=lambda h: p90[h])
    value = p90[host]
    severity = _severity(value, th.RAM_PRESSURE_WARN, th.RAM_PRESSURE_CRITICAL)
    if severity is None:
        return []
    where = f" on {host}" if host else ""
    crossed = _crossed(severity, th.RAM_PRESSURE_WARN, th.RAM_PRESSURE_CRITICAL)
    return [Finding(
        kind=rule,
        severity=severity,
        summary=f"Host RAM is nearly full{where}: {_pct(value)} used (90th percentile after warm-up).",
        action="Free host memory: fewer DataLoader workers or a smaller prefetch_factor, a memory-mapped dataset "
        "instead of an in-memory one, or stop other jobs on the host.",
        evidence=Evidence("host_ram_used_fraction", value, crossed, (), _step_window(ctx.table.ranks)),
        strength=_strength(value, crossed),
    )]


_BY_NAME: dict[str, Rule] = {
    rule.__name__: rule for rule in (input_bound, h2d_bound, optimizer_bound, compute_bound, straggler,
                                     memory_pressure, memory_creep, low_gpu_util, cpu_pressure, ram_pressure)
}
RULES: tuple[tuple[str, Rule], ...] = tuple((kind, _BY_NAME[kind]) for kind in RULE_KINDS)
"""Every rule, by name, in the order they run (findings are ordered afterwards): the names are
:data:`traceml_ai.verdicts.RULE_KINDS`, the words the run table's filters accept (a rule of
a name without a rule fails here at import; tests/diagnose/test_rules.py checks no rule is left out)."""
