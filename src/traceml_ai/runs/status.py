"""Derived run status (003 seed, "Status and stale"). Stale is computed here and never written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceml_ai.runs.layout import STATUSES

if TYPE_CHECKING:
    from traceml_ai.runs.model import RunSummary


def display_status(
    status: str | None,
    *,
    legacy: bool,
    heartbeat_s: float | None,
    now: float,
    stale_after_seconds: float,
) -> str:
    """The status a reader shows.

    Args:
        status: run.json's ``status`` (None when run.json is missing or never parsed).
        legacy: True when the folder has no run.json.
        heartbeat_s: ``heartbeat_at`` as Unix seconds, or None.
        now: the current time, Unix seconds.
        stale_after_seconds: a running run whose heartbeat is older than this is ``stale``.

    Returns:
        ``legacy`` for a folder without run.json; ``running?`` for a running run without a
        heartbeat (its staleness cannot be judged); ``stale`` for a running run whose heartbeat is
        older than ``stale_after_seconds``; the written status for the others; ``unknown`` when
        run.json is unreadable or names a status outside running/completed/failed/killed.
    """
    if legacy:
        return "legacy"
    if status == "running":
        if heartbeat_s is None:
            return "running?"
        return "stale" if now - heartbeat_s > stale_after_seconds else "running"
    if status in STATUSES:
        return status
    return "unknown"


def run_duration(run: RunSummary, now: float) -> tuple[float | None, bool]:
    """The run's duration in seconds and whether it was derived (True) or written (False).

    run.json's ``duration_s`` when written. Otherwise, as the reference reader does, from
    ``started_at``: a finished run ends at ``ended_at``, a stale run at its last ``heartbeat_at``,
    a running run (``running`` or ``running?``) now. ``(None, False)`` when neither is known
    (no ``started_at``, a finished run without ``ended_at``, a legacy run). Never negative.

    Args:
        run: the run's summary (``display_status`` decides running against stale).
        now: the current time, Unix seconds.
    """
    if run.duration_s is not None:
        return run.duration_s, False
    from traceml_ai.runs.readers import parse_iso

    start = parse_iso(run.started_at)
    if start is None or run.legacy:
        return None, False
    if run.finished:
        end = parse_iso(run.ended_at)
    elif run.display_status == "stale":
        end = parse_iso(run.heartbeat_at)
    elif run.display_status in ("running", "running?"):
        end = now
    else:
        end = None
    if end is None:
        return None, False
    return max(0.0, end - start), True
