"""What a reader knows about one run: :class:`RunSummary` and its parts.

Built by :mod:`traceml_ai.runs.store` from run.json, params.yaml, config.json, metrics.json and the
head of metrics.jsonl (003 seed, "Writing runs" §3-7), shared by the table model, the command line and
the web API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Scalar = str | int | float | bool | None
MetricValue = float | None
"""A metric value as read: a float (possibly NaN for a bare ``NaN`` token), or None for null."""


@dataclass(frozen=True, slots=True)
class BestValue:
    """``metrics.json`` ``best[<metric>]``: the best value so far and where it happened.

    Slotted: every cached run holds several (a ``__dict__`` each made them a third of a run's
    memory at 100,000 runs, issue 16)."""

    value: float | None
    step: int | None
    epoch: int | None
    mode: str | None  # "max" | "min" | None when the file did not say


@dataclass(slots=True)
class RunSummary:
    """One run as the table shows it. Built only from files; ``display_status`` is derived.

    Slotted: a viewer holds one per run (10,000 and more), and a slotted instance is a fifth of
    one with a ``__dict__`` when it is decoded from the run database.

    Attributes:
        key: the run folder's real path; unique across roots.
        id: the folder name (``<YYYYMMDD-HHMMSS>_<name>_<hex4>`` for runs TraceML writes).
        root: the runs root (real path) the run was found in.
        status: run.json's ``status`` ("running", "completed", "failed", "killed", another string as
            written), or None when there is no readable run.json.
        display_status: one of :data:`traceml_ai.runs.layout.DISPLAY_STATUSES`.
        started_at, ended_at, heartbeat_at: ISO-8601 UTC strings as written (or None).
        duration_s: seconds, from run.json (or None while running).
        params: flat params.yaml values (nested keys joined with dots, lists as compact JSON).
        start: first value of every metric found in the first 64 KB of metrics.jsonl.
        last, best, summary: from metrics.json.
        warnings: file problems of this run, one line each ("metrics.jsonl: 2 corrupt lines skipped").
        perf: the run's performance facts (``perf.<key>`` columns: step time, phase shares, verdict,
            ...; see :mod:`traceml_ai.diagnose.perf`), ``{}`` for a run that was not captured. The
            run layer never reads telemetry itself: the layer above fills this through
            :meth:`traceml_ai.runs.store.RunStore.set_perf`.
        run_json: run.json's whole object, filled only in the summary that
            :meth:`traceml_ai.runs.store.RunStore.details` returns (read on request); ``{}`` in the
            summaries a store keeps, whose typed fields (name, status, exit, ...) are all a table needs.
    """

    key: str
    id: str
    root: str
    name: str
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    status: str | None = None
    display_status: str = "unknown"
    legacy: bool = False
    schema_version: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    heartbeat_at: str | None = None
    duration_s: float | None = None
    step: int | None = None
    epoch: int | None = None
    exit: dict[str, Any] | None = None
    params: dict[str, Scalar] = field(default_factory=dict)
    start: dict[str, MetricValue] = field(default_factory=dict)
    last: dict[str, MetricValue] = field(default_factory=dict)
    best: dict[str, BestValue] = field(default_factory=dict)
    summary: dict[str, Scalar] = field(default_factory=dict)
    metric_names: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    perf: dict[str, Scalar] = field(default_factory=dict)
    run_json: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The run folder (same as :attr:`key`)."""
        return self.key

    @property
    def finished(self) -> bool:
        """True when run.json says completed, failed or killed: such a run's files no longer change."""
        return self.status in ("completed", "failed", "killed")

    @property
    def error(self) -> dict[str, Any] | None:
        """The failure of a failed run: ``{"type", "message", "traceback", "code", "signal"}`` or None.

        Both layouts of the 003 seed are accepted: flat ``exit.error_type``/``error_message``/``traceback``
        and a nested ``exit.error`` object. A traceback written as a list of lines (what
        ``traceback.format_exception`` returns) is joined into one text (:func:`join_traceback`).
        """
        if not isinstance(self.exit, dict):
            return None
        src: dict[str, Any] = self.exit
        nested = src.get("error")
        if isinstance(nested, dict):
            src = {**src, **{f"error_{k}" if k in ("type", "message") else k: v for k, v in nested.items()}}
        info = {
            "type": src.get("error_type"),
            "message": src.get("error_message"),
            "traceback": join_traceback(src.get("traceback")),
            "code": self.exit.get("code"),
            "signal": self.exit.get("signal"),
        }
        if info["type"] is None and info["message"] is None and info["traceback"] is None:
            return None
        return info


def join_traceback(value: Any) -> Any:
    """A traceback as one text: a list of lines (with or without their newlines, as
    ``traceback.format_exception`` or ``str.splitlines`` give them) is joined, one line each;
    any other value is returned as it is (None stays None).

    >>> join_traceback(["Traceback (most recent call last):\\n", '  File "x.py", line 1\\n', "OSError"])
    'Traceback (most recent call last):\\n  File "x.py", line 1\\nOSError'
    """
    if not isinstance(value, list):
        return value
    lines = [item if isinstance(item, str) else str(item) for item in value]
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")


def short_id(run_id: str) -> str:
    """The short form of a run id: its random tail (``…_e9df`` → ``e9df``), else its last 6
    characters (the page's ``shortId`` in ``web/src/columns.ts``): how two runs sharing a name are
    told apart (``baseline · e9df``)."""
    tail = run_id.rsplit("_", 1)[-1]
    return tail if tail != run_id and 0 < len(tail) <= 8 else run_id[-6:]
