"""The filter language of the run table (003 seed, "The runs table" and "Decisions made where the spec
was ambiguous"; DESIGN §4).

One filter applies to one column (names as in :mod:`traceml_ai.runs.table`):

==================  ===============================================================================
``> x`` ``>= x``    ordering. Numerically when ``x`` is a number: then a text or boolean value never
``< x`` ``<= x``    matches (``> 0`` does not match ``abc``). A text ``x`` compares text values in the
                    table's sort order (natural, case-insensitive: ``name>run-2`` matches ``Run-3`` and
                    ``run-10``; numbers never match it); on a column that holds only numbers it is an error
                    (:class:`FilterError`), not a filter that matches nothing
``= x`` ``!= x``    equality: numerically when both are numbers (``0.001`` = ``1e-3``), otherwise as
                    case-insensitive text (``true``/``false`` for booleans). ``==`` is accepted too
``a..b``            inclusive range: numeric when both ends are numbers (text values never match),
                    else as text in natural order
``/regex/``         Python ``re.search``, case-insensitive, on the value's text
bare number         equality in a numeric column, substring in a text column
anything else       case-insensitive substring of the value's text
==================  ===============================================================================

Columns of numbers: a word where a number belongs (``run.best.val/auc>=abc``, ``=abc``, ``!=abc``,
``a..z``) is a :class:`FilterError` naming the column, never a filter that silently matches nothing
(MLflow's search refuses such a comparison too). The metric columns (``run.start.*``, ``run.last.*``,
``run.best.*``) and ``duration_s``, ``step``, ``epoch``, ``warnings`` hold numbers by the run
format, so there it is refused before any run is read, also when no run has a value yet.

``status``: the statuses are a fixed set (:data:`traceml_ai.runs.layout.DISPLAY_STATUSES`), so
``status=faild``, ``status!=faild`` or a bare ``status:faild`` (a substring of no status) is a
:class:`FilterError` naming the statuses, never a filter that matches no run (or every run). So are
``perf.verdict``, ``perf.severity`` and ``perf.telemetry``, whose words are fixed too
(:mod:`traceml_ai.verdicts`): ``perf.verdict=inputbound`` is an error that suggests ``input_bound``.
The numeric ``perf.*`` columns refuse a word where a number belongs, as the metric columns do.

Time columns (``started``, ``ended``, ``heartbeat``: ISO-8601 UTC): ``<``, ``<=``, ``>``, ``>=``,
``=``, ``!=`` and ``a..b`` take a date or time, ``2026``, ``2026-11``, ``2026-11-30``,
``2026-11-30T10:15`` or ``2026-11-30T10:15:00Z`` (UTC unless an offset is written), and it stands for
its whole period, as in GitHub's search: ``started>=2026-11-30`` is from that day on, ``started>2026``
from 2027, ``started<2026-11`` before November, ``started=2026-11-30`` that day,
``started:2026-01..2026-03`` January to March inclusive. Anything else after one of these operators is
a :class:`FilterError` naming the accepted forms. A bare value or ``/regex/`` matches the text.

Spaces around the operator are optional. The value's text is the CSV text
(:func:`traceml_ai.runs.table.format_cell`): floats with ``repr``, NaN as ``NaN``.

Missing values: a run without a value (missing or null) matches only ``!= x``. NaN never matches
``<``, ``<=``, ``>``, ``>=``, ``=`` or a range, and matches ``!= x``; a text filter ``nan`` or
``/nan/`` finds NaN values. For ``tags`` a filter matches when any one tag matches (``!=`` when no tag
equals ``x``); a run without tags is missing.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Final, Literal

from traceml_ai.runs.layout import DISPLAY_STATUSES
from traceml_ai.runs.model import RunSummary, Scalar
from traceml_ai.runs.table import (
    PERF_NUMERIC,
    TIME_COLUMNS,
    ColumnError,
    cell_getter,
    column_is_numeric,
    format_cell,
    is_nan,
    is_number,
    natural_key,
    split_column,
    validate_column,
)
from traceml_ai.verdicts import SEVERITIES, TELEMETRY_STATES, VERDICT_KINDS

Op = Literal["<", "<=", ">", ">=", "=", "!=", "range", "regex", "number", "text"]
"""``number``: a bare number; ``text``: a bare substring."""

_NUMBER_RE: Final = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INT_RE: Final = re.compile(r"[+-]?\d+")
_OPERATORS: Final = (">=", "<=", "!=", "==", ">", "<", "=")
_SPLIT_CHARS: Final = ":<>=!"
_EXAMPLES: Final = "e.g. run.best.val/auc>=0.8, config.optim.lr:0.001..0.01, name:/base.*/, status=failed"


class FilterError(ValueError):
    """A filter, sort or status the user wrote that cannot be used; the message is one line that
    names the expression and the fix."""


def parse_number(text: str) -> int | float | None:
    """``text`` as a number when it is a plain decimal literal (``3``, ``-0.5``, ``1e-3``, ``.5``) or
    ``inf``/``-inf`` (for open-ended ranges like ``0.9..inf``), else None. ``nan`` filters as text."""
    text = text.strip()
    if text.lower().lstrip("+-") in ("inf", "infinity"):
        return float("-inf") if text.startswith("-") else float("inf")
    if _INT_RE.fullmatch(text):
        return int(text)
    if _NUMBER_RE.fullmatch(text):
        return float(text)
    return None


@dataclass(frozen=True)
class ColumnFilter:
    """One parsed filter expression (see the module docstring for the language).

    Attributes:
        expr: the expression as written (without the column).
        op: the operator; ``number`` is a bare number, ``text`` a bare substring.
        operand: the value text (for a range the low end, for a regex the pattern).
        number: ``operand`` as a number when it is one, else None.
        high, high_number: the high end of a range (text, number), else ``""`` and None.
        pattern: the compiled regex for ``regex``, else None.

    Build one with :func:`parse_filter`; test values with :meth:`matches` / :meth:`matches_any`.
    """

    expr: str
    op: Op
    operand: str
    number: int | float | None = None
    high: str = ""
    high_number: int | float | None = None
    pattern: re.Pattern[str] | None = None

    def __str__(self) -> str:
        return self.expr

    def matches(self, value: Scalar, *, numeric_column: bool = False) -> bool:
        """True when one cell value passes this filter.

        ``numeric_column`` (see :func:`traceml_ai.runs.table.column_is_numeric`) only matters for a
        bare number: equality in a numeric column, substring in a text one.
        """
        if value is None or value == "":
            return self.op == "!="
        if self.op == "!=":
            return not self._equals(value)
        if self.op == "=":
            return self._equals(value)
        if self.op in ("<", "<=", ">", ">="):
            return self._ordered(value)
        if self.op == "range":
            return self._in_range(value)
        text = format_cell(value)
        if self.op == "regex":
            assert self.pattern is not None
            return self.pattern.search(text) is not None
        if self.op == "number" and numeric_column:
            return self._equals(value)
        return self.operand.casefold() in text.casefold()

    def matches_any(self, values: Sequence[Scalar], *, numeric_column: bool = False) -> bool:
        """True when a list value (``tags``) passes: any element matches, or for ``!=`` no element is
        equal. An empty list is a missing value."""
        if not values:
            return self.op == "!="
        if self.op == "!=":
            return all(not self._equals(v) for v in values)
        return any(self.matches(v, numeric_column=numeric_column) for v in values)

    def _equals(self, value: Scalar) -> bool:
        if is_nan(value):
            return False
        if is_number(value) and self.number is not None:
            return value == self.number
        return format_cell(value).casefold() == self.operand.casefold()

    def _ordered(self, value: Scalar) -> bool:
        if is_number(value):
            if self.number is None or is_nan(value):
                return False
            return _compare(self.op, value, self.number)
        if self.number is not None:
            return False  # a numeric operator never matches text or a boolean
        return _compare(self.op, natural_key(format_cell(value)), natural_key(self.operand))

    def _in_range(self, value: Scalar) -> bool:
        numeric = self.number is not None and self.high_number is not None
        if is_number(value):
            if not numeric or is_nan(value):
                return False
            return bool(self.number <= value <= self.high_number)  # type: ignore[operator]
        if numeric:
            return False  # a numeric range never matches text or a boolean
        return natural_key(self.operand) <= natural_key(format_cell(value)) <= natural_key(self.high)


def _compare(op: str, left: object, right: object) -> bool:
    if op == "<":
        return bool(left < right)  # type: ignore[operator]
    if op == "<=":
        return bool(left <= right)  # type: ignore[operator]
    if op == ">":
        return bool(left > right)  # type: ignore[operator]
    return bool(left >= right)  # type: ignore[operator]


def parse_filter(expr: str) -> ColumnFilter:
    """Parse one filter expression for a column: ``>= 0.8``, ``0.001..0.01``, ``/base.*/``,
    ``failed``, ``!=adam`` (the language is in the module docstring).

    Raises:
        FilterError: empty expression, an operator without a value, a lone ``!``, a range whose low
            end is above its high end, or an invalid regex. One line naming ``expr`` and the fix.
    """
    text = expr.strip()
    if not text:
        raise FilterError(f"empty filter {expr!r}; write a value, e.g. >=0.8, 0.001..0.01, /base.*/ or adam")
    if len(text) >= 2 and text.startswith("/") and text.endswith("/"):
        body = text[1:-1]
        try:
            pattern = re.compile(body, re.IGNORECASE)
        except re.error as exc:
            raise FilterError(
                f"filter {expr!r}: invalid regular expression ({exc}); fix the pattern, "
                "or drop the slashes for a plain substring match"
            ) from None
        return ColumnFilter(expr, "regex", body, pattern=pattern)
    for op in _OPERATORS:
        if text.startswith(op):
            operand = text[len(op) :].strip()
            if not operand:
                raise FilterError(f"filter {expr!r}: no value after {op!r}; write e.g. {op}0.8")
            canonical: Op = "=" if op == "==" else op  # type: ignore[assignment]
            return ColumnFilter(expr, canonical, operand, parse_number(operand))
    if text.startswith("!"):
        raise FilterError(f"filter {expr!r}: unknown operator '!'; write != for 'not equal', e.g. !=adam")
    low, sep, high = text.partition("..")
    if sep and not (low.strip() and high.strip()):
        raise FilterError(f"filter {expr!r}: a range needs both ends, e.g. 0.1..0.3 or 0.9..inf")
    if sep:
        low, high = low.strip(), high.strip()
        low_number, high_number = parse_number(low), parse_number(high)
        if low_number is not None and high_number is not None:
            reversed_range = low_number > high_number
        elif low_number is None and high_number is None:
            reversed_range = natural_key(low) > natural_key(high)
        else:  # one end a number, one not: the column's values say what is wrong (not "reversed")
            reversed_range = False
        if reversed_range:
            raise FilterError(f"filter {expr!r}: the low end is above the high end; write {high}..{low}")
        return ColumnFilter(expr, "range", low, low_number, high, high_number)
    number = parse_number(text)
    return ColumnFilter(expr, "text" if number is None else "number", text, number)


def parse_filter_arg(arg: str) -> tuple[str, ColumnFilter]:
    """Parse a ``--filter`` argument, ``COLUMN:EXPR`` or ``COLUMN OP VALUE``, into the column and its
    filter.

    The column ends at the first ``:`` or operator character (``<>=!``); a ``:`` is dropped, an
    operator stays with the expression. Examples: ``run.best.val/auc>=0.8``,
    ``config.optim.lr:0.001..0.01``, ``name:/base.*/``, ``status=failed``, ``run.last.my metric<1``.
    So a column name cannot hold ``:``, ``<``, ``>``, ``=`` or ``!``.

    Raises:
        FilterError: no separator, an empty or unknown column, a bad expression, a word where a
            metric column's number belongs, or a status no run can have (one line).
    """
    index = next((i for i, ch in enumerate(arg) if ch in _SPLIT_CHARS), -1)
    if index < 0:
        raise FilterError(
            f"filter {arg!r} names no column; write COLUMN:EXPR or COLUMN OP VALUE, {_EXAMPLES}"
        )
    column = arg[:index].strip()
    expr = arg[index + 1 :] if arg[index] == ":" else arg[index:]
    if not column:
        raise FilterError(f"filter {arg!r} names no column before {arg[index]!r}; {_EXAMPLES}")
    try:
        split_column(column)
    except ColumnError as exc:
        raise FilterError(f"filter {arg!r}: {exc}") from None
    try:
        flt = parse_filter(expr)
    except FilterError as exc:
        detail = str(exc).removeprefix(f"filter {expr!r}: ").removeprefix(f"filter {expr.strip()!r}: ")
        raise FilterError(f"filter {arg!r}: {detail}") from None
    words = WORD_COLUMNS.get(column)
    if words is not None:
        _check_word_operand(arg, flt, *words)
    elif column in NUMBER_COLUMNS or column.startswith(_METRIC_PREFIXES) or column in PERF_NUMBER_COLUMNS:
        _check_numeric_operand(column, flt)
    return column, flt


NUMBER_COLUMNS: Final = ("duration_s", "step", "epoch", "warnings")
"""Fixed columns whose values are numbers in every run (or missing)."""
_METRIC_PREFIXES: Final = ("run.start.", "run.last.", "run.best.")
"""Metric columns: a metric's values are numbers or null by the run format (003 seed), so a word
after an ordering or equality operator is refused before any run is read, also when no run logged
the metric yet."""


PERF_NUMBER_COLUMNS: Final = frozenset(f"perf.{k}" for k in PERF_NUMERIC)
"""The ``perf.*`` columns of numbers (:data:`traceml_ai.runs.table.PERF_NUMERIC`): a word after an
ordering or equality operator is refused, as for a metric."""

WORD_COLUMNS: Final[dict[str, tuple[tuple[str, ...], str, str]]] = {
    "status": (DISPLAY_STATUSES, "a run status", "the statuses"),
    "perf.verdict": (VERDICT_KINDS, "a verdict", "the verdicts"),
    "perf.severity": (SEVERITIES, "a severity", "the severities"),
    "perf.telemetry": (TELEMETRY_STATES, "a telemetry status", "the telemetry statuses"),
}
"""Columns whose values are a fixed set of words (:mod:`traceml_ai.verdicts` for the ``perf.*``
ones): column → (the words, what one is called, what they are called)."""


def _check_word_operand(arg: str, flt: ColumnFilter, words: tuple[str, ...], one: str, all_: str) -> None:
    """Refuse a filter of a word column (``status``, ``perf.verdict``, ...: :data:`WORD_COLUMNS`)
    that no run can match (or, for ``!=``, that every run matches): ``status=faild`` and
    ``perf.verdict=inputbound`` are errors naming the words, never a filter that matches nothing."""
    value = flt.operand.strip().casefold()
    if flt.op in ("=", "!="):
        bad = value not in words
    elif flt.op in ("text", "number"):
        bad = not any(value in word for word in words)
    else:
        return
    if bad:
        hint = difflib.get_close_matches(value, words, n=1)
        fix = f"did you mean {hint[0]!r}? " if hint else ""
        raise FilterError(f"filter {arg!r}: {flt.operand.strip()!r} is not {one}; {fix}"
                          f"{all_} are {', '.join(words)}")


def parse_statuses(statuses: Iterable[str]) -> frozenset[str]:
    """Check and normalise display statuses (case-insensitive) for :func:`filter_runs`.

    Raises:
        FilterError: a status outside :data:`traceml_ai.runs.layout.DISPLAY_STATUSES`.
    """
    out = set()
    for status in statuses:
        name = status.strip().lower()
        if name not in DISPLAY_STATUSES:
            raise FilterError(f"unknown status {status!r}; use one of {', '.join(DISPLAY_STATUSES)}")
        out.add(name)
    return frozenset(out)


def matches_search(run: RunSummary, search: str) -> bool:
    """True when every whitespace-separated word of ``search`` is a case-insensitive substring of the
    run's id, name, group or one of its tags. An empty search matches every run."""
    fields = [run.id, run.name, run.group or "", *run.tags]
    haystack = [f.casefold() for f in fields]
    return all(any(word in f for f in haystack) for word in search.casefold().split())


def filter_runs(
    runs: Iterable[RunSummary],
    filters: Sequence[tuple[str, ColumnFilter]] = (),
    search: str | None = None,
    statuses: Collection[str] | None = None,
    numeric: Collection[str] | None = None,
) -> list[RunSummary]:
    """The runs that pass every filter, in their input order.

    Args:
        runs: the runs to filter.
        filters: ``(column, filter)`` pairs (see :func:`parse_filter_arg`); all must match. Whether a
            column is numeric (for bare numbers) is decided over ``runs``.
        numeric: the numeric columns of ``runs`` when the caller knows them
            (:attr:`traceml_ai.runs.table.ColumnFacts.numeric`), so the runs are not walked once
            more per filter to find out.
        search: words matched by :func:`matches_search`; None or blank for no search.
        statuses: display statuses to keep (``stale`` and ``running?`` included, case-insensitive);
            None keeps all, an empty collection keeps none.

    Raises:
        FilterError: an unknown column or status, or an ordering or range filter whose value is
            not a number on a column that holds numbers (``run.best.val/auc>=abc`` would match no
            run, silently): one line naming the filter and the fix.
    """
    items = list(runs)
    is_numeric: dict[str, bool] = {}
    timed: dict[int, Callable[[Scalar], bool]] = {}
    for index, (column, flt) in enumerate(filters):
        try:
            if numeric is None:
                is_numeric[column] = column_is_numeric(items, column)
            else:
                is_numeric[column] = validate_column(column) in numeric
        except ColumnError as exc:
            raise FilterError(str(exc)) from None
        if column in TIME_COLUMNS:
            time_test = time_matcher(column, flt)
            if time_test is not None:
                timed[index] = time_test
        elif is_numeric[column]:
            _check_numeric_operand(column, flt)
    wanted = None if statuses is None else parse_statuses(statuses)
    if wanted is not None:
        items = [run for run in items if run.display_status in wanted]
    if search:
        items = [run for run in items if matches_search(run, search)]
    # One pass per filter, the column name parsed once (100,000 runs: issue 16).
    for index, (column, flt) in enumerate(filters):
        numeric_column = is_numeric[column]
        if index in timed:
            get, test = cell_getter(column), timed[index]
            items = [run for run in items if test(get(run))]
        elif column == "tags":
            items = [run for run in items if flt.matches_any(run.tags, numeric_column=numeric_column)]
        elif (number_test := _number_test(flt)) is not None:
            get = cell_getter(column)
            items = [run for run in items if number_test(get(run))]
        else:
            get, matches = cell_getter(column), flt.matches
            items = [run for run in items if matches(get(run), numeric_column=numeric_column)]
    return items


_ORDER_OPS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def _number_test(flt: ColumnFilter) -> Callable[[Scalar], bool] | None:
    """:meth:`ColumnFilter.matches` of an ordering filter on a number (``lr>0.001``) as one test,
    numbers compared at once and anything else the general way (a comparison with NaN is False,
    as there); None for other filters."""
    compare = _ORDER_OPS.get(flt.op)
    number = flt.number
    if compare is None or number is None:
        return None
    general = flt.matches

    def test(value: Scalar) -> bool:
        kind = type(value)
        if kind is float or kind is int:
            return bool(compare(value, number))
        return general(value)

    return test


def _example_number(column: str) -> str:
    """A plausible operand for ``column`` in an error's "write e.g.": its unit said where the name
    tells it (``perf.peak_mem.host`` holds bytes, ``perf.step_ms.p50`` ms, ``perf.share.*`` 0-1)."""
    name = column.casefold()
    if "peak_mem" in name or name.endswith("bytes"):
        return "1e9 (bytes: 1e9 is 1 GB)"
    if "_ms" in name:
        return "100 (ms)"
    if ".share." in name or name.startswith("share."):
        return "0.3 (a share, 0-1)"
    if name.endswith("_pct"):
        return "20 (percent)"
    return "0.8"


def _check_numeric_operand(column: str, flt: ColumnFilter) -> None:
    if flt.op in ("=", "!=") and flt.number is None:
        hint = f" (NaN values: {column}:nan)" if flt.operand.casefold() == "nan" else ""
        raise FilterError(f"filter {column + flt.expr!r}: {flt.operand!r} is not a number, and {column} holds "
                          f"numbers, so it would match {'every' if flt.op == '!=' else 'no'} run; "
                          f"write e.g. {column}{flt.op}{_example_number(column)}{hint}")
    if flt.op in ("<", "<=", ">", ">=") and flt.number is None:
        raise FilterError(f"filter {column + flt.expr!r}: {flt.operand!r} is not a number, and {column} holds "
                          f"numbers; write e.g. {column}{flt.op}{_example_number(column)}")
    if flt.op == "range" and (flt.number is None or flt.high_number is None):
        raise FilterError(f"filter {column + ':' + flt.expr!r}: the range {flt.operand}..{flt.high} is not numeric, "
                          f"and {column} holds numbers; write e.g. {column}:0.1..0.3")


_TIME_RE: Final = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:[T ](\d{2})(?::(\d{2})(?::(\d{2})(?:\.\d+)?)?)?)?)?)?"
    r"(Z|[+-]\d{2}:?\d{2})?"
)
_TIME_FORMS: Final = "2026, 2026-11, 2026-11-30, 2026-11-30T10:15 or 2026-11-30T10:15:00Z"


def parse_time_period(text: str) -> tuple[datetime, datetime] | None:
    """The period a date or time written in a filter stands for, as ``(start, end)`` (aware
    datetimes, end exclusive), or None when ``text`` is not one of the accepted forms.

    ``2026`` is that year, ``2026-11`` that month, ``2026-11-30`` that day, ``2026-11-30T10:15`` (or
    with a space) that minute, ``2026-11-30T10:15:00`` that second; UTC unless a ``Z`` or an offset
    (``+02:00``) follows. Fractions of a second are accepted and dropped.
    """
    match = _TIME_RE.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, zone = match.groups()
    tz = timezone.utc
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        start = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                         int(second or 0), tzinfo=tz)
    except ValueError:
        return None  # e.g. 2026-13 or 2026-02-30
    if month is None:
        end = start.replace(year=start.year + 1) if start.year < 9999 else datetime.max.replace(tzinfo=tz)
    elif day is None:
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    elif hour is None:
        end = start + timedelta(days=1)
    elif minute is None:
        end = start + timedelta(hours=1)
    elif second is None:
        end = start + timedelta(minutes=1)
    else:
        end = start + timedelta(seconds=1)
    return start, end


def _value_time(value: Scalar) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def time_matcher(column: str, flt: ColumnFilter) -> Callable[[Scalar], bool] | None:
    """The test of one value of a time column (``started``, ``ended``, ``heartbeat``) for a
    comparison or range filter, or None for the filters that match the text (bare value, regex).

    A missing value or one that is not an ISO-8601 time matches only ``!=`` (as in every column).

    Raises:
        FilterError: the value after the operator, or an end of the range, is not a date or time
            (:func:`parse_time_period`); one line naming the column, its type and the accepted forms.
    """
    if flt.op not in ("<", "<=", ">", ">=", "=", "!=", "range"):
        return None
    ends = (flt.operand, flt.high) if flt.op == "range" else (flt.operand,)
    periods = []
    for written in ends:
        period = parse_time_period(written)
        if period is None:
            shown = column + (":" if flt.op == "range" else "") + flt.expr
            raise FilterError(f"filter {shown!r}: {written!r} is not a date or time, and {column} holds times "
                              f"(ISO-8601 UTC); write {_TIME_FORMS}, e.g. {column}>=2026-01-01")
        periods.append(period)
    low, high = periods[0][0], periods[-1][1]
    if flt.op == "range" and low >= high:
        raise FilterError(f"filter {column + ':' + flt.expr!r}: the low end is after the high end; "
                          f"write {flt.high}..{flt.operand}")
    start, end = periods[0]
    inside: Callable[[datetime], bool] = {
        "<": lambda t: t < start,
        "<=": lambda t: t < end,
        ">": lambda t: t >= end,
        ">=": lambda t: t >= start,
        "=": lambda t: start <= t < end,
        "!=": lambda t: start <= t < end,
        "range": lambda t: low <= t < high,
    }[flt.op]

    def test(value: Scalar) -> bool:
        when = _value_time(value)
        if flt.op == "!=":
            return when is None or not inside(when)
        return when is not None and inside(when)

    return test
