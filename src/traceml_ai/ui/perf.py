"""The join of the performance facts onto the run table (issue 13 item 1; DESIGN §1).

The run layer imports nothing of ours, so it cannot read telemetry; :mod:`traceml_ai.diagnose.perf`
reads each captured run's ``aggregator/final_summary.json`` into ``perf.*`` facts (cached by file
stamps), and :func:`join_perf` hands them to the :class:`~traceml_ai.runs.store.RunStore`
(:meth:`~traceml_ai.runs.store.RunStore.set_perf`), after which the table model sorts, filters,
groups and exports ``perf.*`` columns like any other. Both the viewer (:class:`traceml_ai.ui.service.Viewer`,
after each poll) and ``traceml runs ls`` call it. Light: no web framework is imported here.
"""

from __future__ import annotations

from traceml_ai.diagnose.perf import PerfIndex
from traceml_ai.runs.store import RunStore


def join_perf(store: RunStore, index: PerfIndex, *, force: bool = False) -> list[str]:
    """Bring every run's :attr:`~traceml_ai.runs.model.RunSummary.perf` up to date from ``index``.

    A finished run whose final summary was read is not looked at again unless ``force`` (the
    viewer's Refresh); an unfinished or legacy captured run costs one or two ``stat`` calls.

    Returns:
        The keys of the runs whose facts changed, then those of live captured runs whose telemetry
        database grew since the last call (the caller bumps their versions, so an open Performance
        view or inspector is pushed the news and reads the telemetry again).
    """
    runs = store.runs()
    grown: set[str] = set()
    changed = index.update(((r.key, r.finished) for r in runs), force=force, grown=grown)
    keys = [key for key, facts in changed.items() if store.set_perf(key, dict(facts))]
    return keys + sorted(grown.difference(keys))
