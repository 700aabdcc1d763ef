"""Incremental reading of ``metrics.jsonl`` by byte offset (003 seed, "Writing runs" §6 and
"Live refresh").

:class:`MetricsTail` owns one file. Each :meth:`MetricsTail.advance` reads only the bytes appended
since the last call:

- bytes after the last newline are a line still being written: held back until completed;
- a file that shrank (or was replaced) is read again from byte 0;
- a line that is not JSON, not an object, or has neither an integer ``step`` nor ``epoch`` is
  counted and skipped; blank lines and CRLF endings are fine;
- bare ``NaN``/``Infinity``/``-Infinity`` tokens read as non-finite floats (a gap when plotted);
- ``epoch`` is used as the step when ``step`` is missing;
- trailing lines of NUL bytes (a network file system showing a region before its data) are treated
  as not yet written: they are re-read on the next call, never counted as corrupt;
- at most ``max_bytes`` bytes of the file are read, with a warning.

Rows are kept as the parsed dicts, in file order (a resumed run whose steps go backwards keeps both
segments). Per-metric arrays are built on request by :meth:`MetricsTail.series`.
"""

from __future__ import annotations

import gc
import json
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

import orjson

from traceml_ai.runs.layout import DEFAULT_MAX_METRICS_FILE_MB, RESERVED_METRIC_KEYS
from traceml_ai.runs.safeio import open_regular

if TYPE_CHECKING:
    import numpy as np  # imported where arrays are built: listing runs never loads numpy

CHUNK_BYTES = 8 * 1024 * 1024
_BLOCK_BYTES = 128 * 1024  # parse in blocks of about this size: fastest here, and a bad line costs one block
_MAX_EXAMPLES = 5


class Series:
    """One metric's history: parallel arrays, one entry per row that logged the metric.

    Attributes:
        step: int64 steps, in file order (may go backwards after a resume).
        epoch: float64 epochs (NaN where the row had none).
        time: float64 Unix seconds (NaN where the row had none).
        value: float64 values; NaN for null and non-finite values (a gap when plotted).

    ``epoch`` and ``time`` may be given as zero-argument callables: they are then built on first
    use, so a chart over steps never pays for the other two axes of a 200,000-row history.
    """

    __slots__ = ("_epoch", "_time", "metric", "step", "value")

    def __init__(
        self,
        metric: str,
        step: np.ndarray,
        epoch: np.ndarray | Callable[[], np.ndarray],
        time: np.ndarray | Callable[[], np.ndarray],
        value: np.ndarray,
    ) -> None:
        self.metric = metric
        self.step = step
        self._epoch = epoch
        self._time = time
        self.value = value

    @property
    def epoch(self) -> np.ndarray:
        if callable(self._epoch):
            self._epoch = self._epoch()
        return self._epoch

    @property
    def time(self) -> np.ndarray:
        if callable(self._time):
            self._time = self._time()
        return self._time

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def __repr__(self) -> str:
        return f"Series({self.metric!r}, {len(self)} points)"


# Fast path: parse a block of lines as one JSON array "[line1,\nline2,...]" (the block's newlines
# become ",\n" in one C pass). It gives exactly the
# per-line result when (1) every line starts with "{", (2) the block holds no other "{", and (3) the
# array has one element per line and every element is an object. Proof: each element is an object,
# so it begins with a "{" token; there are exactly as many "{" characters as lines, so every "{" begins
# an element and element k begins where line k begins. Element k then ends before the comma that
# precedes line k + 1, i.e. it is exactly line k. Nested objects or "{" inside strings fail (2) and
# take the line-by-line path. Checks (1) and (2) are C-speed byte counts.


def parse_block(block: bytes, n: int | None = None) -> list[Any] | None:
    """Parse a block of ``n`` newline-terminated JSON-object lines in one call; None when the fast
    path cannot vouch for the result (the caller then parses line by line)."""
    if n is None:
        n = block.count(b"\n")
    joined = block[:-1].replace(b"\n", b",\n")
    if not joined.startswith(b"{") or joined.count(b"{") != n or joined.count(b",\n{") != n - 1:
        return None
    try:
        parsed: list[Any] = orjson.loads(b"[" + joined + b"]")
    except orjson.JSONDecodeError:
        return None
    if len(parsed) != n or set(map(type, parsed)) != {dict}:
        return None
    return parsed


def parse_joined(lines: list[bytes]) -> list[Any] | None:
    """:func:`parse_block` for a list of lines (without their newlines)."""
    return parse_block(b"\n".join(lines) + b"\n") if lines else None


_STEP_MIN, _STEP_MAX = -(2**63), 2**63 - 1  # steps are stored as int64


def _as_step(v: Any) -> int | None:
    """An integer step (or epoch) within int64, else None (the row then does not count)."""
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is int and _STEP_MIN <= v <= _STEP_MAX:
        return v
    return None


class MetricsTail:
    """Incremental reader of one ``metrics.jsonl``.

    Args:
        path: the file (it may not exist yet: then there are no rows).
        max_bytes: read at most this many bytes of the file (``max_metrics_file_mb`` × 2**20).

    Attributes:
        rows: parsed rows (dicts) in file order; ``steps[i]`` is the step of ``rows[i]``.
        corrupt_lines: how many complete lines were skipped.
        offset: bytes of the file consumed (always the end of a complete line).
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes if max_bytes is not None else int(DEFAULT_MAX_METRICS_FILE_MB * 2**20)
        self._reset()

    def _reset(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.steps: list[int] = []
        self.offset = 0
        self.lines_read = 0
        self.corrupt_lines = 0
        self.corrupt_examples: list[str] = []
        self.backward_steps: list[str] = []
        self.backward_count = 0
        self.resets = 0
        self.truncated_at: int | None = None
        self.read_error: str | None = None
        self.vanished = False  # the file was read, then deleted: the history was reset
        self._stamp: tuple[int, int, int] | None = None
        self._names: set[str] = set()
        self._numeric_names: set[str] = set()  # keys with a number or null in some row
        self._names_upto = 0
        self._series: dict[str, _CachedSeries] = {}
        self._axes_cache: dict[str, np.ndarray] = {}

    # -- reading ---------------------------------------------------------------------------

    def advance(self) -> int:
        """Read what was appended since the last call; return the number of new rows.

        An unchanged file costs one ``stat``. Raises nothing for a missing or unreadable file:
        a missing file means no rows yet; a file deleted after it was read resets the history
        (rows, offsets, counts; :attr:`resets` grows and a warning says so until the file is back);
        an unreadable one keeps the rows read so far.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp is not None or self.rows:
                # Deleted after it was read: its rows are no longer the run's history.
                resets = self.resets + 1
                self._reset()
                self.resets = resets
                self.vanished = True
            return 0
        except OSError:
            return 0
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return 0
        if self._stamp is not None and (st.st_ino != self._stamp[0] or st.st_size < self.offset):
            resets = self.resets + 1
            self._reset()  # shrank or replaced: start over from byte 0
            self.resets = resets
        limit = min(st.st_size, self.max_bytes)
        self.truncated_at = self.max_bytes if st.st_size > self.max_bytes else None
        before = len(self.rows)
        # orjson's dicts hold no reference cycles, so the cyclic collector would only walk the
        # growing row list again and again while a big file loads (about a fifth of the time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            with open_regular(self.path) as f:
                f.seek(self.offset)
                pending = b""
                pos = self.offset
                while pos < limit:
                    chunk = f.read(min(CHUNK_BYTES, limit - pos))
                    if not chunk:
                        break
                    pos += len(chunk)
                    data = pending + chunk if pending else chunk
                    consumed = self._consume(data)
                    pending = data[consumed:]
                    self.offset += consumed
                    if consumed < len(data) and b"\n" in pending and b"\x00" in pending:
                        break  # a NUL tail: wait for the file system to fill it in
        except OSError as err:
            self.read_error = f"metrics.jsonl: cannot read ({err.strerror or err})"
            return len(self.rows) - before
        finally:
            if collecting:
                gc.enable()
        self._stamp = stamp
        self.read_error = None
        self.vanished = False
        return len(self.rows) - before

    def _consume(self, data: bytes) -> int:
        """Parse the complete lines of ``data``; return how many bytes were consumed."""
        end = data.rfind(b"\n") + 1
        if end == 0:
            return 0
        region = data[:end]
        if b"\x00" in region:
            end = self._nul_tail_start(region)
            region = data[:end]
        pos = 0
        while pos < end:
            stop = region.rfind(b"\n", pos, pos + _BLOCK_BYTES) + 1
            if stop <= pos:  # one line longer than a block
                stop = region.find(b"\n", pos) + 1
            self._parse_block(region[pos:stop])
            pos = stop
        return end

    @staticmethod
    def _nul_tail_start(region: bytes) -> int:
        """Where the trailing run of lines holding NUL bytes starts (``len(region)`` if none)."""
        end = len(region)
        while end > 0:
            start = region.rfind(b"\n", 0, end - 1) + 1
            if b"\x00" not in region[start:end]:
                break
            end = start
        return end

    def _parse_block(self, block: bytes) -> None:
        """Parse a block of complete lines (ending with a newline) into rows."""
        first_line = self.lines_read + 1
        n = block.count(b"\n")
        self.lines_read += n
        parsed = parse_block(block, n)
        rows, steps = self.rows, self.steps
        prev = steps[-1] if steps else None
        if parsed is not None:
            # Common case, all in C (map, set): every row an object with an integer step, in order.
            block_steps: list[Any] = list(map(dict.get, parsed, repeat("step")))
            if (
                set(map(type, block_steps)) == {int}
                and _STEP_MIN <= min(block_steps)
                and max(block_steps) <= _STEP_MAX
                and (prev is None or block_steps[0] >= prev)
                and all(map(operator.le, block_steps, islice(block_steps, 1, None)))
            ):
                rows.extend(parsed)
                steps.extend(block_steps)
                return
        else:
            lines = block.split(b"\n")
            lines.pop()  # the empty piece after the final newline
            parsed = [self._parse_line(line, first_line + i) for i, line in enumerate(lines)]
        for i, row in enumerate(parsed):
            if type(row) is dict:
                step = _as_step(row.get("step"))
                if step is None:
                    step = _as_step(row.get("epoch"))
                if step is not None:
                    if prev is not None and step < prev:
                        self._note_backwards(first_line + i, prev, step)
                    rows.append(row)
                    steps.append(step)
                    prev = step
                    continue
                self._corrupt(first_line + i, "neither an integer step nor an epoch (within ±9.2e18)")
            elif row is not _BLANK and row is not _SKIPPED:
                self._corrupt(first_line + i, f"a JSON {type(row).__name__}, not an object")

    def _parse_line(self, line: bytes, line_no: int) -> Any:
        if not line.strip():
            return _BLANK
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        try:
            # The standard library reads Python's bare NaN / Infinity / -Infinity tokens.
            return json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):  # not UTF-8, not JSON, an integer too long to read
            self._corrupt(line_no, "not JSON")
            return _SKIPPED

    def _corrupt(self, line_no: int, reason: str) -> None:
        self.corrupt_lines += 1
        if len(self.corrupt_examples) < _MAX_EXAMPLES:
            self.corrupt_examples.append(f"line {line_no}: {reason}")

    def _note_backwards(self, line_no: int, prev: int, step: int) -> None:
        self.backward_count += 1
        if len(self.backward_steps) < _MAX_EXAMPLES:
            self.backward_steps.append(f"line {line_no}: step {prev} → {step}")
        else:
            self.backward_steps[-1] = f"… last at line {line_no}: step {prev} → {step}"

    # -- results ---------------------------------------------------------------------------

    @property
    def warnings(self) -> list[str]:
        """One line per problem, prefixed with the file name; empty when the file is clean."""
        out: list[str] = [self.read_error] if self.read_error else []
        if self.vanished:
            out.append("metrics.jsonl: deleted after it was read; the history was reset (nothing to plot "
                       "until the file is written again)")
        if self.corrupt_lines:
            out.append(
                f"metrics.jsonl: {self.corrupt_lines} corrupt line(s) skipped ({'; '.join(self.corrupt_examples)})"
            )
        if self.backward_count >= _MIXED_WRITERS_AT:
            # A resume goes back once or twice; rows of several processes interleaved go back and forth.
            out.append(
                f"metrics.jsonl: steps go back and forth {self.backward_count} times: several processes "
                "write this file (a traceml_ai.Run in every DDP rank? only global rank 0 logs by default, "
                "README 'Logging a run'); every row kept: " + "; ".join(self.backward_steps)
            )
        elif self.backward_steps:
            out.append(
                "metrics.jsonl: steps go backwards (a resumed run?); both segments kept: "
                + "; ".join(self.backward_steps)
            )
        text = self.text_keys()
        if text:
            shown = ", ".join(text[:5]) + (", …" if len(text) > 5 else "")
            out.append(
                f"metrics.jsonl: {len(text)} key(s) hold only text or true/false values, not numbers, "
                f"and are not plotted ({shown})"
            )
        if self.truncated_at is not None:
            out.append(
                f"metrics.jsonl: only the first {self.truncated_at / 2**20:.0f} MB read "
                "(raise max_metrics_file_mb to read more)"
            )
        return out

    def _update_names(self) -> None:
        """Take the keys of the rows appended since the last call, and find which hold a number
        (or null) in some row: one C-level pass for the keys, and a scan of the new rows only
        while a key has shown nothing but text or booleans."""
        rows = self.rows
        done = self._names_upto
        if done >= len(rows):
            return
        self._names.update(*rows[done:])  # iterating a dict gives its keys
        pending = self._names - self._numeric_names - RESERVED_METRIC_KEYS
        for row in islice(rows, done, None):
            if not pending:
                break
            for key in pending.intersection(row):
                if type(row[key]) in _NUMERIC_TYPES:
                    self._numeric_names.add(key)
                    pending.discard(key)
        self._names_upto = len(rows)

    def metric_names(self) -> list[str]:
        """Every metric key seen in the rows so far, sorted: keys with a number or null in at least
        one row (step, epoch and time excluded). Keys that only ever hold text or booleans
        (``"phase": "val"``) are not metrics: see :meth:`text_keys`."""
        self._update_names()
        return sorted(self._numeric_names - RESERVED_METRIC_KEYS)

    def text_keys(self) -> list[str]:
        """Keys of the rows whose values are all text, booleans, lists or objects (nothing to
        plot), sorted; they are left out of :meth:`metric_names` and named in one warning."""
        self._update_names()
        return sorted(self._names - self._numeric_names - RESERVED_METRIC_KEYS)

    def series(self, metric: str) -> Series:
        """The history of ``metric``: rows where it is a number or null, in file order.
        Rows where it is absent or not a number (a string, a list...) are left out.

        Built with C-level passes (``map``, numpy) and cached: a later call only converts the rows
        appended since, so a live run's series costs what it grew by.
        """
        import numpy as np

        cached = self._series.get(metric)
        done = cached.rows_seen if cached is not None else 0
        rows = self.rows
        if cached is None or done < len(rows):
            new = rows[done:]
            present = np.fromiter(map(dict.__contains__, new, repeat(metric)), dtype=bool, count=len(new))
            keep = np.flatnonzero(present)
            values: list[Any] = list(map(dict.__getitem__, map(new.__getitem__, keep.tolist()), repeat(metric)))
            if not _NUMERIC_TYPES.issuperset(map(type, values)):
                # Rare: strings, lists or booleans among the values; they are not metrics.
                numeric = [type(v) in _NUMERIC_TYPES for v in values]
                keep = keep[np.array(numeric, dtype=bool)]
                values = [v for v, ok in zip(values, numeric, strict=True) if ok]
            index = keep + done
            value = np.array(values, dtype=np.float64).reshape(-1)  # None becomes NaN: a gap
            if cached is not None:
                index = np.concatenate([cached.index, index])
                value = np.concatenate([cached.value, value])
            cached = _CachedSeries(len(rows), index, value)
            self._series[metric] = cached
        index = cached.index
        return Series(
            metric,
            step=self._axis("step")[index],
            epoch=lambda: self._axis("epoch")[index],
            time=lambda: self._axis("time")[index],
            value=cached.value,
        )

    def _axis(self, name: str) -> np.ndarray:
        """``step`` (int64) or ``epoch``/``time`` (float64, NaN when missing) of every row, built on
        first use and extended by the rows appended since."""
        import numpy as np

        array = self._axes_cache.get(name)
        done = 0 if array is None else array.shape[0]
        if array is None or done < len(self.rows):
            if name == "step":
                part = np.asarray(self.steps[done:], dtype=np.int64)
            else:
                part = _numbers(self.rows[done:], name)
            array = part if array is None else np.concatenate([array, part])
            self._axes_cache[name] = array
        return array


@dataclass(frozen=True)
class _CachedSeries:
    rows_seen: int
    index: np.ndarray  # row index of each point
    value: np.ndarray


_MIXED_WRITERS_AT = 3
"""Backward steps from which a file is taken for rows of several writers, not a resumed run."""

_NUMERIC_TYPES = frozenset({float, int, type(None)})


def _numbers(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    """``row[key]`` for each row as float64; NaN where it is missing or not a number."""
    import numpy as np

    values: list[Any] = list(map(dict.get, rows, repeat(key)))
    if not _NUMERIC_TYPES.issuperset(map(type, values)):
        values = [v if type(v) in _NUMERIC_TYPES else None for v in values]
    return np.array(values, dtype=np.float64).reshape(-1)


class _Marker:
    __slots__ = ()


_BLANK: Any = _Marker()
_SKIPPED: Any = _Marker()
_ABSENT: Any = _Marker()
