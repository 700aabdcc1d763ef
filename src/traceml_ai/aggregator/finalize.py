"""Finalization at aggregator shutdown: ``aggregator/finalization_warning.json`` when something was lost.

DESIGN §3.2 "losses are never silent". The file exists only when at least one of these is true:
ranks missing (never said hello, or never sent ``rank_finished``), batches a rank dropped or sent
but never delivered, stdout/stderr lines or rows a rank dropped before sending, rejected frames,
projection skips or unknown streams, SQLite problems, rank log-file problems, payload sinks that
raised, or a loss in an ``extra`` block (e.g. the 000 seed's ``export`` block with
``exporter_failed``). It is written atomically (temporary file + rename).

File format (``schema_version`` 1; rank keys are ``str(global_rank)``, ``"unknown"`` for a
connection that never named its rank)::

    {
      "schema_version": 1,
      "session_id": str,
      "written_at_unix_ns": int,
      "summary": [str, ...],                         # one human line per loss
      "world_size": int | null,                      # expected number of ranks
      "world_size_source": "argument" | "hello" | null,
      "missing_ranks": {"never_connected": [int], "never_finished": [int | "unknown"]},
      "dropped_batches": {rank: int},                # from rank_finished, only ranks with > 0
      "dropped_output_lines": {rank: int},           # from rank_finished, only ranks with > 0
      "lost_rows": {rank: {stream: int}},            # rows a rank's sources dropped before sending
      "unencodable_rows": {rank: {stream: int}},     # rows a rank left out: values msgpack cannot encode
      "undelivered_batches": {rank: int},            # sent_batches − received, only > 0
      "rejected_frames": {"total": int, "by_rank": {rank: int}, "reasons": [str]},
      "refused_connections": {"total": int, "reasons": [str]},   # before a valid hello
      "dropped_connections": int,                    # admitted ranks cut off (frame over the limit)
      "projection": {"skipped": int, "unknown_streams": {stream: rows}, "failures": [str]},
      "sqlite": {"errors": int, "lost_rows": int, "messages": [str]},
      "rank_logs": {"errors": int, "lost_lines": int, "messages": [str]},
      "payload_sinks": {"errors": int, "messages": [str]},
      "ranks": {rank: {"hostname", "hellos", "batches", "rows", "rejected_frames",
                       "finished", "sent_batches", "dropped_batches",
                       "dropped_output_lines"}},      # every rank seen
      ...extra blocks (e.g. "export")
    }
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from traceml_ai.aggregator.stats import IngestStats, RankStats
from traceml_ai.aggregator.store import StoreStats

WARNING_NAME = "finalization_warning.json"
WARNING_SCHEMA_VERSION = 1


def _key(rank: int | None) -> str:
    return "unknown" if rank is None else str(rank)


def _sort_key(rank: int | None) -> tuple[int, int]:
    return (1, 0) if rank is None else (0, rank)


def _per_rank(ranks: Mapping[int | None, RankStats], value: Callable[[RankStats], Any]) -> dict[str, Any]:
    """``value`` of each rank where it is non-zero (non-empty), keyed by rank text, ranks in order."""
    return {_key(r): v for r, s in sorted(ranks.items(), key=lambda kv: _sort_key(kv[0])) if (v := value(s))}


def _job_lines(ingest: IngestStats, store: StoreStats) -> list[str]:
    """The summary lines of losses that are not one rank's: rejected frames, projection, SQLite,
    rank logs, payload sinks, refused and dropped connections."""
    lines: list[str] = []
    if ingest.rejected_frames:
        first = ingest.rejection_reasons[0] if ingest.rejection_reasons else "unknown"
        lines.append(f"{ingest.rejected_frames} frames rejected; first reason: {first}")
    if ingest.projection_skipped:
        lines.append(f"{ingest.projection_skipped} telemetry items or rows did not fit their table")
    lines += [f"{count} rows of unknown stream {stream!r} were not stored"
              for stream, count in sorted(ingest.unknown_streams.items())]
    if store.errors or store.lost_rows:
        lines.append(f"SQLite: {store.errors} errors, {store.lost_rows} rows lost")
    if store.log_errors or store.lost_log_lines:
        lines.append(f"rank logs: {store.log_errors} errors, {store.lost_log_lines} lines lost")
    if ingest.sink_errors:
        lines.append(f"payload sinks raised {ingest.sink_errors} times")
    if ingest.refused_connections:
        first = ingest.refusal_reasons[0] if ingest.refusal_reasons else "unknown"
        lines.append(f"{ingest.refused_connections} connections were refused before a valid hello "
                     f"(telemetry that is not from this job's ranks is never stored); first: {first}")
    if ingest.dropped_connections:
        lines.append(f"{ingest.dropped_connections} rank connections were closed for a frame over the size limit")
    return lines


def _extra_lines(extra: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The summary lines of the ``extra`` blocks (their ``summary_line``; an export block's failure)."""
    lines: list[str] = []
    for name, block in extra.items():
        if isinstance(block.get("summary_line"), str):
            lines.append(str(block["summary_line"]))
        if block.get("exporter_failed"):  # the 000 seed's export block: say it in a line too
            failed = block.get("failed_records")
            lost = (f"{failed} records were not exported" if failed
                    else "every record had been delivered before")  # (review 11f: "0 records were not exported")
            lines.append(f"{name}: exporter {block.get('exporter')!r} failed ({block.get('failure')}); {lost}")
    return lines


def loss_report(
    ingest: IngestStats,
    store: StoreStats,
    *,
    session_id: str,
    world_size: int | None = None,
    world_size_source: str | None = None,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    extra_lost: bool = False,
) -> dict[str, Any] | None:
    """The content of ``finalization_warning.json``, or None when nothing was lost (pure).

    ``world_size`` is the expected number of ranks (ranks ``0 .. world_size-1``); without it only
    ranks that said hello can be reported as never finished. ``extra`` blocks are copied into the
    report under their names; ``extra_lost`` says they hold a loss (so the file is written).
    """
    ranks = ingest.ranks
    admitted = {r for r, s in ranks.items() if s.hellos > 0}
    never_connected = [r for r in range(world_size) if r not in admitted] if world_size is not None else []
    never_finished = [r for r in sorted(admitted, key=_sort_key) if not ranks[r].finished]
    dropped = _per_rank(ranks, lambda s: s.dropped_batches)
    dropped_lines = _per_rank(ranks, lambda s: s.dropped_output_lines)
    lost_rows = _per_rank(ranks, lambda s: dict(sorted(s.lost_rows.items())))
    unencodable = _per_rank(ranks, lambda s: dict(sorted(s.unencodable_rows.items())))
    undelivered = _per_rank(ranks, lambda s: s.undelivered_batches)
    failed_steps = _per_rank(ranks, lambda s: s.step_counts.get("failed_steps", 0))
    rejected_by_rank = _per_rank(ranks, lambda s: s.rejected_frames)
    unattributed = ingest.rejected_frames - sum(rejected_by_rank.values())
    if unattributed > 0:
        rejected_by_rank["unknown"] = rejected_by_rank.get("unknown", 0) + unattributed

    summary: list[str] = []
    if never_connected:
        summary.append(f"{len(never_connected)} of {world_size} ranks never connected: {never_connected}")
    if never_finished:
        shown = [_key(r) if r is None else r for r in never_finished]
        summary.append(f"ranks that connected but never sent rank_finished: {shown}")
    summary += [f"rank {rank} dropped {count} batches (its send queue was full)" for rank, count in dropped.items()]
    summary += [f"rank {rank} dropped {count} stdout/stderr lines (its output buffer was full)"
                for rank, count in dropped_lines.items()]
    summary += [f"rank {rank} dropped {count} {stream} rows before sending (its hand-off queue was full)"
                for rank, by_stream in lost_rows.items() for stream, count in by_stream.items()]
    summary += [f"rank {rank} left out {count} {stream} rows it could not encode (a value msgpack cannot hold, "
                "e.g. an integer beyond 64 bits)"
                for rank, by_stream in unencodable.items() for stream, count in by_stream.items()]
    summary += [f"rank {rank} sent {count} batches that never arrived" for rank, count in undelivered.items()]
    summary += [f"rank {rank} lost the timing of {count} steps (its step timing failed, a TraceML fault; "
                "the training was not affected)" for rank, count in failed_steps.items()]
    summary += _job_lines(ingest, store)
    summary += _extra_lines(extra or {})
    if not summary and not extra_lost:
        return None
    report: dict[str, Any] = {
        "schema_version": WARNING_SCHEMA_VERSION,
        "session_id": session_id,
        "written_at_unix_ns": time.time_ns(),
        "summary": summary,
        "world_size": world_size,
        "world_size_source": world_size_source if world_size is not None else None,
        "missing_ranks": {
            "never_connected": never_connected,
            "never_finished": [_key(r) if r is None else r for r in never_finished],
        },
        "dropped_batches": dropped,
        "dropped_output_lines": dropped_lines,
        "lost_rows": lost_rows,
        "unencodable_rows": unencodable,
        "undelivered_batches": undelivered,
        "failed_steps": failed_steps,
        "rejected_frames": {
            "total": ingest.rejected_frames,
            "by_rank": rejected_by_rank,
            "reasons": list(ingest.rejection_reasons),
        },
        "projection": {
            "skipped": ingest.projection_skipped,
            "unknown_streams": dict(sorted(ingest.unknown_streams.items())),
            "failures": list(ingest.projection_failures),
        },
        "sqlite": {"errors": store.errors, "lost_rows": store.lost_rows, "messages": list(store.messages)},
        "rank_logs": {
            "errors": store.log_errors,
            "lost_lines": store.lost_log_lines,
            "messages": list(store.log_messages),
        },
        "payload_sinks": {"errors": ingest.sink_errors, "messages": list(ingest.sink_messages)},
        "refused_connections": {"total": ingest.refused_connections, "reasons": list(ingest.refusal_reasons)},
        "dropped_connections": ingest.dropped_connections,
        "ranks": {
            _key(r): {
                "hostname": s.hostname,
                "hellos": s.hellos,
                "batches": s.batches,
                "rows": s.rows,
                "rejected_frames": s.rejected_frames,
                "finished": s.finished,
                "sent_batches": s.sent_batches,
                "dropped_batches": s.dropped_batches,
                "dropped_output_lines": s.dropped_output_lines,
            }
            for r, s in sorted(ranks.items(), key=lambda kv: _sort_key(kv[0]))
        },
    }
    for name, block in (extra or {}).items():
        report[name] = dict(block)
    return report


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` via a temporary file in the same folder + rename,
    so a reader never sees half a file.

    Raises:
        OSError: the folder is not writable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    from traceml_ai.diagnose.summary import write_atomic  # numpy; the aggregator loads it only to finish

    write_atomic(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8"))


def finalize(
    run_dir: str | Path,
    ingest: IngestStats,
    store: StoreStats,
    *,
    session_id: str,
    world_size: int | None = None,
    world_size_source: str | None = None,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    extra_lost: bool = False,
    on_finalized: Callable[[Path], None] | None = None,
) -> Path | None:
    """Write ``<run_dir>/aggregator/finalization_warning.json`` when something was lost, then call
    ``on_finalized(run_dir)`` (the diagnose hook).

    Returns the warning file's path, or None when nothing was lost. Failures to write the file or
    of ``on_finalized`` are printed as one ``[TraceML]`` line on stderr and never raised: shutdown
    must complete.
    """
    folder = Path(run_dir)
    report = loss_report(
        ingest,
        store,
        session_id=session_id,
        world_size=world_size,
        world_size_source=world_size_source,
        extra=extra,
        extra_lost=extra_lost,
    )
    written: Path | None = None
    if report is not None:
        target = folder / "aggregator" / WARNING_NAME
        try:
            write_json_atomic(target, report)
            written = target
        except (OSError, ValueError) as exc:
            print(f"[TraceML] aggregator: cannot write {target}: {exc}", file=sys.stderr, flush=True)
    if on_finalized is not None:
        try:
            on_finalized(folder)
        except Exception as exc:
            print(f"[TraceML] aggregator: finalization hook failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
    return written


def write_summary_after_crash(run_dir: str | Path, reason: str) -> Path | None:
    """Write ``<run_dir>/aggregator/final_summary.json`` for an aggregator that died before it could
    (DESIGN §3.2, §3.5): the rows it committed are diagnosed and the summary's telemetry status is
    ``"degraded"`` with ``reason`` as its detail, so no reader mistakes the partial verdict for a
    whole one. Called by the launcher once the aggregator process is gone.

    Returns the path, or None when it could not be written (one ``[TraceML]`` line on stderr; never
    raises: the launcher must still record the run's end).
    """
    from traceml_ai.diagnose.summary import write_final_summary  # numpy; only needed here

    try:
        return write_final_summary(run_dir, degraded=reason)
    except Exception as exc:
        print(f"[TraceML] cannot write the final summary of {run_dir}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return None

