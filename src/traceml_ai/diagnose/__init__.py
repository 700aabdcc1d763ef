"""Diagnoses of a training run from its telemetry tables, the final summary, and run comparison
(DESIGN §3.5; rules, thresholds and file shapes in docs/diagnoses.md).

Reads ``<run>/aggregator/telemetry.sqlite`` read-only (also while the run is live) and imports
nothing of TraceML but :mod:`traceml_ai.telemetry` (DESIGN §1).

- :func:`diagnose` (database → :class:`Summary`), :func:`write_final_summary` (run folder →
  ``aggregator/final_summary.json``, atomically), :func:`load_final_summary`;
- :func:`compare` (two runs → a :class:`Comparison` with a verdict per metric).
"""

from __future__ import annotations

from traceml_ai.diagnose.compare import Comparison, MetricComparison, compare
from traceml_ai.diagnose.model import Abstention, Evidence, Finding, Severity
from traceml_ai.diagnose.readers import Telemetry, read_telemetry
from traceml_ai.diagnose.summary import (
    SCHEMA_VERSION,
    MemorySummary,
    PhaseStats,
    RankStats,
    StepTimeSummary,
    Summary,
    SummaryFileError,
    SystemSummary,
    diagnose,
    final_summary_path,
    load_final_summary,
    telemetry_path,
    write_final_summary,
)

__all__ = [
    "SCHEMA_VERSION",
    "Abstention",
    "Comparison",
    "Evidence",
    "Finding",
    "MemorySummary",
    "MetricComparison",
    "PhaseStats",
    "RankStats",
    "Severity",
    "StepTimeSummary",
    "Summary",
    "SummaryFileError",
    "SystemSummary",
    "Telemetry",
    "compare",
    "diagnose",
    "final_summary_path",
    "load_final_summary",
    "read_telemetry",
    "telemetry_path",
    "write_final_summary",
]
