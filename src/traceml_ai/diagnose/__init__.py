"""Diagnoses of a training run from its telemetry tables, the final summary, and run comparison
(DESIGN §3.5; rules, thresholds and file shapes in docs/diagnoses.md).

Reads ``<run>/aggregator/telemetry.sqlite`` read-only (also while the run is live) and imports
nothing of TraceML but :mod:`traceml_ai.telemetry` (DESIGN §1).

- :func:`diagnose` (database → :class:`Summary`), :func:`write_final_summary` (run folder →
  ``aggregator/final_summary.json``, atomically), :func:`load_final_summary`;
- :func:`compare` (two runs → a :class:`Comparison` with a verdict per metric).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# The names below are imported on first use (PEP 562), so that importing a light submodule
# (traceml_ai.diagnose.perf, for `traceml runs ls`) does not load numpy and the rules.
_HOME: dict[str, str] = {
    **dict.fromkeys(("Comparison", "MetricComparison", "compare"), "compare"),
    **dict.fromkeys(("Abstention", "Evidence", "Finding", "Severity"), "model"),
    **dict.fromkeys(("Telemetry", "read_telemetry"), "readers"),
    **dict.fromkeys(("SCHEMA_VERSION", "MemorySummary", "PhaseStats", "RankStats", "StepTimeSummary", "Summary",
                     "SummaryFileError", "SystemSummary", "diagnose", "final_summary_path", "load_final_summary",
                     "telemetry_path", "write_final_summary"), "summary"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


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
