"""Derived run status (003 seed, "Status and stale"). Stale is computed here and never written."""

from __future__ import annotations

from traceml_ai.runs.layout import STATUSES


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
