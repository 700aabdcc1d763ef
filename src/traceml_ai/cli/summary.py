"""``traceml summary RUN`` and ``traceml compare RUN_A RUN_B``: a run's diagnoses and a verdict per
metric between two runs, in the terminal or as JSON (DESIGN §3.5, §7; docs/diagnoses.md).

Both only read: a run without ``final_summary.json`` (live, or its aggregator died) is diagnosed
from its ``telemetry.sqlite`` in memory; nothing is written into the run folder.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceml_ai.cli.common import UserError, err, fmt_bytes, fmt_value, one_line_errors, out, printable
from traceml_ai.cli.runs import check_path_ref, find_run, open_store
from traceml_ai.diagnose import (
    StepTimeSummary,
    Summary,
    SummaryFileError,
    diagnose,
    final_summary_path,
    load_final_summary,
    telemetry_path,
)
from traceml_ai.diagnose import compare as compare_runs
from traceml_ai.diagnose.summary import verdict

SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}
VERDICT_STYLE = {"regression": "bold red", "improvement": "bold green", "equivalent": "", "inconclusive": "dim"}

RunArg = Annotated[str, typer.Argument(
    metavar="RUN", help="Run folder path, or a run id, unique id prefix or name (the newest of that name).")]
RootsOpt = Annotated[list[str] | None, typer.Option("--root", "-r", help="Runs folder to look in (repeatable).")]


def resolve_run(ref: str, roots: list[str] | None) -> Path:
    """The run folder ``ref`` names: a folder path (a run folder or its ``aggregator/`` folder), else
    a run id, id prefix or name looked up under ``roots``.

    Raises:
        UserError: no such run, or the run has no TraceML telemetry.
    """
    path = Path(ref)
    if path.is_dir():
        if path.name == "aggregator" and not (path / "aggregator").is_dir():
            path = path.parent
    else:
        check_path_ref(ref, roots)
        path = Path(find_run(open_store(roots), ref).path)
    if not telemetry_path(path).exists() and not final_summary_path(path).exists():
        raise UserError(
            f"{printable(str(path))} has no TraceML telemetry (no aggregator/telemetry.sqlite); "
            "capture a run with 'traceml run SCRIPT'"
        )
    return path


def _summary_doc(run_dir: Path) -> tuple[dict[str, Any], str, str | None]:
    """The run's summary document, where it came from, and the damage its telemetry database shows
    now (None when none): final_summary.json as written, else the diagnosis of telemetry.sqlite made
    now (a warning first when the file cannot be used)."""
    unusable = False
    try:
        doc = load_final_summary(run_dir)
    except SummaryFileError as e:
        err.print(f"[yellow]warning:[/] aggregator/{escape(printable(e.one_line()))}; "
                  "diagnosing telemetry.sqlite instead")
        doc, unusable = None, True
    if doc is not None:
        from traceml_ai.diagnose.perf import telemetry_damage

        damage = telemetry_damage(run_dir, summarised=True)
        if damage is not None:
            err.print(f"[yellow]warning:[/] aggregator/telemetry.sqlite: {escape(printable(damage))}; the summary "
                      "below was written from it before (its charts cannot be drawn)")
        return doc, "aggregator/final_summary.json", damage
    summary = diagnose(telemetry_path(run_dir), source="aggregator/telemetry.sqlite")
    why = "final_summary.json cannot be read" if unusable else "no final_summary.json yet"
    return summary.to_dict(), f"computed now from aggregator/telemetry.sqlite ({why})", None


@one_line_errors
def summary(
    run: RunArg,
    roots: RootsOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the summary document (final_summary.json) with the verdict the text shows in "
                       "'verdict' {kind, text}.")] = False,
) -> None:
    """Show a captured run's diagnoses: findings with actions, step-time breakdown, ranks, memory, system.

    Reads aggregator/final_summary.json, or diagnoses aggregator/telemetry.sqlite when the run has no
    summary yet (still running); never writes into the run folder.

    Example: traceml summary traceml/runs/20261130-101500_baseline_a3f9
    """
    run_dir = resolve_run(run, roots)
    doc, origin, damage = _summary_doc(run_dir)
    if as_json:  # the document as written (the damage is the warning on stderr), and its verdict
        kind, text = verdict(Summary.from_dict(doc), **_launch_facts(run_dir))
        shown = {**doc, "verdict": {"kind": kind, "text": text}}
        lost = _losses(run_dir)
        if lost is not None:  # what the capture lost, as finalization_warning.json says it (not in the summary)
            shown["lost"] = lost
        sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    _print_summary(run_dir, Summary.from_dict(doc), origin, damage)


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def _share(v: float | None) -> str:
    return "" if v is None else f"{v * 100:.1f}%"


def _bytes(v: Any) -> str:
    return fmt_bytes(v) if isinstance(v, (int, float)) else ""


def _pct_value(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}%"


def _text(v: Any) -> str:
    return printable(str(v)) if v is not None else ""


def _rank(r: int | None) -> str:
    return "?" if r is None else str(r)


def rank_list(ranks: Sequence[int | None]) -> str:
    """``rank 0``, ``ranks 0–3``, ``ranks 0, 2–3``: consecutive ranks written ``a–b``, unknown ``?``."""
    known = sorted(r for r in ranks if r is not None)
    parts: list[str] = []
    for r in known:
        if parts and r == int(parts[-1].rsplit("–", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('–')[0]}–{r}"
        else:
            parts.append(str(r))
    parts += ["?"] * (len(ranks) - len(known))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def ranks_text(ranks: Sequence[int | None], world_size: int | None) -> str:
    """The ranks that reported, in words: ``1 rank (rank 0)`` for a one-process run,
    ``ranks 0–3 of 4``, ``ranks 0, 2–3 of 4``, ``rank 1 of 4``, ``none``."""
    if not ranks:
        return "none" if world_size is None else f"none of {world_size}"
    text = rank_list(ranks)
    if world_size is None or world_size == len(ranks) == 1:
        return f"1 rank ({text})" if len(ranks) == 1 else text
    return f"{text} of {world_size}"


def _steps_left_out(summary: Summary) -> str:
    """The steps that have no row by design (``steps.discarded``, ``steps.dropped_updates``), in words;
    empty when there are none or the summary does not say."""
    counts = summary.step_counts
    if counts is None:
        return ""
    parts = []
    if counts.discarded > 0:
        parts.append(f"{counts.discarded} step(s) raised and were discarded")
    if counts.dropped_updates > 0:
        held = f" of {counts.dropped_micro_batches} micro-batch(es)"
        parts.append(f"{counts.dropped_updates} incomplete update(s){held} at the end dropped "
                     "(no optimizer step followed)")
    if counts.failed > 0:
        parts.append(f"the timing of {counts.failed} step(s) failed and they were left out (a TraceML fault)")
    return "; ".join(parts)


def _print_summary(run_dir: Path, summary: Summary, origin: str, damage: str | None = None) -> None:
    """The whole terminal summary: the header panel, the verdict and findings, the step-time and rank
    tables, memory and system, and the rules that could not judge. ``damage``: what the telemetry
    database shows now, when the summary was written before it was damaged."""
    _print_header(run_dir, summary, origin, damage)
    _print_verdict(summary, **_launch_facts(run_dir))
    _print_findings(summary)
    if summary.step_time is not None:
        _print_step_time(summary.step_time)
    _print_resources(summary)
    _print_abstained(summary)


def _print_header(run_dir: Path, summary: Summary, origin: str, damage: str | None = None) -> None:
    info = Table.grid(padding=(0, 2))
    info.add_column(style="dim")
    info.add_column()
    status = summary.telemetry_status
    info.add_row("source", Text(origin))
    detail = f": {_text(summary.telemetry_detail)}" if summary.telemetry_detail else ""
    if damage is not None:  # the summary's status is of the rows it was written from; say what is true now
        info.add_row("telemetry", Text(f"partial: {_text(damage)} (it was {_text(status)} when the summary was "
                                       "written)", style="bold red"))
    else:
        lost = _losses(run_dir)
        if lost is not None and status == "ok":  # the capture lost something the summary does not count
            info.add_row("telemetry", Text("partial: the capture lost data (aggregator/finalization_warning.json)",
                                           style="bold red"))
        else:
            style = "" if status == "ok" else "yellow" if status == "degraded" else "bold red"
            info.add_row("telemetry", Text(_text(status) + detail, style=style))
        for line in lost or ():
            info.add_row("lost", Text(_text(line), style="yellow"))
    span = f" (steps {summary.first_step}..{summary.last_step})" if summary.first_step is not None else ""
    info.add_row("steps", Text(f"{fmt_value(summary.steps_seen)} seen{span}, "
                               f"{fmt_value(summary.steps_analysed)} rank-steps analysed, first "
                               f"{fmt_value(summary.warmup_steps)} per rank skipped as warm-up"))
    if summary.sampled_every > 1:  # by design, not a loss: said, not counted among the problems
        info.add_row("", Text(f"sampled: one step in {summary.sampled_every} read (a long run; warm-up steps "
                              "always, memory peaks from every step)", style="dim"))
    left_out = _steps_left_out(summary)
    if left_out:
        info.add_row("", Text(left_out, style="yellow"))
    missing = summary.missing_ranks
    rank_text = ranks_text(summary.ranks, summary.world_size)
    if missing:
        rank_text += f" (missing: {', '.join(str(r) for r in missing)})"
    info.add_row("ranks", Text(rank_text, style="bold red" if missing else ""))
    for problem in summary.problems:
        info.add_row("problem", Text(_text(problem), style="yellow"))
    out.print(Panel.fit(info, title=Text(printable(run_dir.name), style="bold"), title_align="left"))


def _losses(run_dir: Path) -> list[str] | None:
    """What ``aggregator/finalization_warning.json`` says the capture lost (its summary lines, read
    by its reader), one line saying it cannot be read, or None without that file (nothing lost)."""
    from traceml_ai.runs.aggregator_files import AGGREGATOR_DIR, FINALIZATION_WARNING, read_finalization_warning

    agg = run_dir / AGGREGATOR_DIR
    if not (agg / FINALIZATION_WARNING).exists():
        return None
    problems: list[str] = []
    found = read_finalization_warning(str(agg), problems)
    if found is None:
        return [f"{problems[0] if problems else FINALIZATION_WARNING}; what the capture lost is unknown"]
    return list(found.summary) or [f"{FINALIZATION_WARNING} lists no loss"]


def _launch_facts(run_dir: Path) -> dict[str, Any]:
    """What ``aggregator/manifest.json`` (read by its reader) says the verdict needs: ``watch``
    (``traceml watch`` made the run) and ``exit_code`` (the training's, when it has ended). An
    unreadable manifest says neither."""
    from traceml_ai.runs.aggregator_files import AGGREGATOR_DIR, MANIFEST, read_manifest

    agg = run_dir / AGGREGATOR_DIR
    manifest = read_manifest(str(agg), []) if (agg / MANIFEST).is_file() else None
    if manifest is None:
        return {"watch": False, "exit_code": None}
    code = manifest.exit_code
    return {"watch": manifest.mode == "watch",
            "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else None}


def _print_verdict(summary: Summary, *, watch: bool = False, exit_code: int | None = None) -> None:
    kind, text = verdict(summary, watch=watch, exit_code=exit_code)
    if summary.telemetry_status == "degraded":
        # Readable but cut short: the findings stand for the part that was recorded, and say so.
        out.print(Text("! partial telemetry: the verdict covers only what was recorded before the aggregator "
                       "stopped", style="bold yellow"))
        if kind != "findings":
            out.print(Text(f"  {text} in that part" if kind == "healthy" else f"  {text}", style="yellow"))
    elif kind == "no_verdict":
        out.print(Text("✗ no verdict: the telemetry could not be read (see above)", style="bold red"))
    elif kind == "not_judged":
        out.print(Text(f"? {text}", style="bold yellow"))
    elif kind == "healthy":
        out.print(Text("✓ no bottleneck found", style="bold green"))


def _print_hanging(prefix: Text, body: Text, indent: int | None = None) -> None:
    """``prefix`` then ``body`` wrapped to the console's width, its later lines indented by
    ``indent`` columns (default: the prefix's width), so a wrapped finding keeps its column."""
    indent = prefix.cell_len if indent is None else indent
    lines = body.wrap(out, max(20, out.width - max(indent, prefix.cell_len)))
    for i, line in enumerate(lines):
        line.rstrip()
        out.print(Text.assemble(prefix if i == 0 else " " * indent, line), no_wrap=True, crop=False)


def _print_findings(summary: Summary) -> None:
    for f in summary.findings:
        line = Text()
        line.append(_text(f.kind), style="bold")
        line.append("  " + _text(f.summary))
        _print_hanging(Text(f"{f.severity.upper():8} ", style=SEVERITY_STYLE.get(f.severity, "")), line)
        _print_hanging(Text("         → ", style="dim"), Text(_text(f.action), style="dim"))
        ev = f.evidence
        bits = [f"{_text(ev.metric)} = {fmt_value(ev.value)} (threshold {fmt_value(ev.threshold)})"]
        if ev.ranks:
            bits.append(rank_list(ev.ranks))
        if ev.steps:
            bits.append(f"steps {ev.steps[0]}..{ev.steps[-1]}")
        _print_hanging(Text(" " * 11), Text(" · ".join(bits), style="dim"))


def _print_step_time(st: StepTimeSummary) -> None:
    table = Table(title="step time", title_justify="left", box=None, header_style="bold")
    for c in ("phase", "median ms", "p90 ms", "share"):
        table.add_column(c, justify="left" if c == "phase" else "right")
    # The step's wall time (the slowest rank per step), as perf.step_ms.p50 and traceml compare.
    table.add_row(Text("step (slowest rank)", style="bold"), _ms(st.iteration_median_ms), _ms(st.iteration_p90_ms),
                  "100%")
    for p in st.phases:
        table.add_row(_text(p.name), _ms(p.median_ms), _ms(p.p90_ms), _share(p.share))
    out.print(table)
    if st.throughput_steps_per_s is not None:
        out.print(Text(f"throughput {st.throughput_steps_per_s:.3g} steps/s (slowest rank per step)", style="dim"))
    micro = st.micro_batches_per_step
    if micro is not None and micro > 1:
        out.print(Text(f"{micro} micro-batches per step (gradient accumulation: one step per optimizer update)",
                       style="dim"))
    if len(st.per_rank) > 1:
        _print_ranks(st)


def _print_ranks(st: StepTimeSummary) -> None:
    table = Table(title="ranks", title_justify="left", box=None, header_style="bold")
    for c in ("rank", "steps", "median ms", "p90 ms", "outside backward ms"):
        table.add_column(c, justify="right")
    for r in st.per_rank:
        worst = r.rank == st.worst_rank
        table.add_row(Text(_text(r.rank) + (" (slowest)" if worst else ""), style="bold" if worst else ""),
                      fmt_value(r.steps), _ms(r.median_ms), _ms(r.p90_ms), _ms(r.outside_backward_median_ms))
    out.print(table)
    if st.skew is not None:
        what = "work outside backward" if st.skew_measure == "outside_backward" else "median step"
        out.print(Text(f"skew: slowest rank {_text(st.worst_rank)}'s {what} +{st.skew * 100:.1f}% of the other ranks' "
                       "median step over theirs (the straggler measure)", style="dim"))


def _print_resources(summary: Summary) -> None:
    mem, system = summary.memory, summary.system
    lines = []
    if mem.peak_alloc_bytes is not None or mem.peak_reserved_bytes is not None:
        lines.append(f"GPU peak allocated {_bytes(mem.peak_alloc_bytes)}, reserved "
                     f"{_bytes(mem.peak_reserved_bytes)} of {_bytes(mem.device_total_bytes) or '?'}")
    if mem.rss_peak_bytes:
        lines.append("peak RSS " + ", ".join(f"rank {k}: {_bytes(v)}" for k, v in mem.rss_peak_bytes.items())
                     + (f" (host RAM {_bytes(mem.ram_total_bytes)})" if mem.ram_total_bytes else ""))
    if system.cpu_percent_median is not None:
        lines.append(f"host CPU {system.cpu_percent_median:.0f}% median, {_pct_value(system.cpu_percent_p90)} p90")
    if system.ram_used_fraction_max is not None:
        lines.append(f"host RAM used {_share(system.ram_used_fraction_median)} median, "
                     f"{_share(system.ram_used_fraction_max)} max")
    if system.gpu_util_median is not None:
        lines.append(f"{system.gpu_count} GPU(s) {system.gpu_util_median:.0f}% busy median")
    if lines:
        out.print(Text("memory & system", style="bold"))
        for item in lines:
            out.print(Text("  " + item))


def _print_abstained(summary: Summary) -> None:
    if summary.abstained:
        out.print(Text("not judged", style="bold dim"))
        for a in summary.abstained:
            _print_hanging(Text("  "), Text(f"{_text(a.rule)}: {_text(a.reason)}", style="dim"), indent=4)


def _check_pct(value: float | None) -> float | None:
    if value is not None and not value >= 0:
        raise typer.BadParameter(f"{value} is not a percentage ≥ 0; try 5")
    return value


@one_line_errors
def compare(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="The baseline run (folder path, id, prefix or name).")],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="The run to judge against it.")],
    roots: RootsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts as one JSON document.")] = False,
    fail_on_regression: Annotated[
        float | None,
        typer.Option("--fail-on-regression", metavar="PCT", callback=_check_pct,
                     help="Exit 1 when any metric regresses (significantly) by more than PCT percent."),
    ] = None,
) -> None:
    """Compare run B against run A: regression / improvement / equivalent / inconclusive per metric
    (step time, each phase, throughput, peak GPU memory, RSS, GPU utilisation).

    Each verdict comes from the ratio of medians of the per-step samples with a 95% block-bootstrap
    interval (docs/diagnoses.md). Exit code 1 with --fail-on-regression when a regression exceeds PCT,
    and when a run's telemetry database is missing, empty or damaged (nothing to compare); a database
    damaged since its summary was written but still readable is compared on its rows, with a warning.

    Example: traceml compare traceml/runs/baseline_a3f9 traceml/runs/new-loader_b7c1 --fail-on-regression 5
    """
    dir_a, dir_b = resolve_run(run_a, roots), resolve_run(run_b, roots)
    result = compare_runs(dir_a, dir_b)
    if result.unusable:  # every verdict would be "inconclusive" for a reason the table would hide
        folders = {"A": dir_a.name, "B": dir_b.name}
        why = "; ".join(f"run {u[0]} ({folders.get(u[0], '?')}): aggregator/telemetry.sqlite: "
                        f"{u.partition(': ')[2]}" for u in result.unusable)
        raise UserError(f"nothing to compare: {printable(why)}")
    if as_json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_comparison(dir_a, dir_b, result.to_dict())
    for problem in result.problems:
        err.print(f"[yellow]warning:[/] {escape(printable(problem))}")
    if fail_on_regression is not None:
        bad = result.regressions(fail_on_regression)
        if bad:
            names = ", ".join(f"{m.metric} {m.worse_pct:.1f}% worse" for m in bad)
            err.print(f"[bold red]regression:[/] {escape(names)} (more than {fail_on_regression:g}%)")
            raise typer.Exit(1)


def _fmt_metric(v: Any, unit: str) -> str:
    if not isinstance(v, (int, float)):
        return ""
    if unit == "bytes":
        return _bytes(v)
    if unit == "percent":
        return f"{v:.1f}%"
    return f"{v:.4g}"


def _print_comparison(dir_a: Path, dir_b: Path, doc: dict[str, Any]) -> None:
    out.print(Text.assemble(("A ", "dim"), (printable(dir_a.name), "bold"), ("  vs  B ", "dim"),
                            (printable(dir_b.name), "bold")))
    table = Table(box=None, header_style="bold")
    for c in ("metric", "A median", "B median", "change", "95% interval B/A", "verdict", "why"):
        table.add_column(c, justify="right" if c in ("A median", "B median", "change") else "left",
                         overflow="fold")
    for m in doc["metrics"]:
        unit = str(m.get("unit"))
        change = m.get("change_pct")
        ci = (f"[{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
              if m.get("ci_low") is not None and m.get("ci_high") is not None else "")
        verdict = str(m.get("verdict"))
        table.add_row(
            _text(m.get("metric")),
            _fmt_metric(m.get("median_a"), unit),
            _fmt_metric(m.get("median_b"), unit),
            f"{change:+.1f}%" if isinstance(change, (int, float)) else "",
            ci,
            Text(verdict, style=VERDICT_STYLE.get(verdict, "")),
            Text(_text(m.get("reason")), style="dim"),
        )
    out.print(table)
