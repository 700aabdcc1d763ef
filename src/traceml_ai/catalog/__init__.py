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

from typing import Literal

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

# stormlog.query's public names, where TraceML has the same thing (each has every field or method
# of Stormlog's; tests/catalog/test_differential_values.py checks):
AttachmentStorage = Literal["reference", "copy"]
"""An attachment's ``storage`` (``stormlog.query.AttachmentStorage``)."""
QueryStore = CatalogStore
"""``stormlog.query.QueryStore``: what :func:`open` returns."""
RunAttachmentRow = AttachmentRow
"""``stormlog.query.RunAttachmentRow``: an attachment row (plus ``declared_in``)."""
CatalogOOMBundle = OOMBundleRow
"""``stormlog.query.CatalogOOMBundle``: an OOM bundle with its ``manifest_path``."""

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
    "AttachmentStorage",
    "CacheFolderError",
    "CatalogOOMBundle",
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
    "QueryStore",
    "RunAttachmentFilter",
    "RunAttachmentRow",
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
