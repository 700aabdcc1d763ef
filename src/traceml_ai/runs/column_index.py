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
from collections.abc import Mapping, Sequence
from itertools import compress
from operator import attrgetter, is_not
from typing import Any, Final

from traceml_ai.runs.model import BestValue, RunSummary
from traceml_ai.runs.table import ColumnFacts, column_facts, param_identity, param_spread

Shape = tuple[Any, ...]
"""The key names and value types of one run's values (see the module docstring); hashable."""
_VALUE = attrgetter("value")
_PERF = attrgetter("perf")
_Entry = tuple[RunSummary, Any, "Shape | None"]


def run_shape(run: RunSummary, perf: Mapping[str, Any] | None = None) -> Shape:
    """The shape of ``run`` (with ``perf`` for its perf facts when given): everything
    :func:`~traceml_ai.runs.table.column_facts` reads of it, as one flat tuple (each mapping as its
    length, its keys, then its values' types; a best value's type is that of its ``value``). One
    tuple, not one per part: this runs for every run once."""
    p, s, a, z, b = run.params, run.summary, run.start, run.last, run.best
    f = run.perf if perf is None else perf
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
        self._runs: dict[str, _Entry] = {}  # key → (summary, its perf, shape or None until needed)
        self._counts: dict[Shape, int] = {}
        self._stand_ins: dict[Shape, RunSummary] = {}
        self._values: dict[str, dict[Any, int]] = {}  # params key → value identity → runs holding it
        self._primed_first: dict[str, Shape] = {}  # from a saved state: first run of each shape → shape
        self._order: list[RunSummary] | None = None  # the runs of the last call, in order
        self._order_perf: list[Any] = []  # and their perf facts
        self._last: ColumnFacts | None = None  # the facts of the last call
        self._lock = threading.Lock()
        self.shapes_computed = 0
        """How many run shapes were computed (tests and the benchmark read it)."""

    def facts(self, runs: Sequence[RunSummary]) -> ColumnFacts:
        """The column facts of ``runs`` (equal to ``column_facts(runs)``). Costs one identity check
        per run plus the shape of each run that is new or changed since the last call."""
        with self._lock:
            return self._facts(runs)

    def _facts(self, runs: Sequence[RunSummary]) -> ColumnFacts:
        renewed = self._renew_in_place(runs)
        if renewed == 0 and self._last is not None:
            # The same runs with the same summaries and perf facts (a poll that changed a display
            # status, or only the catalog): the facts of the last call (issue 16: at 100,000 runs
            # a tenth of the first sort after a poll).
            return self._last
        if renewed is None:
            self._walk(runs)
        self._order, self._order_perf = list(runs), list(map(_PERF, runs))
        counts = self._counts
        for shape in [s for s, n in counts.items() if n <= 0]:
            del counts[shape]
            del self._stand_ins[shape]
        # One stand-in per shape, in the order the runs first have it: the params order of the
        # stand-ins is then that of all the runs.
        self._last = column_facts([self._stand_ins[shape] for shape in self._first_runs()],
                                  differing=self._differing(len(self._runs)))
        return self._last

    def _walk(self, runs: Sequence[RunSummary]) -> None:
        """Take ``runs`` as the runs of the index: one identity check per run."""
        known = self._runs
        seen: dict[str, _Entry] = {}
        for run in runs:
            entry = known.get(run.key)
            if entry is None or entry[0] is not run or entry[1] is not run.perf:
                entry = self._renew(run, entry)
            seen[run.key] = entry
        for key in known.keys() - seen.keys():
            self._counts[self._shape_of(known[key])] -= 1
            self._count_params(known[key][0], -1)
        self._runs = seen

    def _renew_in_place(self, runs: Sequence[RunSummary]) -> int | None:
        """The same runs as at the last call, in the same order, some of them replaced by a new
        summary or new perf facts: renew those alone (issue 16: after a poll that changed 10 of
        100,000 runs, the walk was a tenth of a second per table answer) and return how many. None,
        having changed nothing, when the runs are not those."""
        order = self._order
        if order is None or len(order) != len(runs):
            return None
        n = len(runs)
        moved = set(compress(range(n), map(is_not, runs, order)))
        moved.update(compress(range(n), map(is_not, map(_PERF, runs), self._order_perf)))
        if any(runs[i].key != order[i].key for i in moved):
            return None
        known = self._runs
        for i in sorted(moved):
            run = runs[i]
            known[run.key] = self._renew(run, known[run.key])
        return len(moved)

    def _renew(self, run: RunSummary, entry: _Entry | None) -> _Entry:
        """The entry of ``run``, new or with a new summary or perf facts; counts updated."""
        counts = self._counts
        shape = run_shape(run)
        self.shapes_computed += 1
        if shape not in self._stand_ins:
            self._stand_ins[shape] = _stand_in(run)
        counts[shape] = counts.get(shape, 0) + 1
        if entry is not None:
            counts[self._shape_of(entry)] -= 1
            if entry[0] is not run:
                self._count_params(entry[0], -1)
        if entry is None or entry[0] is not run:
            self._count_params(run, 1)
        return (run, run.perf, shape)

    def _first_runs(self) -> dict[Shape, str]:
        """Each shape in use → the key of the first run that has it, in the order of the runs. The
        walk stops once every shape is met; a run primed from a saved state (shape not computed)
        counts only when the state says it is the first of its shape, which holds while every such
        first run is still there unchanged (the runs keep their order: the store's); otherwise the
        shapes of the primed runs are computed."""
        runs, first_of = self._runs, self._primed_first
        trusted = all((entry := runs.get(key)) is not None and entry[2] is None for key in first_of)
        out: dict[Shape, str] = {}
        wanted = len(self._counts)
        for key, entry in runs.items():
            shape = entry[2]
            if shape is None:
                if trusted:
                    shape = first_of.get(key)
                    if shape is None:
                        continue
                else:
                    shape = self._shape_of(entry)
                    runs[key] = (entry[0], entry[1], shape)
            if shape not in out:
                out[shape] = key
                if len(out) == wanted:
                    break
        return out

    def _shape_of(self, entry: _Entry) -> Shape:
        if entry[2] is not None:
            return entry[2]
        self.shapes_computed += 1
        return run_shape(entry[0], entry[1])

    # -- a saved state (issue 16: a warm start at 100,000 runs) ------------------------------------

    def export_state(self, runs: Sequence[RunSummary]) -> bytes | None:
        """The index over ``runs`` as bytes for :meth:`primed` (kept beside the runs in the run
        database, so a warm start does not walk every params value again: 1 s at 100,000 runs).

        Holds the count of runs per shape and of runs per params value, not the runs: about 20
        bytes per distinct params value. None when a value cannot be saved (an integer beyond 64
        bits, a type other than text, number, bool or null): the next start then builds the index.
        """
        with self._lock:
            self._facts(runs)
            try:
                first = self._first_runs()
                state = [
                    _STATE_VERSION,
                    len(self._runs),
                    [[_encode_shape(shape), self._counts[shape], key] for shape, key in first.items()],
                    [[key, [[ident[0], ident[1], n] for ident, n in held.items()]]
                     for key, held in self._values.items()],
                ]
                import msgspec  # here, not at import: a small `runs ls` never saves or primes an index

                return msgspec.msgpack.encode(state)
            except (KeyError, TypeError, OverflowError, ValueError):
                return None

    @classmethod
    def primed(cls, runs: Sequence[RunSummary], state: bytes | None) -> ColumnIndex:
        """An index over ``runs`` from :meth:`export_state` of the same runs (the caller vouches
        for that: the run database holds both in one sealed file). A missing, damaged or foreign
        state gives an empty index, which builds itself on the first :meth:`facts`."""
        index = cls()
        if state is None:
            return index
        import msgspec

        try:
            version, n_runs, shapes, values = msgspec.msgpack.decode(state)
            if version != _STATE_VERSION or n_runs != len(runs):
                return index
            counts: dict[Shape, int] = {}
            first_of: dict[str, Shape] = {}
            for items, n, first_key in shapes:
                shape = _decode_shape(items)
                counts[shape] = int(n)
                first_of[str(first_key)] = shape
            held_by_key = {
                str(key): {_decode_ident(tag, value): int(n) for tag, value, n in held} for key, held in values
            }
            primed: dict[str, _Entry] = {run.key: (run, run.perf, None) for run in runs}
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, IndexError):
            return index
        if (len(primed) != len(runs) or sum(counts.values()) != len(runs) or min(counts.values(), default=1) < 1
                or len(first_of) != len(counts) or not all(key in primed for key in first_of)):
            return index
        index._runs = primed
        index._counts = counts
        index._stand_ins = {shape: _stand_in_of_shape(shape) for shape in counts}
        index._values = held_by_key
        index._primed_first = first_of
        return index

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

    def _differing(self, n_runs: int) -> dict[str, int]:
        """The params keys that differ → their :func:`~traceml_ai.runs.table.param_spread` (a key
        with one value differs when some runs lack it, unless that value is null: missing and null
        are the same)."""
        if n_runs < 2:
            return {}
        spreads = {key: param_spread(held, n_runs) for key, held in self._values.items()}
        return {key: spread for key, spread in spreads.items() if spread}


_NAN: Final = param_identity(float("nan"))


_STATE_VERSION: Final = 1
_TYPE_CODES: Final[dict[type, str]] = {str: "s", int: "i", float: "f", bool: "b", type(None): "n"}
_CODE_TYPES: Final = {code: kind for kind, code in _TYPE_CODES.items()}
_PLACEHOLDER: Final[dict[type, Any]] = {str: "", int: 0, float: 0.0, bool: False, type(None): None}
_PARTS: Final = 6  # params, summary, perf, start, last, best (run_shape's order)


def _encode_shape(shape: Shape) -> list[Any]:
    # Types as one-letter codes; lengths, keys and flags as they are (decoded by position).
    return [_TYPE_CODES[item] if isinstance(item, type) else item for item in shape]


def _decode_shape(items: list[Any]) -> Shape:
    out: list[Any] = []
    i = 0
    for _ in range(_PARTS):
        n = items[i]
        if type(n) is not int or n < 0:
            raise ValueError("bad shape")
        keys = items[i + 1 : i + 1 + n]
        if len(keys) != n or not all(type(k) is str for k in keys):
            raise ValueError("bad shape")
        out += [n, *keys, *(_CODE_TYPES[c] for c in items[i + 1 + n : i + 1 + 2 * n])]
        i += 1 + 2 * n
    flags = items[i:]
    if len(out) != i or len(flags) != 3 or not all(type(f) is bool for f in flags):
        raise ValueError("bad shape")
    return (*out, *flags)


def _decode_ident(tag: Any, value: Any) -> Any:
    if type(tag) is not str:
        raise ValueError("bad params value")
    return tag, value


def _stand_in_of_shape(shape: Shape) -> RunSummary:
    """A run of ``shape`` (placeholder values of its types): what column_facts reads is the shape."""
    parts: list[dict[str, Any]] = []
    i = 0
    for _ in range(_PARTS):
        n = shape[i]
        keys, kinds = shape[i + 1 : i + 1 + n], shape[i + 1 + n : i + 1 + 2 * n]
        parts.append({key: _PLACEHOLDER[kind] for key, kind in zip(keys, kinds, strict=True)})
        i += 1 + 2 * n
    no_duration, no_step, no_epoch = shape[i:]
    params, summary, perf, start, last, best = parts
    return RunSummary(
        key="", id="", root="", name="", params=params, summary=summary, perf=perf, start=start, last=last,
        best={key: BestValue(value, None, None, None) for key, value in best.items()},
        duration_s=None if no_duration else 0.0, step=None if no_step else 0, epoch=None if no_epoch else 0,
    )


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
