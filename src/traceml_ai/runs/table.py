"""The run table: columns, cells, sort, grouping, CSV and JSON rows (003 seed, "The runs table",
"Exporting the table for an agent"; DESIGN §4).

Pure functions over ``list[RunSummary]``, shared by ``traceml runs ls``, the web API and the tests.
A column is named by a string:

- fixed columns: ``id, name, status, group, tags, path, started, ended, heartbeat, duration_s, step,
  epoch, notes, legacy, warnings`` (see :data:`FIXED_COLUMNS`);
- logged values, named by kind: ``config.<key>`` (params.yaml), ``run.start.<metric>``,
  ``run.last.<metric>``, ``run.best.<metric>`` (the metric history) and ``summary.<key>``;
- performance facts of captured runs: ``perf.<key>`` (``perf.verdict``, ``perf.step_ms.p50``,
  ``perf.share.dataloader``, ...: :attr:`RunSummary.perf`, which the layer above fills from the
  run's ``aggregator/final_summary.json``; list and units in docs/viewer-api.md).

The part after the prefix is taken verbatim, so metric names may hold ``/``, ``.``, spaces and
non-ASCII letters (``run.best.val/auc``, ``run.last.my metric``, ``summary.genauigkeit/über``).

The filter language is in :mod:`traceml_ai.runs.filters`.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import operator
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, islice
from operator import attrgetter, itemgetter
from typing import Any, Final, TextIO

from traceml_ai.runs.model import RunSummary, Scalar
from traceml_ai.runs.status import run_duration

FIXED_COLUMNS: Final = (
    "id",
    "name",
    "status",
    "group",
    "tags",
    "path",
    "started",
    "ended",
    "heartbeat",
    "duration_s",
    "step",
    "epoch",
    "notes",
    "legacy",
    "warnings",
)
"""Columns every run has. ``status`` is the display status (it shows ``stale``), ``started``/``ended``/
``heartbeat`` are run.json's ISO-8601 UTC strings, ``warnings`` is the number of file warnings.
``duration_s`` is run.json's, or derived from the times when it is not written (running: now −
``started_at``; stale: ``heartbeat_at`` − ``started_at``; finished: ``ended_at`` − ``started_at``;
:func:`traceml_ai.runs.status.run_duration`)."""

KIND_PREFIXES: Final = ("config.", "run.start.", "run.last.", "run.best.", "summary.", "perf.")
"""Prefixes of logged-value columns; the rest of such a column name is the key, verbatim."""

CSV_LEAD_COLUMNS: Final = ("id", "name", "status", "group", "tags", "path")
"""The first six columns of every CSV export (003 seed, "Exporting the table for an agent")."""

NONE_GROUP_LABEL: Final = "(none)"
"""Label of the group of runs without a value (003 seed, "Decisions made where the spec was ambiguous")."""

_DEFAULT_LEAD: Final = ("name", "status", "group", "tags", "started", "duration_s")
MAX_DEFAULT_PARAMS: Final = 6
"""At most this many params that differ between the runs are shown by default."""
PERF_COLUMNS: Final = (
    "telemetry", "verdict", "severity", "findings", "steps", "ranks", "step_ms.p50", "step_ms.p95",
    "steps_per_s", "share.dataloader", "share.h2d", "share.forward", "share.backward", "share.optimizer",
    "share.other", "skew_pct", "worst_rank", "straggler", "peak_mem.gpu", "peak_mem.host", "gpu_util_pct",
)
"""The keys of every ``perf.*`` column, in the column chooser's order (the facts
:func:`traceml_ai.diagnose.perf.perf_facts` makes: this layer may not import it, and
tests/diagnose/test_perf.py checks the two lists agree; units in docs/viewer-api.md). Any other
``perf.<key>`` is an unknown column."""
PERF_DEFAULT: Final = ("verdict", "step_ms.p50", "share.dataloader")
"""The ``perf.*`` columns shown by default when any run was captured."""
PERF_TEXT: Final = ("telemetry", "verdict", "severity", "straggler")
"""The ``perf.*`` columns of words; every other one holds numbers (:data:`PERF_NUMERIC`)."""
PERF_NUMERIC: Final = tuple(k for k in PERF_COLUMNS if k not in PERF_TEXT)
"""The ``perf.*`` columns of numbers (or missing), numeric whether or not a run has a value."""


class ColumnError(ValueError):
    """A column name that is neither fixed nor starts with a known kind prefix (a user error)."""


# -- columns ---------------------------------------------------------------------------------------

_PERF_SET: Final = frozenset(PERF_COLUMNS)


_PERF_DEVICE_WORDS: Final = {"cpu": "host", "ram": "host", "rss": "host", "system": "host", "cuda": "gpu",
                              "device": "gpu", "vram": "gpu"}
"""Other words for the two device kinds of ``perf.peak_mem.*``: ``perf.peak_mem.cpu`` means the
host's memory, not the spelling-nearest ``.gpu`` (review 13e)."""


def _unknown_perf(column: str, key: str) -> str:
    head, _, tail = key.rpartition(".")
    kind = _PERF_DEVICE_WORDS.get(tail.lower()) if head == "peak_mem" else None
    hint = [f"peak_mem.{kind}"] if kind else difflib.get_close_matches(key, PERF_COLUMNS, n=1)
    fix = f"did you mean 'perf.{hint[0]}'? " if hint else ""
    return f"unknown column {column!r}; {fix}the perf.* columns are: {', '.join('perf.' + k for k in PERF_COLUMNS)}"



def split_column(column: str) -> tuple[str, str]:
    """Split a column name into ``(kind, key)``.

    ``kind`` is ``"fixed"`` (key = the column itself), ``"config"``, ``"run.start"``, ``"run.last"``,
    ``"run.best"``, ``"summary"`` or ``"perf"``; ``key`` is the rest of the name, verbatim.

    >>> split_column("run.best.val/auc")
    ('run.best', 'val/auc')

    Raises:
        ColumnError: the name is not a fixed column and has no kind prefix, nothing follows the
            prefix, or a ``perf.`` key is not one of :data:`PERF_COLUMNS` (the performance facts are
            a fixed set, unlike logged metrics). The message names the column and suggests the
            closest valid name.
    """
    if column in FIXED_COLUMNS:
        return "fixed", column
    for prefix in KIND_PREFIXES:
        if column.startswith(prefix):
            key = column[len(prefix) :]
            if not key:
                example = "step_ms.p50" if prefix == "perf." else "val/auc"
                raise ColumnError(f"column {column!r} names no key; write e.g. {prefix}{example}")
            if prefix == "perf." and key not in _PERF_SET:
                raise ColumnError(_unknown_perf(column, key))
            return prefix[:-1], key
    hint = difflib.get_close_matches(column, FIXED_COLUMNS, n=1)
    fix = f"did you mean {hint[0]!r}? " if hint else ""
    raise ColumnError(
        f"unknown column {column!r}; {fix}use a fixed column ({', '.join(FIXED_COLUMNS)}) or "
        "config.<key>, run.start.<metric>, run.last.<metric>, run.best.<metric>, summary.<key>, perf.<key>"
    )


def validate_column(column: str) -> str:
    """Return ``column`` unchanged when it is a valid column name; raise :class:`ColumnError` if not."""
    split_column(column)
    return column


def cell(run: RunSummary, column: str) -> Scalar:
    """The value of one column for one run, or None when the run has no value there.

    Numbers stay numbers (a metric may be NaN), ``legacy`` is a bool, ``warnings`` the number of
    warnings, ``tags`` the tags joined with ``;`` (as in the CSV export), ``status`` the display
    status. An empty group or notes is None. ``run.best.<m>`` is :attr:`BestValue.value`.

    Raises:
        ColumnError: ``column`` is not a valid column name (see :func:`split_column`).
    """
    kind, key = split_column(column)
    if kind == "fixed":
        return _fixed_cell(run, key)
    if kind == "config":
        return run.params.get(key)
    if kind == "run.start":
        return run.start.get(key)
    if kind == "run.last":
        return run.last.get(key)
    if kind == "run.best":
        best = run.best.get(key)
        return None if best is None else best.value
    if kind == "perf":
        return run.perf.get(key)
    return run.summary.get(key)


def cell_getter(column: str) -> Callable[[RunSummary], Scalar]:
    """A function that returns :func:`cell` of ``column`` for a run, the name parsed once (for loops
    over many runs: sorting and grouping 10,000 runs in the viewer).

    Raises:
        ColumnError: ``column`` is not a valid column name (see :func:`split_column`).
    """
    kind, key = split_column(column)
    if kind == "fixed":
        fixed = _FIXED_GETTERS.get(key)
        return fixed if fixed is not None else (lambda run: _fixed_cell(run, key))
    if kind == "config":
        return lambda run: run.params.get(key)
    if kind == "run.start":
        return lambda run: run.start.get(key)
    if kind == "run.last":
        return lambda run: run.last.get(key)
    if kind == "run.best":

        def best_value(run: RunSummary) -> Scalar:
            best = run.best.get(key)
            return None if best is None else best.value

        return best_value
    if kind == "perf":
        return lambda run: run.perf.get(key)
    return lambda run: run.summary.get(key)


_FIXED_GETTERS: Final[dict[str, Callable[[RunSummary], Scalar]]] = {
    "id": attrgetter("id"),
    "name": attrgetter("name"),
    "status": attrgetter("display_status"),
    "path": attrgetter("key"),
    "started": attrgetter("started_at"),
    "ended": attrgetter("ended_at"),
    "heartbeat": attrgetter("heartbeat_at"),
    "step": attrgetter("step"),
    "epoch": attrgetter("epoch"),
    "legacy": attrgetter("legacy"),
}
"""Fixed columns that are a summary field as it is (the others go through :func:`_fixed_cell`)."""


def _fixed_cell(run: RunSummary, column: str) -> Scalar:
    if column == "id":
        return run.id
    if column == "name":
        return run.name
    if column == "status":
        return run.display_status
    if column == "group":
        return run.group or None
    if column == "tags":
        return ";".join(run.tags) if run.tags else None
    if column == "path":
        return run.path
    if column == "started":
        return run.started_at
    if column == "ended":
        return run.ended_at
    if column == "heartbeat":
        return run.heartbeat_at
    if column == "duration_s":
        return run_duration(run, time.time())[0]
    if column == "step":
        return run.step
    if column == "epoch":
        return run.epoch
    if column == "notes":
        return run.notes or None
    if column == "legacy":
        return run.legacy
    return len(run.warnings)  # "warnings"


def is_number(value: object) -> bool:
    """True for int and float (NaN included); False for bool, which is not a number here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_nan(value: object) -> bool:
    """True when ``value`` is a float NaN."""
    return isinstance(value, float) and math.isnan(value)


def format_cell(value: Scalar) -> str:
    """A cell as text, exactly as the CSV export writes it and as text filters and search see it.

    None → ``""``; True/False → ``true``/``false``; NaN → ``NaN``; other floats → ``repr`` (no
    rounding: ``0.0003``, ``1e-05``, ``3600.0``, ``inf``); ints and strings as they are.
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else repr(value)
    return str(value)


@dataclass(frozen=True)
class ColumnFacts:
    """What the web table needs to know about the columns of a set of runs, from one pass.

    Attributes:
        available: as :func:`available_columns`.
        default: as :func:`default_columns`.
        numeric: as :func:`numeric_columns`.
        differing: the params keys whose values differ between the runs, in params order (the
            keys of :func:`differing_config_keys` of the runs in the order given).
    """

    available: list[str]
    default: list[str]
    numeric: set[str]
    differing: list[str] = field(default_factory=list)


def column_facts(runs: Iterable[RunSummary], differing: Mapping[str, int] | None = None) -> ColumnFacts:
    """:func:`available_columns`, :func:`default_columns` and :func:`numeric_columns` in one pass
    over the runs' values (the web table asks for all three after every change).

    ``differing``: the params keys known to differ between the runs the answer is for, each with
    its :func:`param_spread`, when ``runs`` stand in for them
    (:class:`~traceml_ai.runs.column_index.ColumnIndex` passes one run per shape, whose values say
    nothing about the others'); None finds them in ``runs`` (:func:`param_spreads`). The default
    columns take the :data:`MAX_DEFAULT_PARAMS` of widest spread (:func:`default_params`).
    """
    config, config_numeric = _key_facts(map(attrgetter("params"), items := list(runs)), typed=True)
    summary, summary_numeric = _key_facts(map(attrgetter("summary"), items), typed=True)
    perf, perf_numeric = _key_facts(map(attrgetter("perf"), items), typed=True)
    # Metric values are numbers or null (readers keep nothing else), and a best value is a BestValue.
    start, start_numeric = _key_facts(map(attrgetter("start"), items), typed=False)
    last, last_numeric = _key_facts(map(attrgetter("last"), items), typed=False)
    best: set[str] = set()
    best_numeric: set[str] = set()
    for values in map(attrgetter("best"), items):
        best.update(values)
        for key, value in values.items():
            if value.value is not None:
                best_numeric.add(key)
    numeric = {"warnings"}
    numeric.update(f"config.{k}" for k in config_numeric)
    numeric.update(f"run.start.{k}" for k in start_numeric)
    numeric.update(f"run.last.{k}" for k in last_numeric)
    numeric.update(f"run.best.{k}" for k in best_numeric)
    numeric.update(f"summary.{k}" for k in summary_numeric)
    if perf:
        # A captured run: every perf.* column is offered, also where no run has a value (issue 13
        # review: perf.share.h2d and the GPU columns vanished on a CPU-only workspace), empty (`–`).
        perf_numeric |= set(PERF_NUMERIC)
        perf |= set(PERF_COLUMNS)
    numeric.update(f"perf.{k}" for k in perf_numeric)
    for column in ("step", "epoch"):
        if any(map(_not_none, map(attrgetter(column), items))):
            numeric.add(column)
    now = time.time()
    if any(run_duration(run, now)[0] is not None for run in items):
        numeric.add("duration_s")
    available = [
        *FIXED_COLUMNS,
        *(f"config.{k}" for k in sorted(config)),
        *(f"run.best.{k}" for k in sorted(best)),
        *(f"run.last.{k}" for k in sorted(last)),
        *(f"run.start.{k}" for k in sorted(start)),
        *(f"summary.{k}" for k in sorted(summary)),
        *(f"perf.{k}" for k in sorted(perf)),
    ]
    order = _params_order(items)
    spreads = param_spreads(items) if differing is None else differing
    params = default_params(order, spreads)
    default = [*_DEFAULT_LEAD, *(f"perf.{k}" for k in PERF_DEFAULT if k in perf),
               *(f"config.{k}" for k in params),
               *(f"run.best.{k}" for k in sorted(best)), *(f"summary.{k}" for k in sorted(summary))]
    return ColumnFacts(available, default, numeric, [k for k in order if spreads.get(k, 0) > 0])


def _not_none(value: object) -> bool:
    return value is not None


def _key_facts(maps: Iterable[Mapping[str, Any]], *, typed: bool) -> tuple[set[str], set[str]]:
    """The keys of ``maps``, and those whose non-null values are all numbers (at least one).
    ``typed=False`` is for metric values, which are numbers or null and nothing else."""
    keys: set[str] = set()
    numbers: set[str] = set()
    text: set[str] = set()
    for values in maps:
        keys.update(values)
        if typed:
            for key, value in values.items():
                kind = type(value)
                if kind is float or kind is int:  # exact types: bool is not a number
                    numbers.add(key)
                elif value is not None:
                    text.add(key)
        else:
            for key, value in values.items():
                if value is not None:
                    numbers.add(key)
    return keys, numbers - text


def available_columns(runs: Iterable[RunSummary]) -> list[str]:
    """Every column the runs have a value name for: the fixed columns, then ``config.*``,
    ``run.best.*``, ``run.last.*``, ``run.start.*``, ``summary.*`` and ``perf.*``, each sorted by key.

    A logged-value column is listed when at least one run has the key (even with a null value).
    """
    return column_facts(runs).available


def default_columns(runs: Iterable[RunSummary]) -> list[str]:
    """The columns shown before the user picks: ``name, status, group, tags, started, duration_s``,
    then ``perf.verdict``, ``perf.step_ms.p50`` and ``perf.share.dataloader`` when a run was
    captured, then the params that differ between the runs (``config.*``, the first six in the runs'
    params order, as :func:`differing_config_keys` finds them), then every ``run.best.*`` and ``summary.*`` column
    present, sorted by key (003 seed: "the table shows every best and summary metric as a column by
    default"; the reference reader also shows the differing params: users compare sweeps by them)."""
    return column_facts(runs).default


def column_is_numeric(runs: Iterable[RunSummary], column: str) -> bool:
    """True when every present, non-null value of ``column`` is a number (bool is not; NaN is).

    False when no run has a value: with nothing to go by the column is treated as text. Decides
    whether a bare number in a filter is an equality (numeric) or a substring (text) match
    (003 seed, "Decisions made where the spec was ambiguous").

    Raises:
        ColumnError: ``column`` is not a valid column name.
    """
    get = cell_getter(column)
    seen = False
    for run in runs:
        value = get(run)
        if value is None:
            continue
        if not is_number(value):
            return False
        seen = True
    return seen


def numeric_columns(runs: Iterable[RunSummary]) -> set[str]:
    """Every column for which :func:`column_is_numeric` is true, found in one pass over the runs'
    values (the web table asks for all of them at once)."""
    return column_facts(runs).numeric


# -- sort ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SortKey:
    """One sort key: a column and its direction. Several keys sort like shift-click: the later ones
    only break ties of the earlier ones.

    >>> SortKey("run.best.val/auc", descending=True)
    SortKey(column='run.best.val/auc', descending=True)
    """

    column: str
    descending: bool = False


def parse_sort_arg(arg: str) -> SortKey:
    """Parse a ``--sort`` argument: ``COLUMN``, ``+COLUMN``, ``-COLUMN``, ``COLUMN:asc`` or
    ``COLUMN:desc`` (e.g. ``-run.best.val/auc`` or ``run.best.val/auc:desc``).

    Raises:
        ColumnError: the column name is invalid (one line naming it and the fix).
    """
    text = arg.strip()
    descending = False
    head, sep, tail = text.rpartition(":")
    if sep and tail.strip().lower() in ("asc", "desc"):
        text, descending = head.strip(), tail.strip().lower() == "desc"
    elif text.startswith("-"):
        text, descending = text[1:].strip(), True
    elif text.startswith("+"):
        text = text[1:].strip()
    if not text:
        raise ColumnError(f"sort {arg!r} names no column; write e.g. -run.best.val/auc or name:asc")
    return SortKey(validate_column(text), descending)


# Sort classes: numbers, then text, then NaN, then missing (the last two in either direction).
_NUMBER, _TEXT, _NAN, _MISSING = 0, 1, 2, 3

_DIGIT_RUNS: Final = re.compile(r"[0-9]+")


def _encode_digits(match: re.Match[str]) -> str:
    digits = match.group().lstrip("0")
    # "0" keeps the run where a digit sorts among other characters; the length (as one character)
    # then orders runs numerically, and equal lengths compare digit by digit.
    return "0" + chr(0x30 + len(digits)) + digits


_NAME_KEYS: Final = 1 << 17


@lru_cache(maxsize=_NAME_KEYS)  # names repeat in every sort of the same table: 100,000 runs fit
def natural_key(text: str) -> tuple[str, str]:
    """The sort key of a text value: case-insensitive, runs of digits compared as numbers
    (003 seed, "The runs table": ``run-1, run-2, Run-3, run-10``).

    The first part is the case-folded text with each digit run written as ``0``, its length as one
    character, then its digits without leading zeros: plain string comparison of that orders numbers
    by value for any length, and digits among other characters where ASCII puts them. The
    case-folded text breaks ties (``run-01`` and ``run-1``).

    >>> sorted(["run-10", "Run-3", "run-2", "run-1"], key=natural_key)
    ['run-1', 'run-2', 'Run-3', 'run-10']
    """
    folded = text.casefold()
    if folded == text:  # (one string object, not two equal ones: this cache holds 100,000 names)
        folded = text
    return _DIGIT_RUNS.sub(_encode_digits, folded), folded


def warm_name_keys(runs: Sequence[RunSummary]) -> int:
    """Build the :func:`natural_key` of every run's name ahead of the first sort that needs them
    (by name, or by a metric whose ties the name breaks). Returns how many were built: none when
    there are more runs than the key cache holds, which would then only evict itself.

    Building them costs ~3 µs a name, which at 100,000 runs was most of the first sort by a metric
    then by name (0.6 s against 0.25 s once built, issue 16); the viewer does it after its first
    poll, in the background."""
    if len(runs) > _NAME_KEYS:
        return 0
    for name in map(_NAME, runs):
        natural_key(name)
    return len(runs)


_NAME: Final = attrgetter("name")


def _sort_entry(value: Scalar) -> tuple[int, Any]:
    """The sort class and key of one value: the definition, which :func:`_classify` inlines (a test
    keeps the two equal)."""
    if value is None or value == "":
        return _MISSING, None
    kind = type(value)
    if kind is float:
        return (_NUMBER, value) if value == value else (_NAN, None)  # NaN is the one float != itself
    if kind is int:
        return _NUMBER, value
    if kind is str:
        return _TEXT, natural_key(value)
    return _TEXT, natural_key(format_cell(value))


def _time_entry(value: Scalar) -> tuple[int, Any]:
    # A time as written (ISO-8601 UTC) orders by time as plain text; natural order would put
    # ".5" before ".25" in fractional seconds, and costs a regex pass per value.
    if value is None or value == "":
        return _MISSING, None
    return _TEXT, value if type(value) is str else format_cell(value)


TIME_COLUMNS: Final = frozenset({"started", "ended", "heartbeat"})
"""Fixed columns holding ISO-8601 times: sorted as the text written, which is time order."""


def sort_runs(runs: Iterable[RunSummary], keys: Sequence[SortKey]) -> list[RunSummary]:
    """The runs sorted by ``keys`` (first key first, later keys break ties); stable.

    For each key: numbers first (ascending or descending), then text (natural order, case-insensitive:
    ``run-1, run-2, Run-3, run-10``, see :func:`natural_key`; ascending or descending; true/false
    sort as text), then NaN, then missing values. NaN and missing stay last in
    both directions, so ``-run.best.val/auc`` puts the best runs on top and runs without the metric at
    the bottom. The time columns (:data:`TIME_COLUMNS`) sort as their ISO-8601 text, which is time
    order. With no keys the order is unchanged.

    A later key is read only for runs that tie on the keys before it (issue 16: sorting 100,000 runs
    by a metric then by name reads the few names that tie, not 100,000).

    Raises:
        ColumnError: a key names an invalid column.
    """
    getters = [(cell_getter(key.column), _time_entry if key.column in TIME_COLUMNS else _sort_entry,
                key.descending) for key in keys]
    return _sorted_by(list(runs), getters)


def _sorted_by(
    items: list[RunSummary],
    getters: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> list[RunSummary]:
    if not getters or len(items) < 2:
        return items
    (get, entry_of, descending), rest = getters[0], getters[1:]
    values: list[Scalar] = list(map(get, items)) if entry_of is _sort_entry else []  # (each read once)
    if entry_of is _sort_entry:
        many = len(items) >= _NUMPY_MIN_RUNS
        if many and _all_plain_numbers(values):
            return _sorted_numbers(items, values, descending, rest)
        if many and _numbers_or_missing(values):
            # A metric some runs lack (the common case of a sweep): the numbers with numpy, the
            # runs without it last, as their class comes (100,000 runs: 0.2 s of classifying saved).
            present = [run for run, v in zip(items, values, strict=True) if v is not None]
            absent = [run for run, v in zip(items, values, strict=True) if v is None]
            ordered = _sorted_numbers(present, [v for v in values if v is not None], descending, rest)
            ordered.extend(_sorted_by(absent, rest) if rest else absent)
            return ordered
        if _all_text(values):
            return _sorted_by_keys(items, list(map(natural_key, values)), descending, rest)  # (all str)
    elif entry_of is _time_entry:
        times = list(map(get, items))
        if all(type(t) is str and t for t in times):  # every run has the time: one class, one sort
            return _sorted_by_keys(items, times, descending, rest)
    buckets: tuple[list[tuple[Any, RunSummary]], ...] = ([], [], [], [])
    if entry_of is _sort_entry:
        _classify(items, values, buckets)
    else:
        for run, (kind, value) in zip(items, map(entry_of, map(get, items)), strict=True):
            buckets[kind].append((value, run))
    out: list[RunSummary] = []
    # Python's sort stays stable with reverse=True, and the classes are concatenated in a fixed
    # order, so NaN and missing stay last whatever the direction.
    for kind, bucket in enumerate(buckets):
        if kind in (_NUMBER, _TEXT):
            bucket.sort(key=_FIRST, reverse=descending)
        if not rest:
            out.extend(run for _, run in bucket)
        elif kind in (_NAN, _MISSING):  # one tie: the later keys order the whole class
            out.extend(_sorted_by([run for _, run in bucket], rest))
        else:
            _extend_ties(out, bucket, rest)
    return out


_NUMPY_MIN_RUNS: Final = 2_000
"""A key whose values are all plain numbers is sorted with numpy from this many runs on."""
_EXACT_FLOAT_INT: Final = 2**53


def _all_plain_numbers(values: list[Scalar]) -> bool:
    """Every value a float, or an int a float holds exactly (no bool, text or missing value)."""
    kinds = set(map(type, values))
    if not kinds <= {float, int}:
        return False
    return int not in kinds or all(-_EXACT_FLOAT_INT < v < _EXACT_FLOAT_INT for v in values if type(v) is int)


def _numbers_or_missing(values: list[Scalar]) -> bool:
    """Every value None or a plain number (:func:`_all_plain_numbers`), at least one of each kind."""
    kinds = set(map(type, values))
    if not (type(None) in kinds and kinds - {type(None)} and kinds <= {float, int, type(None)}):
        return False
    return int not in kinds or all(-_EXACT_FLOAT_INT < v < _EXACT_FLOAT_INT for v in values if type(v) is int)


def _sorted_numbers(
    items: list[RunSummary], values: list[Scalar], descending: bool,
    rest: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> list[RunSummary]:
    """:func:`_sorted_by` of runs whose values of the first key are all numbers (``values``), with
    numpy: the same order (a stable sort, NaN last in both directions, ties ordered by ``rest``)
    without a tuple per run (sorting 100,000 runs by a metric, issue 16)."""
    import numpy as np  # (here: listing a few runs imports no numpy)

    array = np.array(values, dtype=np.float64)
    nan = np.isnan(array)
    numbers = np.flatnonzero(~nan)
    keys = array[numbers]
    # A stable sort of the negated values is Python's stable reverse=True sort.
    order = numbers[np.argsort(-keys if descending else keys, kind="stable")]
    runs = _objects(items)
    ranked = runs[order].tolist()
    nans = runs[nan].tolist()
    out: list[RunSummary] = []
    if rest:
        in_order = array[order]
        _extend_tied(out, ranked, in_order[1:] == in_order[:-1], rest)
        out.extend(_sorted_by(nans, rest))  # NaN is one tie: the later keys order it
    else:
        out.extend(ranked)
        out.extend(nans)
    return out


def _sorted_by_keys(
    items: list[RunSummary], keys: list[Any], descending: bool,
    rest: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> list[RunSummary]:
    """:func:`_sorted_by` of runs whose values of the first key are of one sort class, ``keys[i]``
    the sort key of ``items[i]``: one stable sort of positions by the keys, no ``(key, run)`` pair
    per run. For a time every run has (ISO-8601 text: the viewer's first table is sorted by
    ``-started``, a tenth of its warm start at 100,000 runs) and for texts only (their natural keys:
    the names that break the ties of a metric, 42,000 of 100,000 runs in the scale bench; issue 16)."""
    order = sorted(range(len(items)), key=keys.__getitem__, reverse=descending)
    ranked = [items[i] for i in order]
    if not rest:
        return ranked
    in_order = [keys[i] for i in order]
    out: list[RunSummary] = []
    _extend_tied(out, ranked, list(map(operator.eq, in_order, islice(in_order, 1, None))), rest)
    return out


def _all_text(values: list[Scalar]) -> bool:
    """Every value a non-empty text (a run's name, say): one sort class."""
    return set(map(type, values)) == {str} and "" not in values


def _classify(items: list[RunSummary], values: list[Scalar],
              buckets: tuple[list[tuple[Any, RunSummary]], ...]) -> None:
    """:func:`_sort_entry` of every run's value (``values[i]`` of ``items[i]``) into ``buckets``,
    inline (a call per value was a third of sorting 100,000 runs by a metric, issue 16)."""
    numbers, texts, nans, missing = buckets
    add_number, add_text = numbers.append, texts.append
    for run, value in zip(items, values, strict=True):
        kind = type(value)
        if kind is float:
            if value == value:
                add_number((value, run))
            else:
                nans.append((None, run))
        elif kind is int:
            add_number((value, run))
        elif value is None or value == "":
            missing.append((None, run))
        elif kind is str:
            add_text((natural_key(value), run))
        else:
            add_text((natural_key(format_cell(value)), run))


def _extend_ties(
    out: list[RunSummary],
    bucket: list[tuple[Any, RunSummary]],
    rest: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> None:
    """Append the sorted ``bucket``'s runs to ``out``, each run of equal values ordered by ``rest``.

    The tied runs of all the runs of equal values are ordered by ``rest`` in one sort, and each
    run of ties then takes its members in that order: restricted to one run of ties, the one
    stable order is that run's own (100,000 runs sorted by a metric rounded to six digits held
    19,000 runs of ties; one sort each took most of the time, issue 16). Where the ties are and
    which run of ties each belongs to is found with numpy, not a Python loop per run (0.4 of
    0.6 CPU-s sorting 100,000 runs by a metric then by name)."""
    values = list(map(_FIRST, bucket))
    _extend_tied(out, list(map(_SECOND, bucket)), list(map(operator.eq, values, islice(values, 1, None))), rest)


def _extend_tied(
    out: list[RunSummary], ranked: list[RunSummary], same: Any,
    rest: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> None:
    """Append ``ranked`` to ``out`` with each run of ties ordered by ``rest``; ``same`` (a list or a
    numpy array of bools): ``same[i]``, run i ties run i + 1 (:func:`_extend_ties`). Below
    :data:`_NUMPY_MIN_RUNS` runs in plain Python (a small listing imports no numpy)."""
    if not (any(same) if isinstance(same, list) else same.any()):
        out.extend(ranked)
        return
    if len(ranked) < _NUMPY_MIN_RUNS:
        _extend_tied_small(out, ranked, list(same), rest)
        return
    import numpy as np

    same = np.asarray(same, dtype=bool)
    tied = np.zeros(len(ranked), dtype=bool)  # ties a neighbour
    tied[:-1] = same
    tied[1:] |= same
    positions = np.flatnonzero(tied)  # of the tied runs in the bucket, a run of ties after another
    starts = np.ones(len(positions), dtype=bool)  # the first of its run of ties
    starts[1:] = ~same[positions[1:] - 1]
    groups = np.cumsum(starts)
    result = _objects(ranked)
    runs = result[positions]
    # The tied runs' positions (0..n-1) in the later keys' order: the positions are sorted with
    # getters that look the run up, so no run → rank mapping is built (at 100,000 runs a dict by
    # id() and a pass over it cost a fifth of the sort, issue 16).
    picked = runs.tolist()
    by_position = [(_at(get, picked), entry_of, descending) for get, entry_of, descending in rest]
    in_rest_order = np.fromiter(_sorted_by(list(range(len(picked))), by_position),  # type: ignore[arg-type]
                                dtype=np.int64, count=len(picked))
    # Stable by run of ties: each run of ties takes its members in the later keys' order.
    order = in_rest_order[np.argsort(groups[in_rest_order], kind="stable")]
    result[positions] = runs[order]
    out.extend(result.tolist())


def _at(get: Callable[[RunSummary], Scalar], runs: list[RunSummary]) -> Callable[[int], Scalar]:
    """``get`` of the run at a position of ``runs`` (sorting positions in place of runs)."""
    return lambda i: get(runs[i])


def _objects(items: list[Any]) -> Any:
    """``items`` as a numpy array of objects (from an iterator: a run is never unpacked as a sequence,
    and five times faster than filling an empty array)."""
    import numpy as np

    return np.fromiter(items, dtype=object, count=len(items))


def _extend_tied_small(
    out: list[RunSummary], ranked: list[RunSummary], same: list[bool],
    rest: Sequence[tuple[Callable[[RunSummary], Scalar], Callable[[Scalar], tuple[int, Any]], bool]],
) -> None:
    """:func:`_extend_tied` in plain Python (the same steps, a loop per run)."""
    positions: list[int] = []  # of the tied runs, a run of ties after another
    groups: list[int] = []
    group, tied = -1, False
    for i, s in enumerate(same):
        if s:
            if not tied:
                group += 1
                positions.append(i)
                groups.append(group)
            positions.append(i + 1)
            groups.append(group)
        tied = s
    runs = [ranked[i] for i in positions]
    rank = {id(run): k for k, run in enumerate(_sorted_by(runs, rest))}
    order = sorted(range(len(runs)), key=lambda k: (groups[k], rank[id(runs[k])]))
    result = list(ranked)
    for position, k in zip(positions, order, strict=True):
        result[position] = runs[k]
    out.extend(result)


_FIRST: Final = itemgetter(0)
_SECOND: Final = itemgetter(1)


# -- group -----------------------------------------------------------------------------------------


@dataclass
class Group:
    """Runs that share one value of the grouping column.

    Attributes:
        label: what the UI shows: the value as text, tags joined with ``", "`` (``"cv, sweep"``), or
            ``"(none)"`` for runs without a value.
        value: the shared value (for tags the joined label), None for the ``(none)`` group.
        runs: the runs, in the order they were given.
    """

    label: str
    value: Scalar
    runs: list[RunSummary] = field(default_factory=list)


def group_runs(runs: Iterable[RunSummary], column: str) -> list[Group]:
    """Group the runs by one column (003 seed, "Decisions made where the spec was ambiguous").

    Each run belongs to exactly one group. Tags are joined into one label in the order written
    (``["cv", "sweep"]`` → ``"cv, sweep"``, a different group from ``["sweep", "cv"]``). Missing,
    null and empty values form the ``(none)`` group, which always comes last. The other groups are
    ordered by value: numbers numerically, then text in natural order (:func:`natural_key`; true/false as text), then
    NaN. Equal numbers group together (1 and 1.0), a bool never groups with a number. Runs keep their
    input order inside a group, so sort first to order them.

    Raises:
        ColumnError: ``column`` is invalid.
    """
    get = cell_getter(column)
    groups: dict[tuple[str, Any], Group] = {}
    for run in runs:
        if column == "tags":
            value: Scalar = ", ".join(run.tags) if run.tags else None
        else:
            value = get(run)
        if value is None or value == "":
            gkey: tuple[str, Any] = ("none", None)
        elif is_nan(value):
            gkey = ("nan", None)
        elif isinstance(value, bool):
            gkey = ("bool", value)
        elif is_number(value):
            gkey = ("number", value)
        else:
            gkey = ("text", value)
        group = groups.get(gkey)
        if group is None:
            label = NONE_GROUP_LABEL if gkey[0] == "none" else format_cell(value)
            group = groups[gkey] = Group(label, None if gkey[0] == "none" else value)
        group.runs.append(run)

    def order(item: tuple[tuple[str, Any], Group]) -> tuple[int, Any, str]:
        (kind, value), group = item
        if kind == "number":
            return 0, value, ""
        if kind in ("text", "bool"):
            return 1, natural_key(group.label), group.label
        return (2 if kind == "nan" else 3), 0, ""

    return [group for _, group in sorted(groups.items(), key=order)]


def differing_config_keys(runs: Sequence[RunSummary]) -> list[str]:
    """The params keys whose values are not identical across ``runs``, in the order the runs' params
    list them (params.yaml order, a key first seen in a later run after the keys of the earlier
    ones): the "differing params only" toggle and, the first :data:`MAX_DEFAULT_PARAMS` of them, the
    default columns (issue 15 item 20). Alphabetical order would pick ``data.*`` and ``model.*``
    over the ``optim.lr`` a sweep varies; the order the training script writes them keeps its own
    grouping.

    A run without the key counts as a distinct value, except that missing and null are the same
    (both show as an empty cell). 1 and 1.0 are identical, true and 1 are not, NaN equals NaN. With
    fewer than two runs nothing differs.
    """
    params = [run.params for run in runs]
    keys = _params_order(runs)
    differing = []
    for key in keys:
        first_value = params[0].get(key) if params else None
        first = _identity(first_value)
        first_type = type(first_value)
        for values in params:  # stop at the first difference
            value = values.get(key)
            # The common case in one step: a value of the same type that is equal (not NaN, which
            # is never equal to itself and goes the long way).
            if type(value) is first_type and value == first_value:
                continue
            if _identity(value) != first:
                differing.append(key)
                break
    return differing


def param_spread(counts: Mapping[Any, int], n_runs: int) -> int:
    """How widely one params key varies over ``n_runs`` runs, from ``counts`` (each value's
    :func:`param_identity` → the runs holding it; runs without the key hold none): the number of
    distinct values, a missing key counting as null; 0 when it does not differ. A text key that
    gives every one of three or more runs its own value (an output folder, a run id) names the runs
    rather than a setting: 1, the lowest of the keys that differ."""
    return _spread(len(counts), sum(counts.values()), _NONE in counts,
                   all(ident[0] == "text" for ident in counts), n_runs)


def _spread(distinct: int, held: int, has_null: bool, only_text: bool, n_runs: int) -> int:
    if held < n_runs and not has_null:
        distinct += 1  # the runs without the key: one more value, null
    if distinct < 2:
        return 0
    if n_runs >= 3 and distinct == n_runs == held and only_text:
        return 1
    return distinct


def param_spreads(runs: Sequence[RunSummary]) -> dict[str, int]:
    """Every params key that differs between ``runs`` → its :func:`param_spread` (the same answer,
    without building an identity per value: 100,000 runs of a dozen params in ~0.2 s)."""
    n = len(runs)
    if n < 2:
        return {}
    # Per key: its text values, its numbers (a set holds 1 and 1.0 as one value, as
    # param_identity does; NaN as one marker), its other identities (bool, null) and the runs
    # holding it.
    texts: dict[str, set[Any]] = {}
    numbers: dict[str, set[Any]] = {}
    others: dict[str, set[Any]] = {}
    held: dict[str, int] = {}
    for run in runs:
        for key, value in run.params.items():
            kind = type(value)
            if kind is str:
                bucket: set[Any] | None = texts.get(key)
                if bucket is None:
                    bucket = texts[key] = set()
                bucket.add(value)
            elif kind is int or kind is float:
                bucket = numbers.get(key)
                if bucket is None:
                    bucket = numbers[key] = set()
                bucket.add(value if value == value else _NAN_MARK)
            else:
                bucket = others.get(key)
                if bucket is None:
                    bucket = others[key] = set()
                ident = _identity(value)
                try:
                    bucket.add(ident)
                except TypeError:  # a list or mapping that got through: its text tells it apart
                    bucket.add((ident[0], repr(ident[1])))
            held[key] = held.get(key, 0) + 1
    empty: set[Any] = set()
    out = {}
    for key, k_held in held.items():
        t, u, o = texts.get(key, empty), numbers.get(key, empty), others.get(key, empty)
        spread = _spread(len(t) + len(u) + len(o), k_held, _NONE in o, not u and not o, n)
        if spread:
            out[key] = spread
    return out


def default_params(order: Iterable[str], spreads: Mapping[str, int]) -> list[str]:
    """The params keys the table shows by default (issue 15 item 20 and its review): of the keys
    that differ (``spreads``, by :func:`param_spread`), the :data:`MAX_DEFAULT_PARAMS` that take
    the most distinct values, the earlier in ``order`` (params.yaml order) on a tie, then shown in
    ``order``. A sweep's ``optim.lr`` (a value per run) comes before ``data.*`` and ``model.*``
    keys that take two or three values, however many of those params.yaml lists first."""
    keys = [k for k in order if spreads.get(k, 0) > 0]
    ranked = sorted(range(len(keys)), key=lambda i: -spreads[keys[i]])[:MAX_DEFAULT_PARAMS]
    return [keys[i] for i in sorted(ranked)]


def _params_order(runs: Sequence[RunSummary]) -> dict[str, None]:
    """Every params key of ``runs`` once, in the order their params list them (a key first seen
    in a later run after those of the earlier ones)."""
    return dict.fromkeys(chain.from_iterable(map(attrgetter("params"), runs)))  # (one pass, in C)


def param_identity(value: Scalar) -> tuple[str, Any]:
    """What makes two params values the same for :func:`differing_config_keys`, hashable: null
    (and a missing key) one value, 1 and 1.0 one value, true and 1 two, every NaN one."""
    return _identity(value)


_NONE: Final = ("none", None)
_NAN_MARK: Final = ("nan", None)


def _identity(value: Scalar) -> tuple[str, Any]:
    if value is None:
        return "none", None
    if isinstance(value, bool):
        return "bool", value
    if is_nan(value):
        return "nan", None
    if is_number(value):
        return "number", value
    return "text", value


# -- export ----------------------------------------------------------------------------------------


def csv_columns(columns: Sequence[str], *, lead: bool = True) -> list[str]:
    """The header of a CSV export: :data:`CSV_LEAD_COLUMNS`, then ``columns`` in order without those
    six and without repeats. ``lead=False`` gives ``columns`` alone (without repeats): what
    ``traceml runs ls --csv --columns a,b`` asked for.

    Raises:
        ColumnError: a column name is invalid.
    """
    out = list(CSV_LEAD_COLUMNS) if lead else []
    for column in columns:
        if column not in out:
            out.append(validate_column(column))
    return out


def to_csv(
    runs: Iterable[RunSummary],
    columns: Sequence[str],
    *,
    group_by: str | None = None,
    group_labels: Mapping[str, str] | None = None,
    lead: bool = True,
) -> str:
    """The runs as CSV text for an agent or ``pandas.read_csv`` (003 seed, "Exporting the table for an
    agent").

    A header, then one row per run in the given order, RFC 4180 quoting (``csv`` module, CRLF line
    ends). Columns: see :func:`csv_columns`. ``tags`` are joined with ``;``, ``path`` is the run
    folder, timestamps stay ISO-8601 UTC strings as written, missing and null values are empty cells,
    floats are written with ``repr`` (no rounding), NaN as ``NaN``, booleans as ``true``/``false``.
    Encode the text as UTF-8 when writing it. With ``group_by``, a ``group:<column>`` column after the
    first six holds each run's group label (``group_labels[run.key]``, as :func:`group_runs` names it).
    ``lead=False`` leaves out the first six columns unless ``columns`` names them (the group column
    then comes first).

    Raises:
        ColumnError: a column name is invalid.
    """
    buffer = io.StringIO()
    write_csv(buffer, runs, columns, group_by=group_by, group_labels=group_labels, lead=lead)
    return buffer.getvalue()


def write_csv(
    out: TextIO,
    runs: Iterable[RunSummary],
    columns: Sequence[str],
    *,
    group_by: str | None = None,
    group_labels: Mapping[str, str] | None = None,
    lead: bool = True,
) -> int:
    """Write :func:`to_csv`'s text to ``out`` row by row (a file opened with ``newline=""``, or
    stdout): 100,000 rows never stand as one string (issue 16). Returns the number of rows.

    Raises:
        ColumnError: a column name is invalid (before anything is written).
        OSError: ``out`` could not be written.
    """
    header = csv_columns(columns, lead=lead)
    labels = group_labels or {}
    if group_by is not None:
        header.insert(len(CSV_LEAD_COLUMNS) if lead else 0, f"group:{validate_column(group_by)}")
    getters = [None if column.startswith("group:") else cell_getter(column) for column in header]
    writer = csv.writer(out)
    writer.writerow(header)
    n = 0
    for run in runs:
        writer.writerow([labels.get(run.key, "") if get is None else format_cell(get(run)) for get in getters])
        n += 1
    return n


def row_json(run: RunSummary, columns: Sequence[str]) -> dict[str, Any]:
    """One run as a JSON-safe dict for ``traceml runs ls --json`` and the web API.

    Shape: ``{"id", "name", "status", "display_status", "warnings": [str], "values": {column: value}}``
    where ``status`` is run.json's status as written (None without a readable run.json) and
    ``display_status`` the derived one (``stale``, ``running?``, …; the ``status`` column shows this
    one). In ``values``, NaN and ±infinity become None (JSON has no NaN) and ``tags`` is a list of
    strings; other values are as :func:`cell` returns them. For many runs use :func:`rows_json`.

    Raises:
        ColumnError: a column name is invalid.
    """
    return next(rows_json([run], columns))


def rows_json(runs: Iterable[RunSummary], columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """:func:`row_json` of each run, in order, the column names parsed once (not once per cell:
    a third of ``traceml runs ls --json`` of 10,000 runs went to that).

    Raises:
        ColumnError: a column name is invalid (raised before the first row).
    """
    getters = [cell_getter(c) for c in columns]
    return _rows_json(list(runs), list(columns), getters)


JSON_LINES_CHUNK: Final = 4096


def json_lines(runs: Sequence[RunSummary], columns: Sequence[str], *, group_by: str | None = None,
               labels: Mapping[str, str] | None = None) -> Iterator[bytes]:
    """:func:`rows_json` encoded: one JSON object per run, each ending in a newline, the same bytes
    as ``orjson.dumps(row, option=OPT_APPEND_NEWLINE)`` of each row (with ``"group_by": {"column":
    group_by, "label": labels[run.key]}`` last when ``group_by`` is given), yielded a few thousand
    runs at a time (each item holds many lines).

    Built column by column without a dict per run: every cell encoded by orjson, the lines put
    together from one template (``runs ls --json`` of 100,000 runs spent 1.9 s building and encoding
    dicts, issue 16). orjson writes NaN and infinity as null, as :func:`rows_json` does.

    Raises:
        ColumnError: a column name is invalid (raised before the first line).
    """
    import orjson

    getters = [cell_getter(c) for c in columns]
    dumps = orjson.dumps
    fields = [b'"values":{' + b",".join(dumps(c).replace(b"%", b"%%") + b":%b" for c in columns) + b"}"]
    if group_by is not None:
        fields.append(b'"group_by":%b')
    template = b'{"id":%b,"name":%b,"status":%b,"display_status":%b,"warnings":%b,' + b",".join(fields) + b"}\n"
    return _json_lines(list(runs), list(columns), getters, template, group_by, labels or {})


_NO_COMMA_TYPES: Final = frozenset({float, int, bool, type(None)})


def _encoded(values: list[Any], dumps: Callable[[Any], bytes]) -> list[bytes]:
    """Each value as orjson writes it. Numbers, booleans and nulls hold no comma: a column of only
    those is encoded in one call and split (a call per cell was half of the encoding)."""
    if len(values) > 1 and set(map(type, values)) <= _NO_COMMA_TYPES:
        return dumps(values)[1:-1].split(b",")
    return list(map(dumps, values))


def _json_lines(runs: list[RunSummary], columns: list[str], getters: list[Callable[[RunSummary], Scalar]],
                template: bytes, group_by: str | None, labels: Mapping[str, str]) -> Iterator[bytes]:
    import orjson

    dumps = orjson.dumps
    for start in range(0, len(runs), JSON_LINES_CHUNK):
        part = runs[start : start + JSON_LINES_CHUNK]
        cells = [
            [dumps(run.id) for run in part],
            [dumps(run.name) for run in part],
            [dumps(run.status) for run in part],
            [dumps(run.display_status) for run in part],
            [dumps(list(run.warnings)) for run in part],
        ]
        for column, get in zip(columns, getters, strict=True):
            if column == "tags":
                cells.append([dumps(list(run.tags)) for run in part])
            else:
                cells.append(_encoded(list(map(get, part)), dumps))
        if group_by is not None:
            cells.append([dumps({"column": group_by, "label": labels[run.key]}) for run in part])
        yield b"".join([template % line for line in zip(*cells, strict=True)])


def _rows_json(runs: list[RunSummary], columns: list[str],
               getters: list[Callable[[RunSummary], Scalar]]) -> Iterator[dict[str, Any]]:
    # Column by column (one map per column, NaN cleared only where a float is), then one dict per
    # row from a zip: half the per-cell work of a loop over rows and columns at 100,000 runs.
    by_column: list[list[Any]] = []
    for column, get in zip(columns, getters, strict=True):
        if column == "tags":
            by_column.append([list(run.tags) for run in runs])
            continue
        values = list(map(get, runs))
        if any(isinstance(v, float) for v in values):
            values = [None if isinstance(v, float) and not math.isfinite(v) else v for v in values]
        by_column.append(values)
    for run, cells in zip(runs, zip(*by_column, strict=True) if by_column else ((),) * len(runs), strict=True):
        yield {
            "id": run.id,
            "name": run.name,
            "status": run.status,
            "display_status": run.display_status,
            "warnings": list(run.warnings),
            "values": dict(zip(columns, cells, strict=True)),
        }
