"""The run catalog: run envelopes, attachment sidecars, sessions, discovery and the query store
(004 seed; DESIGN §1, §2.2, §5). Imports only ``traceml_ai.runs``.

Example::

    import traceml_ai.catalog

    store = traceml_ai.catalog.open(["./artifacts"])
    runs = store.list_runs()
    attachments = store.list_run_attachments(run_id="run-train-42")
    for w in store.warnings:
        print(w)
    alerts = store.query_events(traceml_ai.catalog.EventFilter(has_alert=True))
    issues = store.list_issues(kind="oom")
    peaks = store.summarize("peak_device_used_bytes", group_by="rank")
    around = store.correlate(at_ns=alerts[0].event["timestamp_ns"], scope="distributed")

    traceml_ai.catalog.write_envelope("./artifacts/train-42", "run-train-42", job_id="train-42",
                                      sessions=[{"session_id": "session-rank-0", "rank": 0}])
    traceml_ai.catalog.add_attachment("./artifacts/train-42", "rank0-profiler", kind="profiler_trace",
                                      title="Rank 0 profiler trace", path="traces/rank0.trace",
                                      session_id="session-rank-0")

The rows have the fields of Stormlog 0.4.3's rows (``as_dict()`` gives the same dicts, plus a few
of TraceML's own); real ``stormlog query`` reads the envelopes written here.
"""

from traceml_ai.catalog.analysis import ISSUE_KINDS, ISSUE_STATES, SUMMARY_GROUPS, SUMMARY_METRICS, utc
from traceml_ai.catalog.correlate import (
    DEFAULT_WINDOW_NS,
    EVIDENCE_KINDS,
    SCOPES,
    CorrelationEvidence,
    CorrelationFilter,
    CorrelationResult,
)
from traceml_ai.catalog.model import (
    AttachmentFilter,
    AttachmentRow,
    CatalogWarning,
    EventFilter,
    EventRow,
    ExternalAttachment,
    IssueFilter,
    IssueRow,
    OOMBundleFilter,
    OOMBundleRow,
    RunAttachmentFilter,
    RunFilter,
    RunRow,
    SessionFilter,
    SessionRow,
    SummaryRow,
)
from traceml_ai.catalog.store import CacheFolderError, CatalogStore, default_cache_dir, open_catalog
from traceml_ai.catalog.writer import EnvelopeError, add_attachment, write_envelope

open = open_catalog  # the seed's name: traceml_ai.catalog.open(paths)

__all__ = [
    "DEFAULT_WINDOW_NS",
    "EVIDENCE_KINDS",
    "ISSUE_KINDS",
    "ISSUE_STATES",
    "SCOPES",
    "SUMMARY_GROUPS",
    "SUMMARY_METRICS",
    "AttachmentFilter",
    "AttachmentRow",
    "CacheFolderError",
    "CatalogStore",
    "CatalogWarning",
    "CorrelationEvidence",
    "CorrelationFilter",
    "CorrelationResult",
    "EnvelopeError",
    "EventFilter",
    "EventRow",
    "ExternalAttachment",
    "IssueFilter",
    "IssueRow",
    "OOMBundleFilter",
    "OOMBundleRow",
    "RunAttachmentFilter",
    "RunFilter",
    "RunRow",
    "SessionFilter",
    "SessionRow",
    "SummaryRow",
    "add_attachment",
    "default_cache_dir",
    "open",
    "open_catalog",
    "utc",
    "write_envelope",
]
