"""``traceml ui``: the local web viewer (DESIGN §4)."""

from __future__ import annotations

import errno
from typing import Annotated

import typer
from rich.markup import escape

from traceml_ai.cli.common import (
    CACHE_DIR_HELP,
    UserError,
    err,
    one_line_errors,
    out,
    roots_or_default,
    scan_note,
    settings,
)
from traceml_ai.runs.discovery import NoRootError, list_runs, resolve_roots


@one_line_errors
def ui(
    roots: Annotated[
        list[str] | None,
        typer.Argument(metavar="ROOT", help="Runs folders (default: the 'roots' setting, ./traceml/runs)."),
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port; 0 picks a free one.")] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to bind. Only change it if you mean to expose the viewer.")
    ] = None,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Print the URL, do not open a browser.")] = False,
    cache_dir: Annotated[
        str | None, typer.Option(help=CACHE_DIR_HELP)
    ] = None,
    refresh_interval_seconds: Annotated[
        float | None, typer.Option(help="How often running runs are re-read while a page is open.")
    ] = None,
) -> None:
    """Open the run viewer in your browser: table, charts, compare, inspector, exports.

    Example: traceml ui traceml/runs --port 0 --no-browser
    """
    from traceml_ai.ui.cache import default_cache_dir, migrate_cache_dir
    from traceml_ai.ui.server import serve

    st = settings(ui_port=port, ui_host=host, cache_dir=cache_dir, refresh_interval_seconds=refresh_interval_seconds)
    chosen = roots_or_default(roots, st)
    if not resolve_roots(chosen)[0]:
        try:
            list_runs(chosen)
        except NoRootError as e:
            raise UserError(str(e)) from None
    cache = default_cache_dir(chosen, st.cache_dir)
    if st.cache_dir is None:
        for name in migrate_cache_dir(chosen, cache):
            err.print(f"[dim]cache: {escape(name)} copied into the new cache folder {escape(cache)}[/]")

    def announce(url: str) -> None:
        out.print(f"TraceML viewer on [bold]{escape(url)}[/]")
        out.print(f"runs: {escape(', '.join(chosen))} · cache: {escape(cache)} · Ctrl+C to stop", style="dim")

    if st.ui_host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[yellow]warning:[/] binding {escape(st.ui_host)}: anyone who can reach it and has the token "
            "can read your runs"
        )
    try:
        serve(
            chosen,
            host=st.ui_host,
            port=st.ui_port,
            open_browser=not no_browser,
            cache_dir=cache,
            stale_after_seconds=st.stale_after_seconds,
            max_metrics_file_mb=st.max_metrics_file_mb,
            refresh_interval_seconds=st.refresh_interval_seconds,
            progress=scan_note,
            max_points_per_series=st.max_points_per_series,
            announce=announce,
        )
    except KeyboardInterrupt:
        pass
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"port {st.ui_port} is already in use; pass --port 0 to pick a free one") from None
        raise
