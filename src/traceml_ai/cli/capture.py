"""``traceml run``, ``traceml watch`` and ``traceml serve`` (DESIGN §7; the capture issue)."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from traceml_ai.cli import common
from traceml_ai.cli.common import UsageError, UserError, one_line_errors, printable, settings
from traceml_ai.launcher.launch import LaunchError, LaunchOptions, LaunchResult, LaunchUsageError, launch

PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}
"""Everything after SCRIPT belongs to the script (like ``python SCRIPT ARGS``)."""

MODES = ("cli", "summary", "quiet")

ScriptArg = Annotated[
    str, typer.Argument(metavar="SCRIPT", help="The training script (a .py file), or -m MODULE as with python -m.")
]
ArgsArg = Annotated[list[str] | None, typer.Argument(metavar="ARGS", help="Arguments for the script.")]
NameOpt = Annotated[str | None, typer.Option("--name", metavar="NAME",
                                             help="Run name (default: the script's file name).")]
GroupOpt = Annotated[str | None, typer.Option("--group", metavar="GROUP", help="Group label shown in the viewer.")]
TagOpt = Annotated[list[str] | None, typer.Option("--tag", metavar="TAG", help="A tag; repeat for several.")]
LogsDirOpt = Annotated[
    str | None,
    typer.Option("--logs-dir", metavar="DIR", help="Where run folders are created (default ./traceml/runs)."),
]
IntervalOpt = Annotated[float | None, typer.Option("--interval", metavar="SECONDS",
                                                   help="Sampling interval in seconds (default 1).")]
ModeOpt = Annotated[
    str | None,
    typer.Option("--mode", metavar="summary|cli|quiet",
                 help="summary (default): the script keeps its terminal, the verdict is printed at "
                      "the end; cli: a live view below the script's output (which then goes through a "
                      "pipe); quiet: nothing from TraceML but warnings (lost telemetry, a failed setup)."),
]


ExporterOpt = Annotated[
    str | None,
    typer.Option("--exporter", metavar="NAME",
                 help="Export telemetry records: jsonl (files in <run>/aggregator/export), otlp, or "
                      "module:factory for your own exporter (see docs/export.md)."),
]
ExportStreamsOpt = Annotated[
    str | None,
    typer.Option("--export-streams", metavar="STREAM,...",
                 help="Exported streams, comma separated: step_time (default), step_memory, "
                      "process, system, all."),
]
ExporterHostnameOpt = Annotated[
    bool | None,
    typer.Option("--exporter-hostname/--no-exporter-hostname", help="Keep the hostname field in exported records."),
]


def escape(text: str) -> str:
    """``rich.markup.escape`` (Rich is imported once something is printed, after the training started)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _mode(mode: str | None) -> str:
    if mode is None:
        # The live view needs the script's output to pass through TraceML (pipes: the script no longer
        # sees a terminal, stderr is shown on stdout); by default the script keeps its terminal.
        return "summary"
    if mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _run_with_view(options: LaunchOptions, mode: str) -> LaunchResult:
    if mode != "cli":
        return launch(options)
    from traceml_ai.cli.live_view import LiveView

    view = LiveView(common.out, options.run_name)
    try:
        return launch(options, on_tick=view.on_tick, on_output=view.on_output)
    finally:
        view.stop()


def _report(result: LaunchResult, mode: str, *, watch: bool = False) -> None:
    if mode == "quiet":
        return
    if result.telemetry:
        common.err.print(f"[yellow]telemetry degraded:[/] {escape(printable(str(result.telemetry.get('reason', ''))))}")
    if result.run_dir is None:
        return
    _print_findings(result.run_dir, watch=watch, exit_code=result.exit_code)
    common.out.print(f"run folder: [bold]{escape(str(result.run_dir))}[/] · status {escape(str(result.status))} · "
              f"exit code {result.exit_code}", soft_wrap=True)


def _print_findings(run_dir: Path, *, watch: bool = False, exit_code: int | None = None) -> None:
    """The verdict of aggregator/final_summary.json, shortly (``traceml summary RUN`` shows all)."""
    from traceml_ai.diagnose.summary import SummaryFileError, read_final_summary, verdict

    try:
        summary = read_final_summary(run_dir)
    except (OSError, SummaryFileError) as e:
        common.err.print(f"[yellow]the final summary cannot be read:[/] {escape(printable(str(e)))}", soft_wrap=True)
        return
    if summary is None:
        warning = run_dir / "aggregator" / "finalization_warning.json"
        where = " (see aggregator/finalization_warning.json)" if warning.exists() else ""
        common.err.print(f"[yellow]no final summary was written[/]{where}")
        return
    kind, text = verdict(summary, watch=watch, exit_code=exit_code)
    if kind != "findings":
        style = {"healthy": "green", "not_judged": "yellow"}.get(kind, "bold red")
        common.out.print(f"[{style}]diagnosis:[/] {escape(printable(text))}", soft_wrap=True)
    for f in summary.findings:
        common.out.print(f"[bold]{escape(printable(f.severity))}[/] {escape(printable(f.kind))}: "
                  f"{escape(printable(f.summary))}")


# Options only TraceML has (a training script is unlikely to take them): seen after SCRIPT, they were
# probably meant for TraceML, but they go to the script, like any argument after it.
TRACEML_ONLY_OPTIONS = ("--exporter", "--export-streams", "--exporter-hostname", "--nproc-per-node", "--nnodes",
                        "--node-rank", "--logs-dir", "--disable-traceml")


def _note_misplaced_options(args: list[str] | None) -> None:
    misplaced = sorted({a.split("=", 1)[0] for a in args or () if a.split("=", 1)[0] in TRACEML_ONLY_OPTIONS})
    if misplaced:
        common.err.print(f"[yellow]note:[/] {', '.join(misplaced)} after the script went to the script; TraceML's own "
                  "options go before it (traceml run [OPTIONS] SCRIPT [ARGS]...)", soft_wrap=True)


def _script_or_module(ctx: typer.Context, script: str, args: list[str] | None) -> tuple[str, str | None, list[str]]:
    """``(script, module, args)`` from what followed the options: ``-m MODULE ARGS`` runs a module
    like ``python -m``; any other word starting with ``-`` is an option TraceML does not have
    (everything after SCRIPT goes to the script, so a mistyped option would otherwise be taken
    for the script's name).

    Raises:
        UsageError: an unknown option (with the closest known one), or ``-m`` without a module.
    """
    rest = list(args or [])
    if script == "-m" or (script.startswith("-m") and not script.startswith("--")):
        module = script[2:] or (rest.pop(0) if rest else "")
        if not module or module.startswith("-"):
            raise UsageError("-m needs a module name: traceml run [OPTIONS] -m package.module [ARGS]...")
        return module, module, rest
    if script.startswith("-") and script != "-":
        name = script.split("=", 1)[0]
        known = sorted({opt for p in ctx.command.params for opt in (*p.opts, *p.secondary_opts)
                        if opt.startswith("-")})
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else f" (see traceml {ctx.info_name} --help)"
        raise UsageError(f"unknown option {name}{hint}")
    return script, None, rest


# TraceML's options that take no value (the others are followed by one).
_FLAG_OPTIONS = ("--disable-traceml", "--exporter-hostname", "--no-exporter-hostname")


# TraceML's options that scripts often have too (`--name`, `--tag`): after the script they are the
# script's, unless its argument parser refused them.
_SHARED_OPTIONS = ("--name", "--group", "--tag", "--interval", "--mode", "--master-addr", "--master-port")
_ARGUMENT_ERRORS = ("unrecognized argument", "unrecognized option", "no such option", "unknown option",
                    "unexpected argument")


def _refused_options(run_dir: Path | None) -> set[str]:
    """TraceML's shared options that the script's stderr named in an argument error (argparse's
    ``unrecognized arguments: --name x``, click's ``No such option: --name``), from the rank logs."""
    refused: set[str] = set()
    if run_dir is None:
        return refused
    for log in sorted((run_dir / "aggregator").glob("rank_*.log")):
        try:
            with open(log, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith("stderr | ") or not any(e in line.lower() for e in _ARGUMENT_ERRORS):
                continue
            for word in re.findall(r"--[A-Za-z][\w-]*", line):
                if word in _SHARED_OPTIONS:
                    refused.add(word)
    return refused


def _without_options(words: list[str], options: set[str]) -> list[str]:
    """``words`` (the command line before the script) without ``options`` and their values: the
    copy moved from after the script replaces them (given twice, the later one is what was meant),
    so the suggested command never names an option twice."""
    out: list[str] = []
    i = 0
    while i < len(words):
        option = words[i].split("=", 1)[0]
        if option in options:
            takes_value = "=" not in words[i] and option not in _FLAG_OPTIONS
            i += 2 if takes_value else 1
            continue
        out.append(words[i])
        i += 1
    return out


def _explain_misplaced_options(args: list[str] | None, code: int, mode_name: str, target: list[str],
                               refused: frozenset[str] | set[str] = frozenset()) -> None:
    """After a failed script that was given TraceML's own options (they came after SCRIPT, so the
    script got them, and an argument parser refuses them): say so, with the command to run instead.
    ``refused``: options TraceML shares with many scripts (``--name``), counted only when the
    script's argument error named them."""
    moved: list[str] = []
    kept: list[str] = []
    items = list(args or [])
    i = 0
    while i < len(items):
        word = items[i]
        option = word.split("=", 1)[0]
        if option in TRACEML_ONLY_OPTIONS or option in _FLAG_OPTIONS or option in refused:
            moved.append(word)
            if "=" not in word and option not in _FLAG_OPTIONS and i + 1 < len(items):
                moved.append(items[i + 1])
                i += 1
        else:
            kept.append(word)
        i += 1
    if not moved:
        return
    names = ", ".join(sorted({w.split("=", 1)[0] for w in moved if w.startswith("--")}))
    argv = sys.argv[1:]
    head = len(argv) - len(items) - len(target)
    before = argv[:head] if head > 0 and argv[head:] == [*target, *items] else [mode_name]
    before = _without_options(before, {w.split("=", 1)[0] for w in moved if w.startswith("--")})
    fixed = shlex.join(["traceml", *before, *moved, *target, *kept])
    common.err.print(f"[yellow]note:[/] the script exited with code {code} after it was given {escape(names)}, which "
              f"{'is' if ',' not in names else 'are'} TraceML's; put TraceML's options before the script: "
              f"{escape(fixed)}", soft_wrap=True)


def _launch_command(
    mode_name: str,
    script: str,
    module: str | None,
    args: list[str] | None,
    name: str | None,
    group: str | None,
    tag: list[str] | None,
    logs_dir: str | None,
    interval: float | None,
    mode: str | None,
    nproc_per_node: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    disable: bool,
    exporter: str | None = None,
    export_streams: str | None = None,
    exporter_hostname: bool | None = None,
) -> None:
    _note_misplaced_options(args)
    view_mode = _mode(mode)
    st = settings(logs_dir=logs_dir, run_name=name, interval=interval, exporter=exporter,
                  export_streams=export_streams, exporter_hostname=exporter_hostname)
    if st.run_name is not None:  # a blank --name was taken as none (issue 14 review): refuse it here
        from traceml_ai.runs.writer import check_run_name

        try:
            check_run_name(st.run_name)
        except ValueError as err:
            raise UsageError(f"--name: {err}") from None
    watching = mode_name == "watch"  # watch has no exporter and ignores the export settings (000 seed)
    options = LaunchOptions(
        script=script, module=module, args=list(args or []), mode="watch" if watching else "run",
        logs_dir=st.logs_dir, name=st.run_name, group=group, tags=list(tag or []), interval=st.interval,
        nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
        master_port=master_port, disable=disable, exporter=None if watching else st.exporter,
        export_streams=st.export_streams, exporter_hostname=st.exporter_hostname,
    )
    try:
        result = _run_with_view(options, view_mode) if not disable else launch(options)
    except LaunchUsageError as exc:
        raise UsageError(str(exc)) from None
    except LaunchError as exc:
        raise UserError(str(exc)) from None
    if result.run_dir is not None and nnodes > 1:
        _write_job_envelope(result.run_dir)
    _report(result, view_mode, watch=watching)
    if result.exit_code != 0 and view_mode != "quiet":
        _explain_misplaced_options(args, result.exit_code, mode_name, ["-m", module] if module else [script],
                                   _refused_options(result.run_dir))
    raise typer.Exit(result.exit_code)


def _write_job_envelope(run_dir: Path) -> None:
    """A job over several nodes gets a stormlog_run.json grouping its session and artifacts (DESIGN §2.2);
    written here because the launcher may not import the catalog (DESIGN §1). Never changes the exit code."""
    from traceml_ai.catalog.job import write_job_envelope

    try:
        write_job_envelope(run_dir)
    except (OSError, ValueError) as exc:
        common.err.print(f"[yellow]no run envelope written:[/] {escape(printable(str(exc)))}")


NprocOpt = Annotated[int, typer.Option("--nproc-per-node", metavar="N",
                                       help="Processes per node (>1 uses torch.distributed.run).")]
NnodesOpt = Annotated[int, typer.Option("--nnodes", metavar="N", help="Number of nodes.")]
NodeRankOpt = Annotated[int, typer.Option("--node-rank", metavar="RANK",
                                          help="This node's rank (the aggregator runs on node 0).")]
MasterAddrOpt = Annotated[str, typer.Option("--master-addr", metavar="HOST", help="Address of node 0.")]
MasterPortOpt = Annotated[
    int, typer.Option("--master-port", metavar="PORT",
                      help="Rendezvous port on node 0; the aggregator listens on the next one.")
]
DisableOpt = Annotated[bool, typer.Option("--disable-traceml", help="Run the script plainly, without TraceML.")]


@one_line_errors
def run(
    ctx: typer.Context,
    script: ScriptArg,
    args: ArgsArg = None,
    name: NameOpt = None,
    group: GroupOpt = None,
    tag: TagOpt = None,
    logs_dir: LogsDirOpt = None,
    interval: IntervalOpt = None,
    mode: ModeOpt = None,
    nproc_per_node: NprocOpt = 1,
    nnodes: NnodesOpt = 1,
    node_rank: NodeRankOpt = 0,
    master_addr: MasterAddrOpt = "127.0.0.1",
    master_port: MasterPortOpt = 29500,
    disable_traceml: DisableOpt = False,
    exporter: ExporterOpt = None,
    export_streams: ExportStreamsOpt = None,
    exporter_hostname: ExporterHostnameOpt = None,
) -> None:
    """Run a training script with full capture: step-time breakdown, memory, CPU/GPU, output, diagnoses.

    Wrap each training step in `with traceml_ai.trace_step(model):` to get the step-time breakdown.
    Exits with the training's exit code.

    Example: traceml run examples/train_digits.py --epochs 3   (or --nproc-per-node 2 for two ranks;
    --exporter jsonl --export-streams all also writes every record to <run>/aggregator/export)
    """
    script, module, args = _script_or_module(ctx, script, args)
    _launch_command("run", script, module, args, name, group, tag, logs_dir, interval, mode, nproc_per_node, nnodes,
                    node_rank, master_addr, master_port, disable_traceml, exporter, export_streams,
                    exporter_hostname)


@one_line_errors
def watch(
    ctx: typer.Context,
    script: ScriptArg,
    args: ArgsArg = None,
    name: NameOpt = None,
    group: GroupOpt = None,
    tag: TagOpt = None,
    logs_dir: LogsDirOpt = None,
    interval: IntervalOpt = None,
    mode: ModeOpt = None,
    nproc_per_node: NprocOpt = 1,
    disable_traceml: DisableOpt = False,
) -> None:
    """Run a script without any code change and watch system, process, environment and output.

    No step timing (use `traceml run` with trace_step for that). Exits with the script's exit code.

    Example: traceml watch train.py --epochs 3
    """
    script, module, args = _script_or_module(ctx, script, args)
    _launch_command("watch", script, module, args, name, group, tag, logs_dir, interval, mode, nproc_per_node, 1, 0,
                    "127.0.0.1", 29500, disable_traceml)


@one_line_errors
def serve(
    name: Annotated[str, typer.Option("--name", help="Run name.")] = "served",
    group: GroupOpt = None,
    tag: TagOpt = None,
    logs_dir: LogsDirOpt = None,
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="Port for the ranks; 0 picks a free one.")] = 0,
    host: Annotated[str, typer.Option("--host", metavar="HOST",
                                      help="Address to bind; only change it for ranks on other hosts.")]
    = "127.0.0.1",
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", metavar="N", help="Ranks expected; a rank that never reports is listed."),
    ] = None,
    exporter: ExporterOpt = None,
    export_streams: ExportStreamsOpt = None,
    exporter_hostname: ExporterHostnameOpt = None,
) -> None:
    """Run only the aggregator, for training scripts you start yourself that call traceml_ai.init().

    Prints the environment to give those scripts; Ctrl+C ends the run and writes its final summary.

    Example: traceml serve --port 7731   then   TRACEML_AGGREGATOR=127.0.0.1:7731 ... python train.py
    """
    from traceml_ai.launcher.serve import ServedRun

    st = settings(logs_dir=logs_dir, run_name=name, exporter=exporter, export_streams=export_streams,
                  exporter_hostname=exporter_hostname)
    if port < 0 or port > 65535:
        raise UsageError("--port must be between 0 and 65535")
    try:
        served = ServedRun.start(st.logs_dir, st.run_name or name, group=group, tags=list(tag or []), host=host,
                                 port=port, world_size=world_size, exporter=st.exporter,
                                 export_streams=st.export_streams, exporter_hostname=st.exporter_hostname)
    except LaunchUsageError as exc:
        raise UsageError(str(exc)) from None
    except LaunchError as exc:
        raise UserError(str(exc)) from None
    common.out.print(f"TraceML aggregator listening on [bold]{served.address}[/] · run folder "
                     f"{escape(str(served.run_dir))}", soft_wrap=True)
    common.out.print("Start your training with this environment (it calls traceml_ai.init()):")
    for key, value in served.environment().items():
        common.out.print(f"  export {key}={escape(value)}", soft_wrap=True)  # copy-pasteable: never wrapped
    common.out.print("Ctrl+C to end the run.", style="dim")
    common.out.file.flush()  # a script or pipe reading these lines must get them now, not at exit
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    result = served.finish()
    _report(result, "summary")

