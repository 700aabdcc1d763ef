"""``compare(run_a, run_b)``: a verdict per metric from the two runs' per-step samples (DESIGN §3.5;
method and thresholds in docs/diagnoses.md, "Comparing runs").

For each metric the test is the ratio of medians ``median(B) / median(A)`` with a 95 % circular
block-bootstrap interval (:func:`~traceml_ai.diagnose.stats.median_ratio_ci`):

- ``inconclusive``: either run has fewer than ``COMPARE_MIN_SAMPLES`` samples, or the interval is
  too wide to decide;
- ``equivalent``: the medians differ by less than the metric's floor, or the whole interval lies
  within ``1 ± COMPARE_MARGIN``;
- ``regression`` / ``improvement``: the whole interval lies on one side of 1 and the ratio is past
  the margin, in the metric's bad / good direction;
- a time verdict (step time, throughput, a phase) of ``regression`` / ``improvement`` becomes
  ``inconclusive: host load differed (...)`` when the host CPU used by processes other than the
  training's ranks (median host CPU percent less the ranks' own share) differs between the two
  runs by more than :data:`HOST_LOAD_DIFF_PERCENT` points, unless its whole interval lies beyond
  :data:`HOST_LOAD_MAX_FACTOR` (a change no busier host explains: it stands, with a note);
- a phase's ``regression`` / ``improvement`` that only followed a change of the input pipeline
  (``dataloader_next_ms`` makes up most of the step-time change, the phase little of it) becomes
  ``inconclusive`` (:func:`input_pipeline_rule`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from traceml_ai.diagnose import thresholds as th
from traceml_ai.diagnose.model import round_sig
from traceml_ai.diagnose.readers import Telemetry, read_telemetry
from traceml_ai.diagnose.rules import Context, build_context, post_warmup
from traceml_ai.diagnose.stats import FloatArray, finite, median_ratio_ci
from traceml_ai.diagnose.summary import telemetry_path
from traceml_ai.diagnose.timeline import ITERATION, OTHER
from traceml_ai.telemetry import schema

Verdict = Literal["regression", "improvement", "equivalent", "inconclusive"]
Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class MetricComparison:
    """One metric of two runs.

    ``median_a``/``median_b`` in ``unit``; ``ratio`` = median_b / median_a with its interval
    ``ci_low``..``ci_high``; ``change_pct`` = (ratio - 1) x 100 (signed); ``worse_pct`` how much
    worse B is in percent (negative when better; for a ``higher``-is-better metric (1 - ratio) x 100);
    ``reason`` explains the ``verdict`` in one line.
    """

    metric: str
    unit: str
    better: Better
    samples_a: int
    samples_b: int
    median_a: float | None
    median_b: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    change_pct: float | None
    worse_pct: float | None
    verdict: Verdict
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "unit": self.unit,
            "better": self.better,
            "samples_a": self.samples_a,
            "samples_b": self.samples_b,
            "median_a": round_sig(self.median_a),
            "median_b": round_sig(self.median_b),
            "ratio": round_sig(self.ratio),
            "ci_low": round_sig(self.ci_low),
            "ci_high": round_sig(self.ci_high),
            "change_pct": round_sig(self.change_pct),
            "worse_pct": round_sig(self.worse_pct),
            "verdict": self.verdict,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Comparison:
    """Verdicts of run B against run A (the baseline), one per metric, plus each run's telemetry
    problems (a missing or corrupt database makes every metric of that run inconclusive)."""

    run_a: str
    run_b: str
    generated_at: str
    metrics: tuple[MetricComparison, ...]
    problems: tuple[str, ...]
    unusable: tuple[str, ...] = ()
    """One line per run whose telemetry has no rows to compare (``B: telemetry database is damaged:
    ...``, ``A: no telemetry database at ...``): with any, nothing was compared (every verdict is
    ``inconclusive`` for that reason) and ``traceml compare`` exits 1. Also in ``problems``."""

    def regressions(self, over_pct: float = 0.0) -> list[MetricComparison]:
        """Metrics whose verdict is ``regression`` with B worse by more than ``over_pct`` percent."""
        return [m for m in self.metrics
                if m.verdict == "regression" and m.worse_pct is not None and m.worse_pct > over_pct]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "generated_at": self.generated_at,
            "method": {
                "statistic": "ratio of medians, B / A",
                "interval": f"{th.COMPARE_CONFIDENCE:.0%} circular block bootstrap, {th.COMPARE_RESAMPLES} resamples",
                "margin": th.COMPARE_MARGIN,
                "min_samples": th.COMPARE_MIN_SAMPLES,
            },
            "metrics": [m.to_dict() for m in self.metrics],
            "problems": list(self.problems),
            "unusable": list(self.unusable),
        }


@dataclass(frozen=True)
class _Metric:
    name: str
    unit: str
    better: Better
    floor: float


def _db(run: str | os.PathLike[str]) -> Path:
    """A run folder's telemetry database, or the path itself when it is a database file."""
    path = Path(run)
    return path if path.is_file() else telemetry_path(path)


def metric_samples(ctx: Context) -> dict[str, tuple[_Metric, FloatArray]]:
    """Every comparable metric of one run with its ordered post-warm-up samples.

    Step-based metrics take, per step, the slowest rank (the job waits for it); ``rss_bytes`` and
    ``gpu_util_percent`` are the snapshots of every rank / GPU in use, in time order.
    """
    table = ctx.table
    _, iteration = table.job_series(ITERATION)
    median_iter = float(np.nanmedian(iteration)) if np.isfinite(iteration).any() else 0.0
    phase_floor = th.COMPARE_PHASE_FLOOR_SHARE * median_iter
    out: dict[str, tuple[_Metric, FloatArray]] = {
        "step_time_ms": (_Metric("step_time_ms", "ms", "lower", 0.0), iteration),
    }
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(iteration > 0, 1000.0 / iteration, np.nan)
    out["throughput_steps_per_s"] = (_Metric("throughput_steps_per_s", "steps/s", "higher", 0.0), throughput)
    for phase in table.phase_names:
        if phase.startswith(schema.PHASE_PREFIX) or phase == OTHER:
            name = f"{phase.removeprefix(schema.PHASE_PREFIX)}_ms"
            out[name] = (_Metric(name, "ms", "lower", phase_floor), table.job_series(phase)[1])

    per_step: dict[int, float] = {}
    by_rank: dict[int | None, list[tuple[int, float]]] = {}
    for m in ctx.telemetry.memory:
        if m.device is not None and not m.device.startswith("cpu") and m.peak_alloc_bytes is not None:
            by_rank.setdefault(m.rank, []).append((m.step, m.peak_alloc_bytes))
    for points in by_rank.values():
        for step, value in sorted(points)[table.warmup_steps :]:
            per_step[step] = max(per_step.get(step, 0.0), value)
    out["peak_alloc_bytes"] = (
        _Metric("peak_alloc_bytes", "bytes", "lower", th.COMPARE_MEMORY_FLOOR_BYTES),
        np.asarray([per_step[s] for s in sorted(per_step)], dtype=np.float64),
    )
    rss = [s.rss_bytes for s in post_warmup(ctx.telemetry.process, ctx.warmup_end_ns) if s.rss_bytes is not None]
    out["rss_bytes"] = (_Metric("rss_bytes", "bytes", "lower", th.COMPARE_MEMORY_FLOOR_BYTES),
                        np.asarray(rss, dtype=np.float64))
    util = [g.util for g in post_warmup(ctx.gpus_in_use, ctx.warmup_end_ns)
            if g.util is not None] if ctx.gpu_run else []
    out["gpu_util_percent"] = (_Metric("gpu_util_percent", "percent", "higher", th.COMPARE_UTIL_FLOOR_PERCENT),
                               np.asarray(util, dtype=np.float64))
    return out


def compare_metric(metric: str, unit: str, better: Better, a: FloatArray, b: FloatArray,
                   floor: float = 0.0) -> MetricComparison:
    """The verdict for one metric from the two runs' ordered samples (see module docs)."""
    xa, xb = finite(a), finite(b)
    ma = float(np.median(xa)) if xa.size else None
    mb = float(np.median(xb)) if xb.size else None

    def result(verdict: Verdict, reason: str, ci: tuple[float, float, float] | None = None) -> MetricComparison:
        ratio = ci[0] if ci else (mb / ma if ma and mb is not None else None)
        change = (ratio - 1) * 100 if ratio is not None else None
        worse = None if change is None else (change if better == "lower" else -change)
        return MetricComparison(metric, unit, better, int(xa.size), int(xb.size), ma, mb, ratio,
                                ci[1] if ci else None, ci[2] if ci else None, change, worse, verdict, reason)

    if not xa.size and not xb.size:
        return result("inconclusive", "not measured in either run")
    if xa.size < th.COMPARE_MIN_SAMPLES or xb.size < th.COMPARE_MIN_SAMPLES:
        return result("inconclusive", f"too few samples (A: {xa.size}, B: {xb.size}; each run needs "
                                      f"{th.COMPARE_MIN_SAMPLES})")
    assert ma is not None and mb is not None
    if abs(mb - ma) <= floor:
        return result("equivalent", f"medians differ by {_amount(abs(mb - ma), unit)}, within the floor of "
                                    f"{_amount(floor, unit)}")
    ci = median_ratio_ci(xa, xb, confidence=th.COMPARE_CONFIDENCE, resamples=th.COMPARE_RESAMPLES,
                         seed=th.COMPARE_SEED)
    if ci is None:
        return result("inconclusive", "run A's median is 0, so no ratio exists")
    ratio, low, high = ci
    interval = f"B/A = {ratio:.3f}, {th.COMPARE_CONFIDENCE:.0%} interval [{low:.3f}, {high:.3f}]"
    lo_margin, hi_margin = 1 - th.COMPARE_MARGIN, 1 + th.COMPARE_MARGIN
    if lo_margin <= low and high <= hi_margin:
        return result("equivalent", f"{interval} lies within 1 ± {th.COMPARE_MARGIN:g}", ci)
    if low > 1 and ratio >= hi_margin:
        return result("regression" if better == "lower" else "improvement", f"{interval} lies above 1", ci)
    if high < 1 and ratio <= lo_margin:
        return result("improvement" if better == "lower" else "regression", f"{interval} lies below 1", ci)
    return result("inconclusive", f"{interval} is too wide or too close to the margin to decide", ci)


def compare(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str]) -> Comparison:
    """Compare run B against run A (the baseline): a verdict per metric (step time, each phase,
    throughput, peak GPU memory, RSS, GPU utilisation).

    ``run_a``/``run_b`` are run folders (their ``aggregator/telemetry.sqlite`` is read, read-only) or
    telemetry database files. Never raises for a missing or corrupt database: its metrics are
    ``inconclusive``, ``problems`` and ``unusable`` say why. A database that reads but is visibly
    damaged (:func:`~traceml_ai.diagnose.perf.telemetry_damage`: truncated since its final summary
    was written) is compared on the rows still readable, with a problem that says so.
    """
    tel_a, tel_b = read_telemetry(_db(run_a)), read_telemetry(_db(run_b))
    result = compare_telemetry(tel_a, tel_b, run_a=str(run_a), run_b=str(run_b))
    damaged = [f"{label}: aggregator/telemetry.sqlite: {damage}; compared on the rows still readable"
               for label, run, tel in (("A", run_a, tel_a), ("B", run_b, tel_b))
               if tel.status in ("ok", "degraded") and (damage := _visible_damage(run)) is not None]
    return dataclasses.replace(result, problems=(*damaged, *result.problems)) if damaged else result


def _visible_damage(run: str | os.PathLike[str]) -> str | None:
    """:func:`~traceml_ai.diagnose.perf.telemetry_damage` of a run folder (None for a database file)."""
    from traceml_ai.diagnose.perf import telemetry_damage
    from traceml_ai.diagnose.summary import final_summary_path

    path = Path(run)
    if path.is_file():
        return None
    return telemetry_damage(path, summarised=final_summary_path(path).is_file())


UNUSABLE: Final = frozenset({"missing", "empty", "corrupt", "unreadable"})
"""Telemetry statuses with no rows to compare (see :class:`~traceml_ai.diagnose.readers.Telemetry`)."""


def compare_telemetry(tel_a: Telemetry, tel_b: Telemetry, *, run_a: str, run_b: str) -> Comparison:
    """:func:`compare` over telemetry already read."""
    problems = [f"{label}: {t.detail or t.status}" for label, t in (("A", tel_a), ("B", tel_b)) if t.status != "ok"]
    # A verdict on time says little when the host was busier in one run than in the other.
    ctx_a, ctx_b = build_context(tel_a), build_context(tel_b)
    samples_a = metric_samples(ctx_a)
    samples_b = metric_samples(ctx_b)
    names = list(samples_a) + [n for n in samples_b if n not in samples_a]
    empty = np.empty(0, dtype=np.float64)
    metrics = []
    for name in names:
        spec, a = samples_a.get(name, (None, empty))
        spec_b, b = samples_b.get(name, (None, empty))
        spec = spec or spec_b
        assert spec is not None
        if name not in samples_a or name not in samples_b:
            side = "A" if name in samples_a else "B"
            metrics.append(_only_in(spec, a, b, side))
            continue
        metrics.append(compare_metric(name, spec.unit, spec.better, a, b, spec.floor))
    metrics = input_pipeline_rule(metrics)
    load_a, load_b = host_cpu_load(ctx_a), host_cpu_load(ctx_b)
    if load_a is not None and load_b is not None and _loads_differ(load_a, load_b):
        note = f"host load differed (host CPU {load_a.host:.0f}% in A vs {load_b.host:.0f}% in B, medians"
        if load_a.others is not None and load_b.others is not None:
            note += f"; other processes {load_a.others:.0f}% vs {load_b.others:.0f}%"
        note += ")"
        problems.append(f"{note}: the step-time verdicts are inconclusive; compare runs made on an equally busy host")
        metrics = [_host_load_inconclusive(m, note) for m in metrics]
    unusable = tuple(f"{label}: {t.detail or t.status}" for label, t in (("A", tel_a), ("B", tel_b))
                     if t.status in UNUSABLE)
    if unusable:  # the reason is the database, not the sample count or a phase "only A timed"
        why = "; ".join(unusable)
        metrics = [dataclasses.replace(m, verdict="inconclusive", reason=f"nothing to compare: {why}")
                   for m in metrics]
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Comparison(run_a, run_b, generated, tuple(metrics), tuple(problems), unusable)


INPUT_METRIC: Final = f"{schema.DATALOADER_NEXT.removeprefix(schema.PHASE_PREFIX)}_ms"
"""The input pipeline's phase among the compared metrics (``dataloader_next_ms``)."""
INPUT_DOMINANT_SHARE: Final = 0.5
"""Share of the step-time change the input phase's change must make up (same direction) for the
input-pipeline rule to apply (docs/diagnoses.md, "Comparing runs", input pipeline)."""
INPUT_SECONDARY_SHARE: Final = 0.2
"""A phase whose change (same direction) is at most this share of the input phase's change is not
judged beside it when the input-pipeline rule applies."""


def input_pipeline_rule(metrics: list[MetricComparison]) -> list[MetricComparison]:
    """``metrics`` with the phases that only followed the input pipeline's change made
    ``inconclusive`` (docs/diagnoses.md, "Comparing runs", input pipeline).

    When ``step_time_ms`` and ``dataloader_next_ms`` have the same ``regression`` / ``improvement``
    verdict and the data loader's change of median (ms) makes up at least
    :data:`INPUT_DOMINANT_SHARE` of the step's, every other phase (``<phase>_ms``) with that same
    verdict whose change is at most :data:`INPUT_SECONDARY_SHARE` of the data loader's becomes
    ``inconclusive``: after waiting for data the next phases run on a CPU or GPU that idled (cold
    caches, lower clocks), so a loader made slower also times forward, backward and optimizer a
    little slower (measured: +66 % to +91 % of 1 ms phases beside a +99 ms loader), and a faster one
    a little faster, though they did not change. Step time, throughput and the loader's own
    verdict stand.
    """
    by_name = {m.metric: m for m in metrics}
    step, loader = by_name.get("step_time_ms"), by_name.get(INPUT_METRIC)
    if step is None or loader is None or step.verdict not in ("regression", "improvement"):
        return metrics
    d_step, d_loader = _median_change(step), _median_change(loader)
    if (loader.verdict != step.verdict or d_step is None or d_loader is None or d_step * d_loader <= 0
            or abs(d_loader) < INPUT_DOMINANT_SHARE * abs(d_step)):
        return metrics

    def judged(m: MetricComparison) -> MetricComparison:
        d = _median_change(m)
        if (m.metric in ("step_time_ms", INPUT_METRIC) or m.unit != "ms" or m.verdict != step.verdict
                or d is None or abs(d) > INPUT_SECONDARY_SHARE * abs(d_loader)):
            return m
        assert d_step is not None and d_loader is not None
        note = (f"inconclusive: moved with the input pipeline ({INPUT_METRIC} {_signed_ms(d_loader)} of the "
                f"step's {_signed_ms(d_step)}; this phase {_signed_ms(d)}, at most "
                f"{INPUT_SECONDARY_SHARE:.0%} of that: phases after a wait for data speed up or slow down "
                "with it, caches and clocks)")
        return dataclasses.replace(m, verdict="inconclusive", reason=f"{note}; {m.reason}")

    return [judged(m) for m in metrics]


def _median_change(m: MetricComparison) -> float | None:
    """median B − median A, or None when either is missing."""
    return None if m.median_a is None or m.median_b is None else m.median_b - m.median_a


def _signed_ms(value: float) -> str:
    return f"{'+' if value >= 0 else '-'}{sig3(abs(value))} ms"


HOST_LOAD_DIFF_PERCENT: Final = 25.0
"""Host CPU percent (median after warm-up, of the whole host) by which two runs may differ before
their time verdicts are not trusted: on a busier host every phase slows down (docs/diagnoses.md,
"Comparing runs", host load)."""

HOST_LOAD_MAX_FACTOR: Final = 3.0
"""The largest change (ratio of medians, either way) a busier host is taken to explain: a verdict
whose whole interval lies beyond it (B at least 3x slower, or 3x faster) stands when the host load
differed, with a note (docs/diagnoses.md, "Comparing runs", host load). Two busy loops beside the
digits example on 2 cores slowed no phase by more than about 2x."""

TIME_UNITS: Final = frozenset({"ms", "steps/s"})
"""Metrics a busier host slows down: step time, throughput and every phase."""


HOST_LOAD_MIN_SAMPLES: Final = 2
"""Host snapshots (one a second) a run needs for its load to be compared: the ones after warm-up
when there are 3 or more, else all of them (a short run still says how busy its host was)."""


@dataclass(frozen=True)
class HostLoad:
    """A run's median host CPU percent (0-100, the whole host) and the part of it that processes
    other than the training's ranks used (``None`` when the ranks' CPU was not sampled)."""

    host: float
    others: float | None


def _loads_differ(a: HostLoad, b: HostLoad) -> bool:
    """What the other processes used when both runs say, else the whole host's CPU (a training on the
    CPU fills the host itself, so only the others tell a busier machine from a busier training)."""
    if a.others is not None and b.others is not None:
        return abs(b.others - a.others) > HOST_LOAD_DIFF_PERCENT
    return abs(b.host - a.host) > HOST_LOAD_DIFF_PERCENT


def _load_window(samples: list[Any], warmup_end_ns: int | None) -> list[Any]:
    after = post_warmup(samples, warmup_end_ns)
    return after if len(after) >= 3 else samples


def host_cpu_load(ctx: Context) -> HostLoad | None:
    """The run's host load (:class:`HostLoad`), or None with fewer than :data:`HOST_LOAD_MIN_SAMPLES`
    host snapshots. The ranks' own share is each rank's median CPU percent (of one core) over the
    host's logical cores, summed over the ranks on the host the snapshots came from."""
    system = _load_window(list(ctx.telemetry.system), ctx.warmup_end_ns)
    cpu = [s.cpu_percent for s in system if s.cpu_percent is not None]
    if len(cpu) < HOST_LOAD_MIN_SAMPLES:
        return None
    host = float(np.median(cpu))
    hosts = {s.hostname for s in system}
    by_rank: dict[int | None, list[float]] = {}
    for p in _load_window(list(ctx.telemetry.process), ctx.warmup_end_ns):
        if p.cpu_percent is not None and p.cpu_cores and (p.hostname in hosts or None in hosts):
            by_rank.setdefault(p.rank, []).append(p.cpu_percent / p.cpu_cores)
    if not by_rank:
        return HostLoad(host, None)
    own = sum(float(np.median(v)) for v in by_rank.values())
    return HostLoad(host, max(0.0, host - own))


def _host_load_inconclusive(m: MetricComparison, note: str) -> MetricComparison:
    if m.unit not in TIME_UNITS or m.verdict not in ("regression", "improvement"):
        return m
    f = HOST_LOAD_MAX_FACTOR
    if m.ci_low is not None and m.ci_high is not None and (m.ci_low >= f or m.ci_high <= 1 / f):
        # (said as a verdict that stands, beside the rows the same load made "inconclusive", review 13e)
        return dataclasses.replace(m, reason=f"{m.reason}; the {note}, but a change of {_times(m)} is "
                                             f"more than host load explains (up to {f:g}x): the verdict stands")
    return dataclasses.replace(m, verdict="inconclusive", reason=f"inconclusive: {note}; {m.reason}")


def _times(m: MetricComparison) -> str:
    ratio = m.ratio if m.ratio is not None else 1.0
    return f"{sig3(ratio)}x" if ratio >= 1 else f"1/{sig3(1 / ratio)}x"


def sig3(value: float) -> str:
    """``value`` to 3 significant digits, never in exponent form (``1,234``, ``12.3``, ``0.0123``):
    the precision of every amount in a reason line (the viewer writes its medians the same way)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = min(6, max(0, 2 - math.floor(math.log10(abs(value)))))
    return f"{value:,.{decimals}f}"


def _amount(value: float, unit: str) -> str:
    """``value`` in ``unit`` for a reason line (bytes as MiB), to 3 significant digits."""
    if unit == "bytes":
        return f"{sig3(value / th.MIB)} MiB"
    if unit == "percent":
        return f"{sig3(value)}%"
    return f"{sig3(value)} {unit}"


def _only_in(spec: _Metric, a: FloatArray, b: FloatArray, side: str) -> MetricComparison:
    xa, xb = finite(a), finite(b)
    return MetricComparison(
        spec.name, spec.unit, spec.better, int(xa.size), int(xb.size),
        float(np.median(xa)) if xa.size else None, float(np.median(xb)) if xb.size else None,
        None, None, None, None, None, "inconclusive", f"only run {side} timed this phase",
    )
