"""The ``traceml`` command (DESIGN §7). Thin: parse, call, print."""

from __future__ import annotations

from typing import Annotated

import typer

from traceml_ai import __version__
from traceml_ai.cli import capture
from traceml_ai.cli import query as query_cli
from traceml_ai.cli import runs as runs_cli
from traceml_ai.cli import summary as summary_cli
from traceml_ai.cli.bench import bench
from traceml_ai.cli.common import DEBUG
from traceml_ai.cli.demo import demo
from traceml_ai.cli.fake_runs import fake_runs
from traceml_ai.cli.plot import plot
from traceml_ai.cli.ui import ui

app = typer.Typer(
    name="traceml",
    help="TraceML: see inside ML training runs. Run folders, a run table, and (soon) live telemetry.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(runs_cli.app, name="runs")
app.add_typer(query_cli.app, name="query")
app.command("fake-runs")(fake_runs)
app.command("demo")(demo)
app.command("bench")(bench)
app.command("ui")(ui)
app.command("plot")(plot)
app.command("summary")(summary_cli.summary)
app.command("compare")(summary_cli.compare)
app.command("run", context_settings=capture.PASS_THROUGH)(capture.run)
app.command("watch", context_settings=capture.PASS_THROUGH)(capture.watch)
app.command("serve")(capture.serve)


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
    DEBUG["on"] = debug


def main() -> None:
    """Console-script entry point."""
    app()
