"""``traceml runs ls`` and ``traceml runs show``: the run table and one run's details in the terminal.

Both read through :class:`traceml_ai.runs.store.RunStore` and the table model, like the web viewer.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final

import orjson
import typer
from rich.cells import cell_len, set_cell_size
from rich.control import strip_control_codes
from rich.markup import escape
from rich.text import Span, Text

from traceml_ai.cli.common import (
    CACHE_DIR_HELP,
    STATUS_STYLE,
    UsageError,
    UserError,
    err,
    fmt_bytes,
    fmt_duration,
    fmt_time,
    fmt_value,
    one_line_errors,
    out,
    printable,
    roots_or_default,
    scan_note,
    settings,
)
from traceml_ai.runs.discovery import NoRootError
from traceml_ai.runs.filters import FilterError, filter_runs, parse_filter_arg, parse_statuses
from traceml_ai.runs.layout import CORE_FILES
from traceml_ai.runs.model import RunSummary, short_id
from traceml_ai.runs.status import run_duration
from traceml_ai.runs.store import RunStore, heartbeat_age

if TYPE_CHECKING:
    from traceml_ai.ui.warm import WarmStart
from traceml_ai.runs.table import (
    ColumnError,
    Group,
    cell,
    group_runs,
    json_lines,
    parse_sort_arg,
    row_json,
    sort_runs,
    validate_column,
    write_csv,
)

_MAX_WARNED_RUNS = 10
_MAX_CELL = 32  # characters; longer cells end with an ellipsis

app = typer.Typer(help="List and inspect run folders.", no_args_is_help=True, add_completion=False)

RootsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="ROOT", help="Runs folders (default: the 'roots' setting, ./traceml/runs)."),
]


def open_store(roots: list[str] | None, stale_after_seconds: float | None = None) -> RunStore:
    """A polled run store over the roots (arguments, else settings), with the ``perf.*`` facts of
    captured runs joined on; warnings go to stderr.

    Starts from the run database ``runs.sqlite`` of the cache folder when it is usable and checks
    only what changed since; otherwise scans every run and writes the database again
    (:mod:`traceml_ai.ui.warm`, issue 16)."""
    return _open_store(roots, stale_after_seconds)[0]


def _open_store(roots: list[str] | None, stale_after_seconds: float | None = None
                ) -> tuple[RunStore, dict[str, str]]:
    """:func:`open_store`, and run key → the problem of its final summary (the viewer's warning)."""
    warm = _open_warm(roots, stale_after_seconds)
    return warm.store, warm.perf_warnings


def _open_warm(roots: list[str] | None, stale_after_seconds: float | None = None,
               cache_dir: str | None = None) -> WarmStart:
    """The warm start behind :func:`open_store` (its column index too); warnings go to stderr.
    ``cache_dir``: the ``--cache-dir`` given (else the setting, else the default)."""
    from traceml_ai.ui.warm import open_warm

    st = settings(stale_after_seconds=stale_after_seconds, cache_dir=cache_dir)
    chosen = roots_or_default(roots, st)
    if cache_dir is not None:  # (a folder given on the command line: refused loudly, not skipped)
        from traceml_ai.ui.cache import CacheError, check_cache_dir

        try:
            check_cache_dir(cache_dir, chosen)
        except CacheError as e:
            raise UsageError(str(e)) from None
    try:
        warm = open_warm(
            chosen,
            cache_dir=st.cache_dir,
            stale_after_seconds=st.stale_after_seconds,
            max_metrics_file_mb=st.max_metrics_file_mb,
            progress=scan_note,
        )
    except NoRootError as e:
        raise UserError(str(e)) from None
    for warning in [*warm.store.warnings, *warm.warnings]:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    return warm


def check_path_ref(ref: str, roots: list[str] | None) -> None:
    """Refuse a run reference written as a path (it holds a path separator) that is no folder, when
    no ``--root`` is given: it is a mistyped run folder, not a run name to look up (review 13c:
    ``plot broken/nonexist`` answered "no runs folder found").

    Raises:
        UserError: ``<ref> is not a folder``.
    """
    if roots is None and (os.sep in ref or "/" in ref) and not os.path.isdir(ref):
        raise UserError(f"{printable(ref)} is not a folder")


def find_run(store: RunStore, ref: str) -> RunSummary:
    """The run ``ref`` names (:meth:`RunStore.resolve`); when several runs have that name, the
    newest is taken and a one-line note on stderr says so and how to name another.

    Raises:
        NotFoundError: no run, or an ambiguous id prefix or start of a name (one line).
    """
    run, note = store.resolve(ref)
    if note:
        err.print(f"[yellow]note:[/] {escape(printable(note))}")
    return run


def _with_perf_warning(run: RunSummary, perf_warnings: Mapping[str, str]) -> RunSummary:
    """``run`` with the problem of its final summary among its warnings, as the viewer lists it."""
    extra = perf_warnings.get(run.key) if run.perf else None
    if not extra or extra in run.warnings:
        return run
    return dataclasses.replace(run, warnings=[*run.warnings, extra])


@app.command("ls")
@one_line_errors
def ls(
    roots: RootsArg = None,
    filter_: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            "-f",
            metavar="EXPR",
            help="COLUMN OP VALUE, e.g. 'run.best.val/auc>=0.8', 'config.optim.lr:0.001..0.01', 'name:/^base/'.",
        ),
    ] = None,
    sort: Annotated[
        list[str] | None,
        typer.Option("--sort", "-s", metavar="KEY", help="Column to sort by; '-' prefix for descending."),
    ] = None,
    group_by: Annotated[str | None, typer.Option("--group-by", "-g", metavar="FIELD", help="Group rows.")] = None,
    columns: Annotated[
        str | None, typer.Option("--columns", "-c", metavar="COL,...", help="Columns to show, comma separated.")
    ] = None,
    search: Annotated[str | None, typer.Option("--search", help="Text in id, name, group or tags.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", metavar="S,...", help="Only these statuses (e.g. running,stale).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run (for scripts and agents).")] = False,
    as_csv: Annotated[bool, typer.Option(
        "--csv", help="CSV with the export's column names: id, name, status, group, tags, path and the table's "
                      "columns, or only the --columns given.")] = False,
    stale_after_seconds: Annotated[float | None, typer.Option(help="Heartbeat age that makes a run stale.")] = None,
    cache_dir: Annotated[str | None, typer.Option(
        help=CACHE_DIR_HELP + " Holds runs.sqlite, the run database a listing starts from.")] = None,
) -> None:
    """List runs as a table.

    Example: traceml runs ls traceml/runs --filter 'run.best.val/auc>=0.8' --sort -run.best.val/auc --group-by group
    """
    if as_json and as_csv:
        raise UsageError("choose one of --json and --csv")
    try:
        filters = [parse_filter_arg(f) for f in filter_ or []]
        statuses = parse_statuses(s for s in status.split(",") if s.strip()) if status else None
        keys = [parse_sort_arg(s) for s in sort or []] or [parse_sort_arg("-started")]
        if columns is not None:
            cols = [validate_column(c.strip()) for c in columns.split(",") if c.strip()]
            if not cols:
                raise UsageError("--columns names no column; e.g. --columns name,status,run.best.val/auc")
        if group_by:
            validate_column(group_by)
    except (FilterError, ColumnError) as e:
        raise UsageError(str(e)) from None
    from traceml_ai.ui.warm import collector_paused

    # Without the cyclic collector: listing 100,000 runs builds millions of short-lived, acyclic
    # objects, and the collections they set off took 40 % of `runs ls --json` (issue 16).
    with collector_paused():
        warm = _open_warm(roots, stale_after_seconds, cache_dir)
        runs = [_with_perf_warning(run, warm.perf_warnings) for run in warm.store.runs()]
        try:
            matched = filter_runs(runs, filters, search=search, statuses=statuses)
        except FilterError as e:  # a filter that fits the column's values only once they are read
            raise UsageError(str(e)) from None
        shown = sort_runs(matched, keys)
        if columns is None:
            # The table model's defaults, with the logged values moved ahead of group and tags: in a
            # terminal the columns that do not fit are the last ones.
            cols = warm.columns.facts(runs).default  # = default_columns(runs), from the primed index
            cols = [c for c in cols if c not in ("group", "tags")] + [c for c in ("group", "tags") if c in cols]
        groups = group_runs(shown, group_by) if group_by else None
        if groups is not None:
            shown = [run for g in groups for run in g.runs]
        labels = {run.key: g.label for g in groups for run in g.runs} if groups is not None else {}
        if as_json:
            _write_json_lines(json_lines(shown, cols, group_by=group_by, labels=labels))
            return
        if as_csv:
            write_csv(sys.stdout, shown, cols, group_by=group_by, group_labels=labels, lead=columns is None)
            return
        if "name" not in cols and "id" not in cols:
            # A terminal row must say which run it is (review 13d); --json and --csv give exactly the
            # columns asked for, and each JSON line carries id and name anyway.
            cols = ["name", *cols]
        _print_table(shown, cols, group_by, groups, total=len(runs))


def _write_json_lines(chunks: Iterator[bytes]) -> None:
    """One JSON object per line on stdout, written as bytes a few thousand rows at a time
    (:func:`~traceml_ai.runs.table.json_lines`; a text write per row was a fifth of ``runs ls
    --json`` of 100,000 runs, issue 16)."""
    binary = getattr(sys.stdout, "buffer", None)
    sys.stdout.flush()
    for chunk in chunks:
        _write_bytes(binary, chunk)


def _write_bytes(binary: Any, data: bytes) -> None:
    if binary is not None:
        binary.write(data)
        binary.flush()
    else:  # a text-only stdout (an embedding program's)
        sys.stdout.write(data.decode())


def _print_table(
    runs: list[RunSummary], cols: list[str], group_by: str | None, groups: list[Group] | None, total: int
) -> None:
    cells = {run.key: _cells(run, cols) for run in runs}
    fitted, hidden = _fit_columns(cols, cells, out.width)
    indices = [cols.index(c) for c in fitted]
    # One table per group, all with the same column widths, each under its group's header on a line of
    # its own: a header inside a table row would be cut to the width of that row's first column.
    widths = [min(_MAX_CELL, max([len(c)] + [cell_len(cells[r.key][1 + i][0]) for r in runs]))
              for c, i in zip(fitted, indices, strict=True)]
    sections = [(g.label, g.runs) for g in groups] if groups is not None else [(None, runs)]
    for n, (label, members) in enumerate(sections):
        if label is not None:
            out.print(Text(f"{group_by} = {printable(label)}  ({len(members)})", style="bold reverse"),
                      soft_wrap=True)
        rows = [[cells[run.key][0], *(cells[run.key][1 + i] for i in indices)] for run in members]
        out.print(_table(fitted, widths, rows, show_header=n == 0), soft_wrap=True)
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.display_status] = counts.get(run.display_status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    # "24 runs", or "5 of 24 runs" when a filter, the search or a status hides some (as the viewer says).
    count = f"{total} run{'' if total == 1 else 's'}" if len(runs) == total else f"{len(runs)} of {total} runs"
    out.print(Text(count + (f" ({summary})" if summary else ""), style="dim"))
    if total == 0:  # an empty folder is not a filter problem
        out.print(Text("no run in these folders yet: start one with traceml run SCRIPT, or write examples with "
                       "traceml fake-runs", style="dim"), soft_wrap=True)
    elif not runs:
        out.print(Text("no run matches: loosen --filter, --search or --status", style="dim"), soft_wrap=True)
    if hidden:
        out.print(Text(f"{len(hidden)} more column(s) did not fit ({', '.join(hidden[:4])}"
                       f"{', …' if len(hidden) > 4 else ''}); choose with --columns or widen the terminal",
                       style="dim"))
    flagged = [run for run in runs if run.warnings]
    names: dict[str, int] = {}
    for run in runs:
        names[run.name] = names.get(run.name, 0) + 1
    for run in flagged[:_MAX_WARNED_RUNS]:
        more = f" (+{len(run.warnings) - 1} more)" if len(run.warnings) > 1 else ""
        # Two runs sharing a name are told apart by their short id, as the viewer does (`same · 20ba`).
        label = f"{run.name} · {short_id(run.id)}" if names.get(run.name, 0) > 1 else run.name
        out.print(Text.assemble(("⚠ ", "yellow"), (printable(label), "bold"),
                                f": {printable(run.warnings[0])}{more}"))
    if len(flagged) > _MAX_WARNED_RUNS:
        out.print(Text(f"⚠ … and {len(flagged) - _MAX_WARNED_RUNS} more runs with file problems", style="yellow"))


Cell = tuple[str, str]
"""A table cell: its text (as Rich's ``Text`` keeps it: BEL, BS, VT, FF and CR taken out) and style."""


def _table(cols: list[str], widths: list[int], rows: list[list[Cell]], show_header: bool) -> Any:
    """The run table's rows under a bold header line: a one-character file-problem marker column, then
    ``cols`` at ``widths`` (numbers right-aligned, a longer cell cut with an ellipsis), two spaces apart.

    The lines are laid out here as one ``Text``, as Rich's ``Table(box=None, pad_edge=False)`` lays
    out these fixed-width columns (a test checks they print alike): Rich's table layout and a ``Text``
    per cell cost more than the rest of ``traceml runs ls`` once the runs are read (issue 14, item 1).
    A table wider than the console is Rich's, which narrows the columns to fit."""
    justify = ["left", *("right" if _numeric(c) else "left" for c in cols)]
    widths = [1, *widths]
    if sum(widths) + 2 * len(cols) > out.width:
        from rich.table import Table

        table = Table(show_lines=False, header_style="bold", pad_edge=False, box=None, show_header=show_header)
        table.add_column("", no_wrap=True, width=1)
        for c, w in zip(cols, widths[1:], strict=True):
            table.add_column(c, justify="right" if _numeric(c) else "left", no_wrap=True, overflow="ellipsis",
                             width=w)
        for row in rows:
            table.add_row(*(Text(plain, style=style) for plain, style in row))
        return table
    lines = ([[(strip_control_codes(c), "") for c in ["", *cols]]] if show_header else []) + rows
    parts: list[str] = []
    spans: list[Span] = []
    at = 0
    for n, row in enumerate(lines):
        start = at
        for i, ((plain, style), width, side) in enumerate(zip(row, widths, justify, strict=True)):
            if i:
                parts.append("  ")
                at += 2
            # Justified as Rich justifies a cell (Text.truncate, rstrip, pad_left), the padding in the
            # cell's style.
            if side == "right":
                plain = plain.rstrip()
            length = cell_len(plain)
            if length > width:
                plain = set_cell_size(plain, width - 1) + "…"
            elif length < width:
                plain = " " * (width - length) + plain if side == "right" else plain + " " * (width - length)
            parts.append(plain)
            if style:
                spans.append(Span(at, at + len(plain), style))
            at += len(plain)
        if show_header and n == 0:
            spans.append(Span(start, at, "bold"))
        if n < len(lines) - 1:
            parts.append("\n")
            at += 1
    return Text("".join(parts), spans=spans, end="")


def _numeric(column: str) -> bool:
    return column.startswith(("run.", "summary.")) or column in ("duration_s", "step", "epoch")


def _fit_columns(cols: list[str], cells: dict[str, list[Cell]], width: int) -> tuple[list[str], list[str]]:
    """Keep columns from the left while they fit the terminal; return (kept, dropped).

    A column needs the wider of its header and its widest cell (capped at _MAX_CELL) plus padding;
    the first two columns are always kept so a narrow terminal still shows which run is which.
    """
    used = 2  # the file-problem marker
    kept: list[str] = []
    for i, c in enumerate(cols):
        widest = max([len(c)] + [cell_len(row[i + 1][0]) for row in cells.values()])
        need = min(widest, _MAX_CELL) + 2
        if kept and len(kept) >= 2 and used + need > width:
            return kept, cols[i:]
        kept.append(c)
        used += need
    return kept, []


MISSING: Final = "–"
"""A table cell without a value, as the viewer's table draws it."""


def _cells(run: RunSummary, cols: list[str]) -> list[Cell]:
    cells: list[Cell] = [("⚠", "yellow") if run.warnings else ("", "")]
    for c in cols:
        v = cell(run, c)
        if v is None and c != "name":
            # As the page shows a missing value (a run without telemetry in perf.*, a metric it did
            # not log); --json keeps null and --csv an empty field.
            cells.append((MISSING, "dim"))
        elif c == "status":
            cells.append((str(v), STATUS_STYLE.get(str(v), "")))
        elif c == "duration_s":
            cells.append((fmt_duration(v if isinstance(v, float) else None), ""))  # derived when not written
        elif c in ("started", "ended", "heartbeat"):
            cells.append((fmt_time(v if isinstance(v, str) else None), ""))
        elif c == "name":
            cells.append((printable(str(v)), "bold"))
        elif c.startswith("perf.peak_mem.") and isinstance(v, (int, float)) and not isinstance(v, bool):
            cells.append((fmt_bytes(v), ""))  # bytes, as the page shows them (--json/--csv keep the number)
        else:
            cells.append((printable(fmt_value(v)), ""))
    return [(strip_control_codes(text), style) for text, style in cells]


_DERIVED_FROM = {"stale": "heartbeat_at", "running": "now", "running?": "now"}


def _duration_text(run: RunSummary, now: float) -> str:
    """The duration, saying how it was derived when run.json has no ``duration_s``."""
    value, derived = run_duration(run, now)
    text = fmt_duration(value)
    if derived:
        end = "ended_at" if run.finished else _DERIVED_FROM.get(run.display_status, "now")
        text += f" (derived: {end} − started_at)"
    return text


@app.command("show")
@one_line_errors
def show(
    run_ref: Annotated[str, typer.Argument(
        metavar="RUN", help="Run id, unique id prefix, name (the newest of that name), or folder path.")],
    roots: Annotated[
        list[str] | None, typer.Option("--root", "-r", help="Runs folder to look in (repeatable).")
    ] = None,
    tail: Annotated[int, typer.Option(help="Traceback lines to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run as JSON.")] = False,
) -> None:
    """Show one run: status, error with the traceback tail, warnings, params and metrics.

    Example: traceml runs show failed-run --root traceml/runs
    """
    check_path_ref(run_ref, roots)
    if roots is None and os.path.isdir(run_ref):
        if not any(os.path.exists(os.path.join(run_ref, name)) for name in CORE_FILES):
            raise UserError(f"{run_ref} is not a run folder (it has none of {', '.join(CORE_FILES)})")
        roots = [os.path.dirname(os.path.realpath(run_ref))]  # a run folder path: its root is the parent
    from rich.panel import Panel
    from rich.table import Table

    store, perf_warnings = _open_store(roots)
    run = find_run(store, run_ref)
    history = store.history(run.key)
    details = store.details(run.key)
    run = _with_perf_warning(details.summary, perf_warnings)
    if as_json:
        sys.stdout.write(
            orjson.dumps(
                {**row_json(run, []), "path": run.path, "run_json": run.run_json, "params": run.params,
                 "last": run.last, "best": {k: dataclasses.asdict(b) for k, b in run.best.items()},
                 "summary": run.summary,
                 "start": run.start, "config": details.config, "rows": len(history.rows)},
                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY,
                default=str,
            ).decode()
            + "\n"
        )
        return
    style = STATUS_STYLE.get(run.display_status, "")
    head = Text()
    head.append(run.name, style="bold")
    head.append("  ")
    head.append(run.display_status, style=style)
    head.append(f"\n{run.id}\n{run.path}", style="dim")
    info = Table.grid(padding=(0, 2))
    info.add_column(style="dim")
    info.add_column()
    age = heartbeat_age(run, time.time())
    rows = [
        ("group", run.group or ""),
        ("tags", ", ".join(run.tags)),
        ("started", fmt_time(run.started_at)),
        ("ended", fmt_time(run.ended_at)),
        ("duration", _duration_text(run, time.time())),
        ("heartbeat", f"{fmt_time(run.heartbeat_at)} ({fmt_duration(age)} ago)" if age is not None else ""),
        ("step / epoch", f"{fmt_value(run.step)} / {fmt_value(run.epoch)}"),
        ("history", f"{len(history.rows)} rows in metrics.jsonl"),
        ("command", " ".join(str(c) for c in run.run_json.get("command") or [])),
        ("notes", run.notes),
    ]
    for label, text in rows:
        if text and text.strip(" /"):
            info.add_row(label, Text(text))
    out.print(Panel.fit(info, title=head, title_align="left"))
    error = run.error
    if error or run.display_status == "failed":
        err_text = Text()
        if error:
            err_text.append(f"{error.get('type') or 'Error'}: {error.get('message') or ''}\n", style="bold red")
            # Only what run.json says: a field it leaves null is left out, never "signal None".
            exit_bits = [f"{label} {error[field]}" for label, field in (("exit code", "code"), ("signal", "signal"))
                         if error.get(field) is not None]
            if exit_bits:
                err_text.append("  ".join(exit_bits) + "\n", style="red")
            lines = str(error.get("traceback") or "").rstrip("\n").splitlines()
            if lines:
                err_text.append("\n".join(lines[-tail:]), style="")
        else:
            err_text.append("failed without error details in run.json", style="red")
        out.print(Panel(err_text, title="error", border_style="red", title_align="left"))
    warnings = list(run.warnings)  # with the final summary's problem, as the viewer says (_with_perf_warning)
    if warnings:
        warn = Text("\n".join(f"⚠ {w}" for w in warnings), style="yellow")
        out.print(Panel(warn, title="file problems", border_style="yellow", title_align="left"))
    metrics = Table(title="metrics", title_justify="left", box=None, header_style="bold")
    for c in ("metric", "start", "last", "best", "at step"):
        metrics.add_column(c, justify="left" if c == "metric" else "right")
    for name in sorted(set(run.metric_names) | set(run.last) | set(run.best)):
        b = run.best.get(name)
        metrics.add_row(
            name,
            fmt_value(run.start.get(name)),
            fmt_value(run.last.get(name)),
            fmt_value(b.value) if b else "",
            fmt_value(b.step) if b else "",
        )
    for k, v in run.summary.items():
        metrics.add_row(f"summary.{k}", "", fmt_value(v), "", "")
    if metrics.row_count:
        out.print(metrics)
    if run.params:
        params = Table(title="params", title_justify="left", box=None, header_style="bold")
        params.add_column("key")
        params.add_column("value")
        for k, v in run.params.items():
            params.add_row(k, Text(fmt_value(v)))
        out.print(params)
