"""The join of the performance facts onto the run table (issue 13 item 1; DESIGN §1).

The run layer imports nothing of ours, so it cannot read telemetry; :mod:`traceml_ai.diagnose.perf`
reads each captured run's ``aggregator/final_summary.json`` into ``perf.*`` facts (cached by file
stamps), and :func:`join_perf` hands them to the :class:`~traceml_ai.runs.store.RunStore`
(:meth:`~traceml_ai.runs.store.RunStore.set_perf`), after which the table model sorts, filters,
groups and exports ``perf.*`` columns like any other. Both the viewer (:class:`traceml_ai.ui.service.Viewer`,
after each poll) and ``traceml runs ls`` call it. Light: no web framework is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from traceml_ai.diagnose.perf import PENDING, PerfIndex, PerfValue, aggregator_finalizing, ended_facts
from traceml_ai.runs.aggregator_files import read_finalization_warning
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.store import RunStore


def losses_problem(agg_dir: str) -> str | None:
    """Why ``<agg_dir>/finalization_warning.json`` cannot be read (its reader's one line), or None:
    what :class:`~traceml_ai.diagnose.perf.PerfIndex` is given, so a run whose record of losses is
    damaged says so (review 13d: the table said ``partial`` with no word)."""
    problems: list[str] = []
    read_finalization_warning(agg_dir, problems)
    return problems[0] if problems else None


def perf_index() -> PerfIndex:
    """A :class:`~traceml_ai.diagnose.perf.PerfIndex` that also checks each lossy run's record of losses."""
    return PerfIndex(losses_problem=losses_problem)

RUNNING_STATUSES = ("running", "running?")
"""Display statuses of a run whose process may still write its final summary."""


def _shown(facts: Mapping[str, PerfValue], run: RunSummary | None) -> dict[str, PerfValue]:
    running = run is None or run.display_status in RUNNING_STATUSES
    if run is not None and not running and facts.get("telemetry") == PENDING["telemetry"]:
        # The training ended, its aggregator may still be diagnosing: pending, not "no summary", then.
        running = aggregator_finalizing(run.key)
    return ended_facts(facts, running)


def join_perf(
    store: RunStore, index: PerfIndex, *, force: bool = False, only: Iterable[str] | None = None
) -> list[str]:
    """Bring every run's :attr:`~traceml_ai.runs.model.RunSummary.perf` up to date from ``index``.

    A finished run whose final summary was read is not looked at again unless ``force`` (the
    viewer's Refresh); an unfinished or legacy captured run costs one or two ``stat`` calls.

    Args:
        only: check just these runs (the others keep their facts): a poll that left the store's
            membership alone passes the store's unfinished runs and ``index.pending()``, so it costs
            what may have changed, not one step per run (issue 16).

    Returns:
        The keys of the runs whose facts changed, then those of live captured runs whose telemetry
        database grew since the last call (the caller bumps their versions, so an open Performance
        view or inspector is pushed the news and reads the telemetry again).
    """
    if not force:
        # Right after a start from the run database: a finished run whose folder did not change and
        # whose cached facts are {} had no aggregator/ folder and has none now (creating one would
        # have moved the folder's stamp), so it is not looked at (100,000 runs: seconds of stat calls).
        unchanged = store.unchanged_since_seed()
        if unchanged:
            index.assume_not_captured(r.key for r in store.runs() if not r.perf and r.key in unchanged)
    grown: set[str] = set()
    if only is None:
        runs = store.runs()
        changed = index.update(((r.key, r.finished) for r in runs), force=force, grown=grown)
    else:
        found = [run for run in map(store.get, dict.fromkeys(only)) if run is not None]
        changed = index.update(((r.key, r.finished) for r in found), force=force, complete=False, grown=grown)
    keys = [key for key, facts in changed.items() if store.set_perf(key, _shown(dict(facts), store.get(key)))]
    # A run that stopped running without a final summary keeps the same facts in the index, but
    # "pending" turns into "no_summary" (checked for the index's pending folders only: few).
    for key in index.pending():
        run = store.get(key)
        if key not in changed and run is not None and run.perf and store.set_perf(key, _shown(index.facts(key), run)):
            keys.append(key)
    return keys + sorted(grown.difference(keys))
