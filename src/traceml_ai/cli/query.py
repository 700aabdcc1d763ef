"""``traceml query runs|attachments|sessions PATH...`` (004 seed, "Query API"; DESIGN §5, §7): every
flag of real Stormlog's ``stormlog query runs|attachments|sessions``, and a few more. Thin: parse,
call :func:`traceml_ai.catalog.open`, print.

Rows go to stdout (a table, ``--json``: one JSON array, ``[]`` when empty, as Stormlog prints it;
``--jsonl``: one JSON object per line; or ``--csv``); catalog warnings
go to stderr, at most :data:`WARNINGS_PER_KIND` of one kind (code) per file, then one line saying
how many more (``--all-warnings`` prints each; ``store.warnings`` always holds all). Exit codes: 0
when the query ran (warnings included), 1 when none of the paths exists or could be read, or with
``--strict`` when there were warnings, 2 on bad usage.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from traceml_ai.catalog import (
    DEFAULT_WINDOW_NS,
    EVIDENCE_KINDS,
    ISSUE_KINDS,
    ISSUE_STATES,
    SCOPES,
    SUMMARY_GROUPS,
    SUMMARY_METRICS,
    AttachmentRow,
    CacheFolderError,
    CatalogStore,
    CatalogWarning,
    CorrelationFilter,
    EventFilter,
    IssueFilter,
    OOMBundleFilter,
    OOMBundleRow,
    RunRow,
    SessionRow,
    default_cache_dir,
    open_catalog,
    utc,
)
from traceml_ai.cli.common import UsageError, UserError, err, one_line_errors, out, printable, settings

app = typer.Typer(
    help="Query the run catalog found under folders: runs, sessions, attachments, events, OOM bundles, issues, "
         "summaries, correlation (every subcommand of stormlog query).",
    no_args_is_help=True,
    add_completion=False,
)

PathsArg = Annotated[list[str], typer.Argument(metavar="PATH", help="Folders to search and files to read.")]
RunIdOpt = Annotated[list[str] | None, typer.Option("--run-id", help="Only this run (repeat for several).")]
JobIdOpt = Annotated[list[str] | None, typer.Option("--job-id", help="Only this job id (repeat for several).")]
SessionIdOpt = Annotated[list[str] | None, typer.Option("--session-id", "--session",
                                                        help="Only this session (repeatable).")]
RankOpt = Annotated[list[int] | None, typer.Option("--rank", help="Only this rank (repeatable).")]
KindOpt = Annotated[list[str] | None, typer.Option(
    "--kind", help="Attachment kind (runs: holding one; sessions: the source kind). Repeatable.")]
StatusOpt = Annotated[list[str] | None, typer.Option("--status", help="running, completed, interrupted, incomplete.")]
WorldSizeOpt = Annotated[list[int] | None, typer.Option("--world-size", help="Only sessions of this world size.")]
SourceKindOpt = Annotated[list[str] | None, typer.Option(
    "--source-kind", help="sink, diagnose_bundle, telemetry_json, telemetry_jsonl, telemetry_csv, traceml_session.")]
HasOomOpt = Annotated[bool | None, typer.Option("--has-oom-bundle/--no-has-oom-bundle",
                                                help="Only sessions with (without) an OOM bundle.")]
NamespaceOpt = Annotated[list[str] | None, typer.Option("--source-namespace", help="e.g. wandb, nsys.")]
RefOpt = Annotated[list[str] | None, typer.Option("--source-ref", help="e.g. entity/project/run-id, rank0.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON array of rows (as stormlog query --json).")]
JsonlOpt = Annotated[bool, typer.Option("--jsonl", help="One JSON object per row and line.")]
TableOpt = Annotated[bool, typer.Option("--table", help="A table (the default).")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="CSV with a header line; lists and objects as JSON.")]
CacheDirOpt = Annotated[str | None, typer.Option(
    "--cache-dir", help="Parse-cache folder (default: the cache_dir setting, else ~/.cache/traceml/catalog).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Read every file; write no cache.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 when there are warnings (for CI).")]
AllWarningsOpt = Annotated[bool, typer.Option(
    "--all-warnings", help="Print every warning (default: 20 of one kind per file, then a count).")]

WARNINGS_PER_KIND = 20
"""Warnings of one kind (code) about one file printed before the rest are summed up in one line:
an envelope naming 20,000 sessions that are not on disk is 21 lines, not 20,000."""


def _format(as_json: bool, as_table: bool, as_csv: bool, as_jsonl: bool = False) -> str:
    chosen = [name for name, on in (("json", as_json), ("jsonl", as_jsonl), ("table", as_table), ("csv", as_csv))
              if on]
    if len(chosen) > 1:
        raise UsageError("choose one of --json, --jsonl, --table and --csv")
    return chosen[0] if chosen else "table"


def _open(paths: Sequence[str], cache_dir: str | None, no_cache: bool, all_warnings: bool) -> CatalogStore:
    if cache_dir is not None and no_cache:
        raise UsageError("choose one of --cache-dir and --no-cache")
    chosen: str | None = None
    if not no_cache:
        chosen = settings(cache_dir=cache_dir).cache_dir or default_cache_dir()
    try:
        store = open_catalog(paths, cache_dir=chosen)
    except CacheFolderError as exc:
        if cache_dir is not None:
            raise UsageError(str(exc)) from None
        store = open_catalog(paths)  # the default place is inside a root: read without a cache
    _print_warnings(store.warnings, None if all_warnings else WARNINGS_PER_KIND)
    if not store.roots and not store.unread_paths:
        raise UserError("none of the paths exists: " + ", ".join(printable(p) for p in paths))
    missing = sum(1 for w in store.warnings if w.code == "missing_path")
    if store.unread_paths and missing + len(store.unread_paths) >= len(paths):
        raise UserError("none of the paths could be read: " + ", ".join(printable(p) for p in store.unread_paths)
                        + " (see the warnings above)")
    return store


def _print_warnings(warnings: Sequence[CatalogWarning], per_kind: int | None) -> None:
    """Each warning on stderr; with ``per_kind``, only the first ``per_kind`` of one code about one
    file, then one line with how many more (printed after that file's last shown warning)."""
    counts: dict[tuple[str, str], int] = {}
    if per_kind is not None:
        for w in warnings:
            counts[(w.path, w.code)] = counts.get((w.path, w.code), 0) + 1
    seen: dict[tuple[str, str], int] = {}
    lines: list[str] = []
    for w in warnings:
        key = (w.path, w.code)
        n = seen[key] = seen.get(key, 0) + 1
        if per_kind is None or n <= per_kind:
            lines.append(f"[yellow]warning:[/] {escape(printable(str(w)))}")
        if per_kind is not None and n == per_kind and counts[key] > per_kind:
            more = counts[key] - per_kind
            lines.append(f"[yellow]warning:[/] {escape(printable(w.path))}: and {more:,} more "
                         f"{'warning' if more == 1 else 'warnings'} of the same kind ({w.code}) about this file "
                         "(--all-warnings prints each)")
    if lines:
        err.print("\n".join(lines), soft_wrap=True)


def _time(ns: int | None) -> str:
    if ns is None:
        return ""
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return printable(str(value))


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (null), as orjson writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any, *, pretty: bool = True) -> str:
    """``value`` as JSON text: indented with sorted keys (``--json``, as ``stormlog query --json``)
    or compact (``--jsonl``). NaN and infinities are null (valid JSON; Stormlog writes ``NaN``); an
    integer beyond 64 bits, which orjson cannot write, is written exactly by the standard library."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS if pretty else None,
                            default=str).decode()
    except orjson.JSONEncodeError:
        if pretty:
            return json.dumps(_finite(value), indent=2, sort_keys=True, default=str, ensure_ascii=False)
        return json.dumps(_finite(value), separators=(",", ":"), default=str, ensure_ascii=False)


def _csv_value(value: Any) -> Any:
    # Stormlog's cell: lists and objects as json.dumps(sort_keys=True) writes them; None is empty
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def write_csv(rows: Sequence[dict[str, Any]], preferred: Sequence[str], traceml_only: Sequence[str] = ()) -> None:
    """Rows as ``stormlog query --csv`` prints them, byte for byte: Stormlog's preferred columns
    that the rows have, then the others sorted (its preferred columns alone when there is no row),
    the csv module's default dialect (``\\r\\n`` line ends, minimal quoting, floats as ``repr``),
    empty cells for null. ``traceml_only`` fields are left out (they are in ``--json``)."""
    if traceml_only:
        drop = set(traceml_only)
        rows = [{k: v for k, v in r.items() if k not in drop} for r in rows]
    cols = _columns(rows, preferred)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(cols)
    for r in rows:
        writer.writerow([_csv_value(r.get(c)) for c in cols])
    sys.stdout.write(buf.getvalue())


Columns = list[tuple[str, Callable[[Any], Any]]]

STORMLOG_COLUMNS: dict[type, tuple[str, ...]] = {
    RunRow: ("run_id", "explicit", "title", "job_id", "started_at_ns", "ended_at_ns", "session_count",
             "attachment_count", "source_kind", "source_path", "source_namespace", "source_ref", "sessions", "ranks"),
    AttachmentRow: ("run_id", "kind", "title", "storage", "session_id", "job_id", "rank", "source_kind", "source_path",
                    "source_namespace", "source_ref", "url", "path"),
    SessionRow: ("session_id", "status", "started_at_ns", "ended_at_ns", "host", "pid", "job_id", "rank", "local_rank",
                 "world_size", "source_kind", "source_path", "source_count", "warning_count", "event_count",
                 "oom_bundle_count"),
}
"""Stormlog's preferred ``--table``/``--csv`` column order for runs, attachments and sessions."""

RUN_COLUMNS: Columns = [
    ("run_id", lambda r: r.run_id), ("explicit", lambda r: "yes" if r.explicit else "no"),
    ("job_id", lambda r: r.job_id), ("sessions", lambda r: r.session_count), ("ranks", lambda r: r.ranks),
    ("attachments", lambda r: r.attachment_count), ("status", lambda r: r.status),
    ("started (UTC)", lambda r: _time(r.started_at_ns)), ("source_kind", lambda r: r.source_kind),
    ("title", lambda r: r.title),
]
ATTACHMENT_COLUMNS: Columns = [
    ("run_id", lambda a: a.run_id), ("kind", lambda a: a.kind), ("title", lambda a: a.title),
    ("storage", lambda a: a.storage), ("path or url", lambda a: a.path if a.path is not None else a.url),
    ("session_id", lambda a: a.session_id), ("rank", lambda a: a.rank), ("source_kind", lambda a: a.source_kind),
]
SESSION_COLUMNS: Columns = [
    ("session_id", lambda s: s.session_id), ("status", lambda s: s.status), ("run_id", lambda s: s.run_id),
    ("source_kind", lambda s: s.source_kind), ("job_id", lambda s: s.job_id), ("rank", lambda s: s.rank),
    ("local_rank", lambda s: s.local_rank), ("world_size", lambda s: s.world_size),
    ("started (UTC)", lambda s: _time(s.started_at_ns)), ("events", lambda s: s.event_count),
    ("host", lambda s: s.host),
]


def _print(rows: Sequence[RunRow | AttachmentRow | SessionRow], fmt: str, columns: Columns,
           row_type: type[RunRow | AttachmentRow | SessionRow], what: str) -> None:
    if fmt == "json":
        sys.stdout.write(dumps([r.to_dict() for r in rows]) + "\n")
    elif fmt == "jsonl":
        sys.stdout.write("".join(dumps(r.to_dict(), pretty=False) + "\n" for r in rows))
    elif fmt == "csv":
        write_csv([r.to_dict() for r in rows], STORMLOG_COLUMNS[row_type], row_type.TRACEML_FIELDS)
    else:
        table = Table(caption=f"{len(rows)} {what if len(rows) == 1 else what + 's'}", caption_justify="left")
        for name, _ in columns:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*(escape(_cell(get(row))) for _, get in columns))
        out.print(table)


def _finish(store: CatalogStore, strict: bool) -> None:
    if strict and store.warnings:
        raise typer.Exit(1)


@one_line_errors
def runs(
    paths: PathsArg, run_id: RunIdOpt = None, job_id: JobIdOpt = None, session_id: SessionIdOpt = None,
    rank: RankOpt = None, kind: KindOpt = None, source_namespace: NamespaceOpt = None, source_ref: RefOpt = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Runs: explicit (stormlog_run.json) and implicit (sessions no envelope covers).

    Example: traceml query runs ./artifacts --json
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    rows = store.list_runs(run_id=run_id, job_id=job_id, session_id=session_id, rank=rank, kind=kind,
                           source_namespace=source_namespace, source_ref=source_ref)
    _print(rows, fmt, RUN_COLUMNS, RunRow, "run")
    _finish(store, strict)


@one_line_errors
def attachments(
    paths: PathsArg, run_id: RunIdOpt = None, job_id: JobIdOpt = None, session_id: SessionIdOpt = None,
    rank: RankOpt = None, kind: KindOpt = None, source_namespace: NamespaceOpt = None, source_ref: RefOpt = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Run attachments: envelope and sidecar entries, and local artifacts (copy). URLs are never fetched.

    Example: traceml query attachments ./artifacts --run-id run-train-42 --table
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    rows = store.list_run_attachments(run_id=run_id, job_id=job_id, session_id=session_id, rank=rank, kind=kind,
                                      source_namespace=source_namespace, source_ref=source_ref)
    _print(rows, fmt, ATTACHMENT_COLUMNS, AttachmentRow, "attachment")
    _finish(store, strict)


@one_line_errors
def sessions(
    paths: PathsArg, run_id: RunIdOpt = None, job_id: JobIdOpt = None, session_id: SessionIdOpt = None,
    rank: RankOpt = None, kind: KindOpt = None, source_namespace: NamespaceOpt = None, source_ref: RefOpt = None,
    status: StatusOpt = None, world_size: WorldSizeOpt = None, source_kind: SourceKindOpt = None,
    has_oom_bundle: HasOomOpt = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Sessions (capture lifecycles), each once, latest first.

    Example: traceml query sessions ./artifacts --job-id train-42 --csv
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    rows = store.list_sessions(run_id=run_id, job_id=job_id, session_id=session_id, rank=rank, kind=kind,
                               source_namespace=source_namespace, source_ref=source_ref, status=status,
                               world_size=world_size, source_kind=source_kind, has_oom_bundle=has_oom_bundle)
    _print(rows, fmt, SESSION_COLUMNS, SessionRow, "session")
    _finish(store, strict)


app.command("runs")(runs)
app.command("attachments")(attachments)
app.command("sessions")(sessions)


# -- events, ooms, issues, summary, correlate (the rest of stormlog query) ---------------------

EVENT_COLUMNS = ("session_id", "timestamp_ns", "event_type", "rank", "local_rank", "world_size", "collector",
                 "allocator_allocated_bytes", "allocator_reserved_bytes", "device_used_bytes", "source_kind",
                 "source_path", "session_status")
OOM_COLUMNS = ("bundle_path", "created_at_utc", "backend", "reason", "event_count", "session_id", "session_status",
               "exception_type", "exception_module")
ISSUE_COLUMNS = ("fingerprint_id", "kind", "state", "severity", "title", "hit_count", "first_seen_ns", "last_seen_ns",
                 "affected_sessions", "representative_evidence")
SUMMARY_COLUMNS = ("metric", "group_by", "session_id", "rank", "status", "value", "timestamp_ns", "first_gap_bytes",
                   "latest_gap_bytes", "peak_gap_bytes", "sample_count")
CORRELATION_COLUMNS = ("confidence", "kind", "title", "session_id", "job_id", "rank", "start_ns", "end_ns",
                       "source_kind", "source_path", "reasons")
"""Stormlog's preferred column order per query (its ``--table``/``--csv``); columns the rows have
that are not named here follow, sorted."""


def _columns(rows: Sequence[dict[str, Any]], preferred: Sequence[str]) -> list[str]:
    found = {k for r in rows for k in r}
    cols = [c for c in preferred if c in found]
    cols.extend(sorted(found - set(cols)))
    return cols or list(preferred)


def _table_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()
    return printable(str(value))


def _print_dicts(rows: Sequence[dict[str, Any]], fmt: str, preferred: Sequence[str], what: str,
                 table_columns: Sequence[str] | None = None, traceml_only: Sequence[str] = ()) -> None:
    """Dict rows as ``--json`` (one array, as Stormlog), ``--jsonl``, ``--csv`` (Stormlog's columns)
    or a table (``table_columns``, default Stormlog's preferred ones the rows have)."""
    if fmt == "json":
        sys.stdout.write(dumps(list(rows)) + "\n")
    elif fmt == "jsonl":
        sys.stdout.write("".join(dumps(r, pretty=False) + "\n" for r in rows))
    elif fmt == "csv":
        write_csv(rows, preferred, traceml_only)
    else:
        cols = [c for c in (table_columns or preferred) if any(c in r for r in rows)] or list(preferred)
        table = Table(caption=f"{len(rows)} {what if len(rows) == 1 else what + 's'}", caption_justify="left")
        for c in cols:
            table.add_column(c, overflow="fold")
        for r in rows:
            table.add_row(*(escape(_table_cell(r.get(c))) for c in cols))
        out.print(table)


OutputOpts = tuple[bool, bool, bool, bool]


@one_line_errors
def events(
    paths: PathsArg,
    session_id: Annotated[str | None, typer.Option("--session-id", "--session", help="Only this session.")] = None,
    event_type: Annotated[str | None, typer.Option("--event-type", help="e.g. sample, warning, stop.")] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank.")] = None,
    collector: Annotated[str | None, typer.Option("--collector", help="e.g. stormlog.cpu_tracker.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="The session's status.")] = None,
    time_start_ns: Annotated[int | None, typer.Option("--time-start-ns", help="Not before (Unix epoch ns).")] = None,
    time_end_ns: Annotated[int | None, typer.Option("--time-end-ns", help="Not after (Unix epoch ns).")] = None,
    has_alert: Annotated[bool | None, typer.Option(
        "--has-alert/--no-has-alert", help="Only warning, critical, error or severity-marked events (or no such).")
    ] = None,
    collector_health_status: Annotated[str | None, typer.Option(
        "--collector-health-status", help="metadata.collector_health_status, e.g. degraded.")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="metadata.backend, e.g. cuda.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most this many rows.")] = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Telemetry events of sinks and tracker files, oldest first (Stormlog's canonical v4 events).

    Example: traceml query events ./artifacts --session reuse-a --has-alert --json
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    shown = len(store.warnings)
    rows = [r.to_dict() for r in store.query_events(EventFilter(
        session_id=session_id, event_type=event_type, rank=rank, collector=collector, status=status,
        time_start_ns=time_start_ns, time_end_ns=time_end_ns, has_alert=has_alert,
        collector_health_status=collector_health_status, backend=backend, limit=limit))]
    _print_warnings(store.warnings[shown:], None if all_warnings else WARNINGS_PER_KIND)
    _print_dicts(rows, fmt, EVENT_COLUMNS, "event", ("session_id", "timestamp_ns", "event_type", "rank", "collector",
                                                     "allocator_allocated_bytes", "device_used_bytes",
                                                     "session_status"))
    _finish(store, strict)


@one_line_errors
def ooms(
    paths: PathsArg,
    session_id: Annotated[str | None, typer.Option("--session-id", "--session", help="Only this session.")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="e.g. cuda, cpu.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="The dump's reason, as written.")] = None,
    created_after: Annotated[str | None, typer.Option("--created-after", help="ISO-8601 (UTC if no zone).")] = None,
    created_before: Annotated[str | None, typer.Option("--created-before", help="ISO-8601 time.")] = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """OOM dump bundles (oom_dump_* folders), oldest first.

    Example: traceml query ooms ./artifacts --created-after 2026-01-01T00:00:00Z
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    for name, value in (("--created-after", created_after), ("--created-before", created_before)):
        if value is not None and utc(value) is None:
            raise UsageError(f"{name} {value!r} is not an ISO-8601 time (e.g. 2026-01-31T12:00:00Z)")
    store = _open(paths, cache_dir, no_cache, all_warnings)
    rows = [r.to_dict() for r in store.list_oom_bundles(OOMBundleFilter(
        session_id=session_id, backend=backend, reason=reason, created_after=created_after,
        created_before=created_before))]
    _print_dicts(rows, fmt, OOM_COLUMNS, "OOM bundle", traceml_only=OOMBundleRow.TRACEML_FIELDS)
    _finish(store, strict)


IssueKindOpt = Annotated[str | None, typer.Option(
    "--kind", help="oom, collector_degradation, alert, hidden_memory_anomaly.")]
IssueStateOpt = Annotated[str | None, typer.Option("--state", help="open, resolved, ignored, regressed.")]


def _choice(flag: str, value: str | None, allowed: Sequence[str]) -> None:
    """A flag with a fixed set of values (as Stormlog's argparse ``choices``): exit 2 otherwise."""
    if value is not None and value not in allowed:
        raise UsageError(f"{flag} {value!r} is not one of: {', '.join(allowed)}")


@one_line_errors
def issues(
    paths: PathsArg,
    fingerprint_id: Annotated[str | None, typer.Option("--fingerprint-id", help="issue:<24 hex>.")] = None,
    kind: IssueKindOpt = None, state: IssueStateOpt = None,
    severity: Annotated[str | None, typer.Option("--severity", help="critical, warning, info.")] = None,
    session_id: Annotated[str | None, typer.Option("--session-id", "--session", help="Issues of this session.")] = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Recurring issues (OOMs, collector degradation, alerts) grouped by a stable fingerprint, worst first.

    Example: traceml query issues ./artifacts --kind oom --json
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    _choice("--kind", kind, ISSUE_KINDS)
    _choice("--state", state, ISSUE_STATES)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    shown = len(store.warnings)
    rows = [r.to_dict() for r in store.list_issues(IssueFilter(
        fingerprint_id=fingerprint_id, kind=kind, state=state, severity=severity, session_id=session_id))]
    _print_warnings(store.warnings[shown:], None if all_warnings else WARNINGS_PER_KIND)
    _print_dicts(rows, fmt, ISSUE_COLUMNS, "issue", ("fingerprint_id", "kind", "severity", "title", "hit_count",
                                                     "first_seen_ns", "last_seen_ns", "affected_sessions"))
    _finish(store, strict)


@one_line_errors
def summary(
    paths: PathsArg,
    metric: Annotated[str, typer.Option("--metric", help=f"The summary to run: {', '.join(SUMMARY_METRICS)}.")],
    group_by: Annotated[str | None, typer.Option("--group-by",
                                                 help="session (default), session-rank, rank, status.")] = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Built-in summaries: session counts by status, peak memory, alert and collector transition counts, gap growth.

    Example: traceml query summary ./artifacts --metric peak_device_used_bytes --group-by rank
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    _choice("--metric", metric, SUMMARY_METRICS)
    _choice("--group-by", group_by, SUMMARY_GROUPS)
    store = _open(paths, cache_dir, no_cache, all_warnings)
    shown = len(store.warnings)
    rows = [r.to_dict() for r in store.summarize(metric, group_by=group_by)]
    _print_warnings(store.warnings[shown:], None if all_warnings else WARNINGS_PER_KIND)
    _print_dicts(rows, fmt, SUMMARY_COLUMNS, "row")
    _finish(store, strict)


app.command("events")(events)
app.command("ooms")(ooms)
app.command("issues")(issues)
app.command("summary")(summary)


@one_line_errors
def correlate(
    paths: PathsArg,
    at_ns: Annotated[int | None, typer.Option("--at-ns", help="Anchor time (Unix epoch ns).")] = None,
    record_id: Annotated[str | None, typer.Option("--record-id", help="Anchor event (telemetry-<32 hex>).")] = None,
    session_id: Annotated[str | None, typer.Option("--session-id", "--session", help="Only this session.")] = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="Only this job.")] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank (rank-agnostic evidence stays).")] = None,
    scope: Annotated[str, typer.Option("--scope", help="session (default) or distributed (the job matches too).")
                     ] = "session",
    window_ns: Annotated[int, typer.Option("--window-ns", help="Window either side of the anchor, ns.")
                         ] = DEFAULT_WINDOW_NS,
    kind: Annotated[list[str] | None, typer.Option("--kind", help=f"Evidence kind (repeatable): "
                                                   f"{', '.join(EVIDENCE_KINDS)}.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most this many rows.")] = None,
    as_json: JsonOpt = False, as_jsonl: JsonlOpt = False, as_table: TableOpt = False, as_csv: CsvOpt = False,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, strict: StrictOpt = False,
    all_warnings: AllWarningsOpt = False,
) -> None:
    """Evidence around a moment or a telemetry record: events, markers, alerts, bundles, rollup windows, attachments.

    --json prints {"anchor", "evidence", "warnings"} (as stormlog query correlate --json); the other
    formats print the evidence rows.

    Example: traceml query correlate ./artifacts --at-ns 1796000000000000000 --scope distributed --job-id train-42
    """
    fmt = _format(as_json, as_table, as_csv, as_jsonl)
    if (at_ns is None) == (record_id is None):
        raise UsageError("give one of --at-ns and --record-id")
    _choice("--scope", scope, SCOPES)
    for k in kind or ():
        _choice("--kind", k, EVIDENCE_KINDS)
    if window_ns < 0:
        raise UsageError("--window-ns must be >= 0")
    store = _open(paths, cache_dir, no_cache, all_warnings)
    shown = len(store.warnings)
    result = store.correlate(CorrelationFilter(
        session_id=session_id, job_id=job_id, rank=rank, scope=scope, at_ns=at_ns, record_id=record_id,
        window_ns=window_ns, kinds=tuple(kind or ()), limit=limit))
    _print_warnings(store.warnings[shown:], None if all_warnings else WARNINGS_PER_KIND)
    if fmt == "json":
        sys.stdout.write(dumps(result.to_dict()) + "\n")
    else:
        _print_dicts([e.to_dict() for e in result.evidence], fmt, CORRELATION_COLUMNS, "evidence row",
                     ("confidence", "kind", "title", "session_id", "rank", "start_ns", "source_kind", "reasons"))
    _finish(store, strict)


app.command("correlate")(correlate)
