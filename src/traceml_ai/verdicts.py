"""The fixed words of a run's performance verdict (issue 13; DESIGN §1): the finding kinds (one per
diagnosis rule), the verdicts, the severities and the telemetry states of the ``perf.*`` columns.

A leaf that imports nothing: :mod:`traceml_ai.diagnose` names its rules and verdicts with these
(``rules.RULES`` is built from :data:`RULE_KINDS`), and :mod:`traceml_ai.runs.filters`, which may
import nothing above the run layer, refuses a filter word outside them (``perf.verdict=inputbound``
is an error naming the verdicts, as ``status=faild`` is, never a filter that silently matches no
run). The words and what they mean: docs/viewer-api.md, "Performance columns"; docs/diagnoses.md.
"""

from __future__ import annotations

from typing import Final

RULE_KINDS: Final = (
    "input_bound", "h2d_bound", "optimizer_bound", "compute_bound", "straggler",
    "memory_pressure", "memory_creep", "low_gpu_util", "cpu_pressure", "ram_pressure",
)
"""Every diagnosis rule by name, in the order they run; a finding's ``kind`` is its rule's name."""

STEP_RULES: Final = ("input_bound", "h2d_bound", "optimizer_bound", "compute_bound", "straggler")
"""The rules that judge step time: a run is ``healthy`` only when one of them judged."""

VERDICT_KINDS: Final = (*RULE_KINDS, "healthy", "not_judged")
"""Every value of ``perf.verdict``: the top warning or critical finding's kind, ``healthy`` (a
step-time rule judged and found nothing worse than info) or ``not_judged`` (none could)."""

SEVERITIES: Final = ("info", "warning", "critical")
"""A finding's severity, least severe first (``perf.severity``)."""

TELEMETRY_STATES: Final = ("ok", "degraded", "partial", "pending", "no_summary")
"""Every value of ``perf.telemetry``. ``ok`` / ``degraded`` / ``partial`` grade the telemetry a
final summary was judged on (issue 13's three); ``pending`` and ``no_summary`` say there is no final
summary to grade: yet (the run or its aggregator is still going) or ever (it ended without one)."""
