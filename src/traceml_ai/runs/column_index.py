"""The table's column facts over a changing set of runs, re-computed only for runs that changed
(issue 16 items 3-4; the facts themselves: :func:`traceml_ai.runs.table.column_facts`).

:func:`~traceml_ai.runs.table.column_facts` looks at every value of every run: 0.16 s for 10,000
runs, seconds for 100,000, and the viewer needs it again after every poll that changed one run.
What it reports depends only on each run's *shape*: which keys its params, start, last, best,
summary and perf hold, the type of each value, and whether duration, step and epoch are set. Runs
of one sweep share a handful of shapes. :class:`ColumnIndex` keeps the shape of every run (computed
when the run's summary object or its perf facts are new), counts the runs per shape, and answers
with ``column_facts`` over one stand-in run per shape in use: the same answer as over all runs.

One fact is not in the shape: which params differ between the runs (the default columns show
them, issue 15 item 20), since the runs of a sweep share one shape and differ in values only. For
those the index counts, per params key, the runs holding each value (as
:func:`~traceml_ai.runs.table.param_identity` tells values apart), updated for the changed runs
only: a key differs when two values are counted, or one value and runs that lack the key.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Final

from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.table import ColumnFacts, column_facts, param_identity

Shape = tuple[Any, ...]
"""The key names and value types of one run's values (see the module docstring); hashable."""
_VALUE = attrgetter("value")


def run_shape(run: RunSummary) -> Shape:
    """The shape of ``run``: everything :func:`~traceml_ai.runs.table.column_facts` reads of it, as
    one flat tuple (each mapping as its length, its keys, then its values' types; a best value's
    type is that of its ``value``). One tuple, not one per part: this runs for every run once."""
    p, s, f, a, z, b = run.params, run.summary, run.perf, run.start, run.last, run.best
    return (
        len(p), *p, *map(type, p.values()),
        len(s), *s, *map(type, s.values()),
        len(f), *f, *map(type, f.values()),
        len(a), *a, *map(type, a.values()),
        len(z), *z, *map(type, z.values()),
        len(b), *b, *map(type, map(_VALUE, b.values())),
        run.duration_s is None, run.step is None, run.epoch is None,
    )


def _stand_in(run: RunSummary) -> RunSummary:
    # The store never changes a summary's dicts in place (perf is replaced whole), so sharing them
    # keeps the stand-in's shape fixed while it stands for its runs.
    return RunSummary(
        key="", id="", root="", name="",
        params=run.params, summary=run.summary, perf=run.perf, start=run.start, last=run.last, best=run.best,
        duration_s=run.duration_s, step=run.step, epoch=run.epoch,
    )


class ColumnIndex:
    """:func:`~traceml_ai.runs.table.column_facts` of a changing list of runs, cheap to ask again.

    Thread-safe: one call at a time (web handlers run in threads).

    Example:
        >>> index = ColumnIndex()                  # doctest: +SKIP
        >>> index.facts(store.runs()).default      # doctest: +SKIP
        ['name', 'status', 'group', 'tags', 'started', 'duration_s', 'run.best.val/auc']
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[RunSummary, Any, Shape]] = {}  # key → (summary, its perf, shape)
        self._counts: dict[Shape, int] = {}
        self._stand_ins: dict[Shape, RunSummary] = {}
        self._values: dict[str, dict[Any, int]] = {}  # params key → value identity → runs holding it
        self._lock = threading.Lock()
        self.shapes_computed = 0
        """How many run shapes were computed (tests and the benchmark read it)."""

    def facts(self, runs: Sequence[RunSummary]) -> ColumnFacts:
        """The column facts of ``runs`` (equal to ``column_facts(runs)``). Costs one identity check
        per run plus the shape of each run that is new or changed since the last call."""
        with self._lock:
            return self._facts(runs)

    def _facts(self, runs: Sequence[RunSummary]) -> ColumnFacts:
        known = self._runs
        seen: dict[str, tuple[RunSummary, Any, Shape]] = {}
        counts = self._counts
        for run in runs:
            entry = known.get(run.key)
            if entry is None or entry[0] is not run or entry[1] is not run.perf:
                shape = run_shape(run)
                self.shapes_computed += 1
                if shape not in self._stand_ins:
                    self._stand_ins[shape] = _stand_in(run)
                counts[shape] = counts.get(shape, 0) + 1
                if entry is not None:
                    counts[entry[2]] -= 1
                    if entry[0] is not run:
                        self._count_params(entry[0], -1)
                if entry is None or entry[0] is not run:
                    self._count_params(run, 1)
                entry = (run, run.perf, shape)
            seen[run.key] = entry
        for key in known.keys() - seen.keys():
            counts[known[key][2]] -= 1
            self._count_params(known[key][0], -1)
        self._runs = seen
        for shape in [s for s, n in counts.items() if n <= 0]:
            del counts[shape]
            del self._stand_ins[shape]
        # One stand-in per shape, in the order the runs first have it: the params order of the
        # stand-ins is then that of all the runs (the walk stops once every shape in use is met).
        used: dict[Shape, None] = {}
        for entry in seen.values():
            if entry[2] not in used:
                used[entry[2]] = None
                if len(used) == len(counts):
                    break
        return column_facts([self._stand_ins[shape] for shape in used], differing=self._differing(len(seen)))

    def _count_params(self, run: RunSummary, step: int) -> None:
        values = self._values
        for key, value in run.params.items():
            kind = type(value)
            # The common types inline (as param_identity answers for them): this runs for every
            # params value of every run once.
            if kind is str:
                ident: Any = ("text", value)
            elif kind is int:
                ident = ("number", value)
            elif kind is float:
                ident = ("number", value) if value == value else _NAN
            else:
                ident = _hashable(param_identity(value))
            held = values.get(key)
            if held is None:
                held = values[key] = {}
            n = held.get(ident, 0) + step
            if n > 0:
                held[ident] = n
            else:
                held.pop(ident, None)
                if not held:
                    del values[key]

    def _differing(self, n_runs: int) -> set[str]:
        if n_runs < 2:
            return set()
        out = set()
        for key, held in self._values.items():
            if len(held) > 1:
                out.add(key)
                continue
            # One value: the key differs when some runs lack it, unless that value is null
            # (missing and null are the same).
            ((ident, n),) = held.items()
            if n < n_runs and ident != _NULL:
                out.add(key)
        return out


_NULL: Final = param_identity(None)
_NAN: Final = param_identity(float("nan"))


def _hashable(ident: tuple[str, Any]) -> Any:
    # A params value is a scalar once read; should a list or a mapping get through, its JSON-ish
    # text tells it apart instead.
    try:
        hash(ident)
    except TypeError:
        return (ident[0], repr(ident[1]))
    return ident


MAX_DEFAULT_VALUE_COLUMNS: Final = 24
"""At most this many ``run.best.*`` / ``summary.*`` columns are shown before the user picks (issue
16: 2,000 distinct metric keys must not make 2,000 default columns); the others stay available in
the column chooser."""
_VALUE_PREFIXES: Final = ("run.best.", "summary.")


def bounded_default(default: Sequence[str], limit: int = MAX_DEFAULT_VALUE_COLUMNS) -> list[str]:
    """``default`` (:attr:`ColumnFacts.default`, in its order) with at most ``limit`` logged-value
    columns (``run.best.*`` first, then ``summary.*``, as that order has them); the lead and
    ``perf.*`` columns are all kept."""
    out: list[str] = []
    values = 0
    for column in default:
        if column.startswith(_VALUE_PREFIXES):
            if values >= limit:
                continue
            values += 1
        out.append(column)
    return out


__all__ = ["MAX_DEFAULT_VALUE_COLUMNS", "ColumnIndex", "Shape", "bounded_default", "run_shape"]
