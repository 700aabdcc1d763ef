"""``traceml fake-runs``: write fake run folders for development (003 seed, "Fake run generator")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from traceml_ai.runs.fake import FakeRunsError, generate, live_run


def fake_runs(
    output: Annotated[Path, typer.Option("--output", metavar="DIR", help="The runs directory to write into.")] = Path(
        "test-data/traceml/runs"
    ),
    runs: Annotated[
        int,
        typer.Option("--runs", metavar="N", min=0, help="How many historical runs to generate (0 means none)."),
    ] = 24,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Random seed.")] = 0,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="Delete the output directory first. Refused if it contains anything that isn't a run.",
        ),
    ] = False,
    big_run_lines: Annotated[
        int,
        typer.Option(
            "--big-run-lines", metavar="N", min=0, help="Also write one run with about N metrics.jsonl lines."
        ),
    ] = 0,
    live: Annotated[
        bool, typer.Option("--live", help="After generating, start a live run that keeps appending metrics.")
    ] = False,
    live_interval: Annotated[
        float, typer.Option("--live-interval", metavar="S", min=0.0, help="Seconds between live epochs.")
    ] = 2.0,
    live_epochs: Annotated[
        int,
        typer.Option(
            "--live-epochs",
            metavar="N",
            min=0,
            help="Stop after N epochs and mark the live run completed. 0 means run until Ctrl+C, "
            "which leaves it running (it turns stale).",
        ),
    ] = 0,
    no_partial_writes: Annotated[
        bool,
        typer.Option(
            "--no-partial-writes",
            help="Never write half a line in the live run (by default it sometimes does, then finishes it).",
        ),
    ] = False,
) -> None:
    """Write fake training runs in the exact TraceML run format, to try the viewer without training.

    The historical runs start with fixed special cases (completed, failed, killed, stale, legacy,
    future schema, malformed lines), then random parameter variants.

    Examples:

        traceml fake-runs --runs 100 --output test-data/traceml/runs

        traceml fake-runs --runs 0 --live        # only a live run, until Ctrl+C
    """
    out = Console(soft_wrap=True, highlight=False)
    try:
        written = generate(output, runs=runs, seed=seed, clean=clean, big_run_lines=big_run_lines)
        if written or not live:
            big = f" (with big-run, {big_run_lines} lines)" if big_run_lines else ""
            out.print(f"wrote {len(written)} runs{big} to [bold]{escape(str(output))}[/bold]")
        if live:
            endless = live_epochs == 0
            how = "until Ctrl+C" if endless else f"for {live_epochs} epochs"
            out.print(f"live run in [bold]{escape(str(output))}[/bold], one epoch every {live_interval:g} s {how}")
            run_dir = live_run(
                output,
                interval=live_interval,
                epochs=live_epochs,
                partial_writes=not no_partial_writes,
                seed=seed,
            )
            if endless:  # stopped by Ctrl+C: leave the run as a crashed logger would
                out.print(f"stopped; {escape(run_dir.name)} is left running, so it turns stale")
            else:
                out.print(f"live run {escape(run_dir.name)} completed")
    except (FakeRunsError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
