"""``traceml plot``: save a line chart of runs' metric histories as a 300-DPI PNG or as CSV data, the
same files the viewer's export writes (DESIGN §4, §7; 003 seed, "Exporting chart data"); with
``--telemetry PANEL``, one panel of a captured run's Performance view (issue 13 item 4,
:mod:`traceml_ai.ui.perf_export`).
"""

from __future__ import annotations

import os
from typing import Annotated, Final, cast

import typer
from rich.markup import escape

from traceml_ai.cli.common import CACHE_DIR_HELP, UsageError, UserError, err, one_line_errors, out, printable, settings
from traceml_ai.cli.runs import check_path_ref, find_run, open_store
from traceml_ai.runs.analysis import MAX_LINE_RUNS, LineSpec, XAxis
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import RunSummary
from traceml_ai.ui.cache import CacheFolder, default_cache_dir, migrate_cache_dir

X_AXES = ("step", "epoch", "time")
FORMATS = ("png", "csv")
PANELS = ("step", "ranks", "memory", "gpu")


def _choice(option: str, value: str | None, choices: tuple[str, ...]) -> None:
    """A one-line usage error (exit 2) naming the choices when ``value`` is not one of them."""
    if value is not None and value not in choices:
        raise UsageError(f"{option} {value!r} is not one of: {', '.join(choices)}")


def _check_ema(value: float) -> float:
    if not 0.0 <= value < 1.0:
        raise typer.BadParameter(f"{value} is not in [0, 1); try 0.6")
    return value


METRIC_ONLY: Final = ("--x", "--ema", "--log-y")
"""Options of the metric line charts that a ``--telemetry`` panel refuses (it draws the page's picture:
stacked phases of rolling medians over steps, a ranks x steps heatmap, memory and host lines on their
own axes, none of which a log scale, another x axis or an EMA would leave true)."""


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` (its parameter name) was given on the command line (or by an
    environment variable), not left at its default."""
    source = ctx.get_parameter_source(name)  # Typer's own click: compare the enum by name
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


@one_line_errors
def plot(
    ctx: typer.Context,
    run_refs: Annotated[
        list[str], typer.Argument(
            metavar="RUN", help="Run ids, unique id prefixes, names (the newest of a name), or run folder paths.")
    ],
    metric: Annotated[
        list[str] | None,
        typer.Option("--metric", "-m", metavar="M", help="Metric to plot, e.g. val/auc (repeatable)."),
    ] = None,
    telemetry: Annotated[
        str | None,
        typer.Option(
            "--telemetry", metavar="PANEL",
            help="Instead of metrics, a panel of one captured run's Performance view: step (time by phase), "
                 "ranks (step time per rank), memory, or gpu (host and GPU).",
        ),
    ] = None,
    share: Annotated[
        bool, typer.Option("--share", help="With --telemetry step only: phases as shares of the step, not ms.")
    ] = False,
    x: Annotated[str, typer.Option("--x", metavar="AXIS",
                                   help="X axis of a --metric chart: step, epoch, or time (seconds since the "
                                        "run's start).")] = "step",
    ema: Annotated[
        float,
        typer.Option("--ema", metavar="W", callback=_check_ema,
                     help="EMA smoothing weight of a --metric chart, in [0, 1); 0 = none."),
    ] = 0.0,
    log_y: Annotated[bool, typer.Option("--log-y", help="Logarithmic y axis of a --metric chart.")] = False,
    fmt: Annotated[
        str, typer.Option("--format", metavar="FORMAT",
                          help="png (300 DPI) or csv (the full history, not downsampled).")
    ] = "png",
    roots: Annotated[
        list[str] | None, typer.Option("--root", "-r", help="Runs folder to look in (repeatable).")
    ] = None,
    cache_dir: Annotated[
        str | None, typer.Option("--cache-dir", help=CACHE_DIR_HELP.replace("Cache folder", "Where to save"))
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", metavar="PATH",
                                 help="Write the file here instead (a file name, or a folder to put it in).")
    ] = None,
) -> None:
    """Save a chart of metric histories into the cache folder (or --output) and print its path.

    --x, --ema and --log-y shape a --metric chart only. A --telemetry panel is the picture the
    Performance view draws (step: the phases stacked over steps as rolling medians, --share for
    shares; ranks: a ranks x steps heatmap; memory and gpu: lines over steps and wall time), so it
    refuses them (exit 2) rather than ignore them.

    Example: traceml plot baseline high-lr --metric val/auc --ema 0.6 --root traceml/runs

    Example: traceml plot lagging --telemetry ranks --root traceml/runs -o ranks.png
    """
    # Usage first (exit 2, one line), before any run is looked up.
    _choice("--telemetry", telemetry, PANELS)
    _choice("--x", x, X_AXES)
    _choice("--format", fmt, FORMATS)
    if telemetry is not None and metric:
        raise UsageError("give either --metric or --telemetry, not both")
    if telemetry is not None:
        given = [opt for opt in METRIC_ONLY if _given(ctx, opt.lstrip("-").replace("-", "_"))]
        if given:
            raise UsageError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} a --metric chart only; "
                             f"--telemetry {telemetry} draws the Performance view's panel as the page does "
                             "(see traceml plot --help)")
    if output is not None:
        _check_output(output, fmt)
    if share and telemetry != "step":
        raise UsageError("--share applies to --telemetry step only (the phases as shares of the step)")
    if telemetry is not None and len(set(run_refs)) != 1:
        raise UsageError(f"--telemetry draws one run; {len(set(run_refs))} given")
    for ref in run_refs:
        check_path_ref(ref, roots)
    if roots is None:
        folders = [r for r in run_refs if os.path.isdir(r)]
        if folders and len(folders) == len(run_refs):
            # Run folder paths: their roots are the parents.
            roots = list(dict.fromkeys(os.path.dirname(os.path.realpath(r)) for r in folders))
    store = open_store(roots)
    runs: list[RunSummary] = []
    for ref in run_refs:
        run = find_run(store, ref)
        if run.key not in {r.key for r in runs}:
            runs.append(run)
    if telemetry is not None:
        _plot_telemetry(store.roots, runs[0], telemetry, fmt, share, cache_dir, output)
        return
    if len(runs) > MAX_LINE_RUNS:
        raise UsageError(f"{len(runs)} runs given; a chart shows at most {MAX_LINE_RUNS}")
    metrics = list(dict.fromkeys(m for m in metric or [] if m))
    if not metrics:
        raise UsageError("give a metric with --metric, e.g. --metric val/auc")
    histories: list[tuple[RunSummary, MetricsTail]] = [(run, store.history(run.key)) for run in runs]
    for m in metrics:
        if not any(len(tail.series(m)) for _, tail in histories):
            logged = sorted({name for _, tail in histories for name in tail.metric_names()})
            shown = ", ".join(logged[:20]) + (" …" if len(logged) > 20 else "")
            raise UserError(f"no given run logged metric {m!r}; logged: {shown or '(none)'}")
    folder = _cache_folder(store.roots, cache_dir)
    st = settings(cache_dir=cache_dir)
    axis = cast(XAxis, x)  # checked against X_AXES above
    spec = LineSpec(keys=tuple(r.key for r in runs), metrics=tuple(metrics), x=axis, ema=ema, log_y=log_y)
    notes: list[str] = []
    path = folder.export_chart(spec, runs, histories, fmt="csv" if fmt == "csv" else "png",
                               max_points=st.max_points_per_series, notes=notes)
    for line in notes:
        err.print(f"[yellow]note:[/] {escape(printable(line))}")
    out.print(_deliver(path, output), markup=False, highlight=False, soft_wrap=True)


def _check_output(output: str, fmt: str) -> None:
    """Refuse an ``--output`` that cannot take the file, before anything is drawn.

    Raises:
        UsageError: a file name ending in another format's suffix.
        UserError: its folder does not exist.
    """
    if os.path.isdir(output):
        return
    suffix = os.path.splitext(output)[1].lower()
    if suffix in (".png", ".csv") and suffix != f".{fmt}":
        raise UsageError(f"--output {printable(output)} ends in {suffix} but --format {fmt} writes .{fmt}")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise UserError(f"cannot write {printable(output)}: the folder {printable(parent)} does not exist")


def _deliver(path: str, output: str | None) -> str:
    """The file written (``path``, in the cache folder), moved to ``output`` when given (into it
    when it is a folder, keeping the file's name); the path to print."""
    if output is None:
        return path
    import shutil

    dest = os.path.join(output, os.path.basename(path)) if os.path.isdir(output) else output
    shutil.move(path, dest)
    return os.path.abspath(dest)


def _cache_folder(roots: list[str], cache_dir: str | None) -> CacheFolder:
    st = settings(cache_dir=cache_dir)
    cache = default_cache_dir(roots, st.cache_dir)
    if st.cache_dir is None:
        migrate_cache_dir(roots, cache)
    return CacheFolder(cache, roots=roots)


def _plot_telemetry(roots: list[str], run: RunSummary, panel: str, fmt: str, share: bool,
                    cache_dir: str | None, output: str | None = None) -> None:
    from traceml_ai.ui.perf_export import PanelError, export_panel

    folder = _cache_folder(roots, cache_dir)
    warnings: list[str] = []
    try:
        path = export_panel(folder, run, panel, fmt, share=share, warnings=warnings)
    except PanelError as error:
        raise UserError(printable(str(error))) from None
    for line in warnings:
        err.print(f"[yellow]warning:[/] {escape(printable(line))}")
    out.print(_deliver(path, output), markup=False, highlight=False, soft_wrap=True)
