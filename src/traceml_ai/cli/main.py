"""The ``traceml`` command (DESIGN §7). Thin: parse, call, print.

Fast to start: a command's module (and what it needs: the run store, the launcher, the viewer's
web stack, numpy, ...) is imported only when that command runs. ``traceml --help`` lists the
commands from :data:`COMMANDS` without importing any of them, and help is plain text (Typer's
Rich help panels cost more to import than the rest of the command line together).
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from traceml_ai import __version__
from traceml_ai.cli.plainparams import skip_plain_conversions


@dataclass(frozen=True)
class LazyCommand:
    """A subcommand imported on first use: ``module:attr`` is a Typer app (a command group) or a
    command function; ``summary`` is its line in ``traceml --help``."""

    module: str
    attr: str
    summary: str
    context_settings: dict[str, Any] = field(default_factory=dict)


_PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}
"""Everything after SCRIPT belongs to the script (like ``python SCRIPT ARGS``); kept equal to
``traceml_ai.cli.capture.PASS_THROUGH``, which a test checks."""

COMMANDS: dict[str, LazyCommand] = {
    "run": LazyCommand("traceml_ai.cli.capture", "run",
                       "Run a training script with full capture and print its diagnosis.", _PASS_THROUGH),
    "watch": LazyCommand("traceml_ai.cli.capture", "watch",
                         "Run a script unchanged; watch system, process and output.", _PASS_THROUGH),
    "serve": LazyCommand("traceml_ai.cli.capture", "serve",
                         "Run only the aggregator, for ranks that call traceml_ai.init()."),
    "summary": LazyCommand("traceml_ai.cli.summary", "summary",
                           "Show a captured run's diagnoses and step-time breakdown."),
    "compare": LazyCommand("traceml_ai.cli.summary", "compare",
                           "Compare run B against run A, metric by metric."),
    "runs": LazyCommand("traceml_ai.cli.runs", "app", "List and inspect run folders."),
    "ui": LazyCommand("traceml_ai.cli.ui", "ui", "Open the run viewer in your browser."),
    "plot": LazyCommand("traceml_ai.cli.plot", "plot", "Save a chart of metric histories (PNG or CSV)."),
    "query": LazyCommand("traceml_ai.cli.query", "app",
                         "Query the run catalog: runs, sessions, attachments, events, issues, correlation."),
    "demo": LazyCommand("traceml_ai.cli.demo", "demo", "Train two small models, capture one, open the viewer."),
    "fake-runs": LazyCommand("traceml_ai.cli.fake_runs", "fake_runs",
                             "Write fake runs in the TraceML format, to try the viewer."),
    "bench": LazyCommand("traceml_ai.cli.bench", "bench", "Measure the run store on this machine."),
}


def load_command(name: str) -> Any:
    """The Click command of ``traceml NAME``, built from its module (imported now).

    Raises:
        KeyError: no such command.
    """
    spec = COMMANDS[name]
    target = getattr(importlib.import_module(spec.module), spec.attr)
    if isinstance(target, typer.Typer):
        _plain_help(target)
        command = typer.main.get_command(target)
    else:
        single = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
        single.command(name, context_settings=spec.context_settings or None)(target)
        command = typer.main.get_command(single)
    command.name = name
    command.short_help = spec.summary
    _whole_words(command)
    _whole_short_help(command)
    _plain_metavars(command)
    skip_plain_conversions(command)
    return command


_METAVAR_BY_NAME = {"roots": "DIR", "cache_dir": "DIR", "cache": "DIR", "workdir": "DIR", "workspace": "DIR",
                    "logs_dir": "DIR", "port": "PORT", "host": "HOST", "rank": "RANK", "limit": "N"}
"""Metavars of options that several commands share, when the option names none itself."""
_METAVAR_BY_TYPE: dict[Any, str] = {str: "TEXT", int: "N", float: "NUMBER", bool: "BOOL"}


def _argument_usage(param: Any) -> str:
    """An argument as the usage line and the Arguments list write it: ``RUN``, ``PATH...``,
    ``[ROOT]...``, ``[ARGS]...`` (optional in brackets, several with ``...``)."""
    name = str(param.metavar)
    if not param.required:
        name = f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


def _plain_metavars(command: Any) -> None:
    """Say what each option takes in words (``--root DIR``, ``--port PORT``, ``--limit N``), not as
    the Python type Typer shows by default (``<str>``, ``<list[str]>``): an option's own metavar, else
    one for its name (:data:`_METAVAR_BY_NAME`, ``..._id`` ID, ``..._ns`` NS, ``..._seconds``
    SECONDS), else for its type
    (TEXT, N, NUMBER, PATH). An argument shows its name alone (``SCRIPT``, ``RUN``), without a type."""
    for param in getattr(command, "params", []):
        if param.param_type_name == "argument":
            param.metavar = (param.metavar or param.name or "").upper().strip("[]{}.")
            param.display_type_rich = lambda ctx: None  # the name says it: SCRIPT, RUN, [ROOT]...
            # Click's own usage words (RUN, PATH..., [ROOT]...), not Typer's {RUN} or a metavar
            # wrapped twice ([[ROOT]...]..., {PATH...}...).
            param._usage_display_name = param._rich_display_name = functools.partial(_argument_usage, param)
            continue
        if param.metavar is not None or getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        name = param.name or ""
        descriptor = getattr(param, "type_descriptor", None)
        annotation: Any = getattr(descriptor, "annotation", None)
        element: Any = annotation.__args__[0] if getattr(annotation, "__origin__", None) is list else annotation
        if name in _METAVAR_BY_NAME:
            param.metavar = _METAVAR_BY_NAME[name]
        elif name.endswith("_id"):
            param.metavar = "ID"
        elif name.endswith("_ns"):
            param.metavar = "NS"
        elif name.endswith(("_seconds", "interval")):
            param.metavar = "SECONDS"
        elif getattr(descriptor, "is_path", False):
            param.metavar = "PATH"
        else:
            param.metavar = _METAVAR_BY_TYPE.get(element, "VALUE")
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)


_KEEP_HYPHEN = "\u2011"
"""A non-breaking hyphen: stands in for ``-`` while help is wrapped, so no word is split at one."""


_BaseContext: Any = TyperGroup.context_class  # Typer's own Click (its exceptions are the ones handled)


class _HelpFormatter(_BaseContext.formatter_class):  # type: ignore[misc]
    """Click's plain help layout, except that a word with hyphens (``--nproc-per-node``,
    ``torch.distributed.run``) is never split at a line end (Click wraps at hyphens)."""

    def write_text(self, text: str) -> None:
        super().write_text(text.replace("-", _KEEP_HYPHEN))

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        super().write_dl([(term, text.replace("-", _KEEP_HYPHEN)) for term, text in rows], col_max, col_spacing)

    def getvalue(self) -> str:
        return str(super().getvalue()).replace(_KEEP_HYPHEN, "-")


class _Context(_BaseContext):  # type: ignore[misc]
    formatter_class = _HelpFormatter


def _whole_words(command: Any) -> None:
    """Make ``command`` and its subcommands format help with :class:`_HelpFormatter`."""
    command.context_class = _Context
    for sub in getattr(command, "commands", {}).values():
        _whole_words(sub)


def _whole_short_help(command: Any) -> None:
    """Give each subcommand of a group its help's first paragraph as the line in the group's help,
    so that line wraps instead of being cut with "..." at 45 characters."""
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(sub.help.strip().split("\n\n")[0].split())
        _whole_short_help(sub)


def _plain_help(app: typer.Typer) -> None:
    app.rich_markup_mode = None
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _plain_help(group.typer_instance)


class _LazyGroup(TyperGroup):
    """The top-level group: lists :data:`COMMANDS` without importing them; resolves one on use."""

    context_class = _Context

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        skip_plain_conversions(self)
        return super().parse_args(ctx, args)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            command = load_command(cmd_name)
            self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, spec.summary) for name, spec in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="traceml",
    cls=_LazyGroup,
    help="TraceML: see inside ML training runs. Capture a training's step time, memory and system load "
         "with a diagnosis at the end (traceml run), and list, compare and browse run folders "
         "(traceml runs ls, traceml ui).\n\nExample: traceml run train.py --epochs 3",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"traceml {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from traceml_ai.cli.common import DEBUG

    DEBUG["on"] = debug


def main() -> None:
    """Console-script entry point (also ``python -m traceml_ai``).

    A reader that stops reading (``traceml runs ls --json | head -1``) ends the command quietly
    with exit code 0, as ``git log | head`` does, not with a "Broken pipe" error."""
    try:
        try:
            app(prog_name="traceml")
        finally:
            sys.stdout.flush()
    except BrokenPipeError:  # the last flush, after the command returned
        from traceml_ai.cli.common import reader_gone

        reader_gone()
        sys.exit(0)
