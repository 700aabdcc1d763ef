"""One read of a telemetry database for the answers the Performance view asks for together
(issue 13 item 5).

The page asks ``GET /api/runs/{key}/telemetry`` and ``/performance`` at the same time; both are
built from :func:`traceml_ai.diagnose.read_telemetry` of the same ``aggregator/telemetry.sqlite``,
which for a long run is most of the cost. :func:`shared_read` lets the second answer use the first
one's read: the :class:`~traceml_ai.diagnose.readers.Telemetry` is kept for :data:`KEEP_S` seconds
(at most :data:`KEEP_DATABASES` databases), keyed by the database's real path and the
``(mtime_ns, size)`` of it and its ``-wal`` file, so a database that changed is read again. A request
that comes while the same database is being read waits for that read instead of starting another.
A read without ``totals`` (what the charts need: ``read_telemetry(..., totals=False)``) is served by
a kept full read too, never the other way round. Read-only, like the reader.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Final

from traceml_ai.diagnose.readers import Telemetry, read_telemetry
from traceml_ai.diagnose.timeline import StepTable, build_step_table

KEEP_S: Final = 30.0
"""How long a read is kept for the other answers (a few seconds would do: the page asks at once)."""
KEEP_DATABASES: Final = 4
"""Databases kept at most (two runs side by side, each asked for twice, and compared)."""

_Stamp = tuple[int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


class SharedReads:
    """Reads of telemetry databases, each shared by the answers that ask within :data:`KEEP_S`."""

    def __init__(self, keep_s: float = KEEP_S, max_databases: int = KEEP_DATABASES) -> None:
        self.keep_s = keep_s
        self.max_databases = max_databases
        self._kept: OrderedDict[str, tuple[tuple[_Stamp, _Stamp], float, Telemetry, bool]] = OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._tables: OrderedDict[int, tuple[Telemetry, StepTable]] = OrderedDict()
        self._lock = threading.Lock()
        self._pins = threading.local()
        self.reads = 0
        """How many databases were read (tests count them)."""

    @contextmanager
    def pinned(self, db_path: str | os.PathLike[str], *, totals: bool = True) -> Iterator[Telemetry]:
        """Read ``db_path`` (as :meth:`read`) and answer every :meth:`read` of it in this thread with
        that one read until the block ends, even if the database changes meanwhile: the answers
        built in the block then describe the same rows (a live run's step count and its charts
        agree; issue 13)."""
        tel = self.read(db_path, totals=totals)
        path = os.path.realpath(db_path)
        reads: dict[str, tuple[Telemetry, bool]] = getattr(self._pins, "reads", {})
        before = reads.get(path)
        reads[path] = (tel, totals)
        self._pins.reads = reads
        try:
            yield tel
        finally:
            if before is None:
                reads.pop(path, None)
            else:
                reads[path] = before

    def clear(self) -> None:
        """Forget every read kept (the benchmark's cold start)."""
        with self._lock:
            self._kept.clear()
            self._tables.clear()

    def step_table(self, tel: Telemetry) -> StepTable:
        """``build_step_table(tel.steps, warmup_steps=0)`` (every step, warm-up included: the charts
        shade it), built once per read and shared like the read. Treat it as read-only."""
        with self._lock:
            hit = self._tables.get(id(tel))
        if hit is not None and hit[0] is tel:
            return hit[1]
        table = build_step_table(tel.steps, warmup_steps=0)
        with self._lock:
            self._tables[id(tel)] = (tel, table)  # the read is held too, so its id is not reused
            while len(self._tables) > self.max_databases:
                self._tables.popitem(last=False)
        return table

    def read(self, db_path: str | os.PathLike[str], *, totals: bool = True) -> Telemetry:
        """:func:`~traceml_ai.diagnose.read_telemetry` of ``db_path`` (``totals`` as there), or the
        read another answer made of the same, unchanged database less than ``keep_s`` seconds ago
        (with totals, when ``totals`` is asked for). Never raises for a bad file (see
        :class:`~traceml_ai.diagnose.readers.Telemetry` ``status``)."""
        path = os.path.realpath(db_path)
        pins: dict[str, tuple[Telemetry, bool]] = getattr(self._pins, "reads", {})
        pinned = pins.get(path)
        if pinned is not None and (pinned[1] or not totals):
            return pinned[0]
        with self._lock:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:  # a second request for the same database waits for the first one's read
            stamps = (_stamp(path), _stamp(path + "-wal"))
            now = time.monotonic()
            with self._lock:
                hit = self._kept.get(path)
            if (hit is not None and hit[0] == stamps and now - hit[1] < self.keep_s and stamps[0] is not None
                    and (hit[3] or not totals)):
                return hit[2]
            tel = read_telemetry(path, totals=totals)
            self.reads += 1
            with self._lock:
                self._kept[path] = (stamps, time.monotonic(), tel, totals)
                self._kept.move_to_end(path)
                while len(self._kept) > self.max_databases:
                    gone, _ = self._kept.popitem(last=False)
                    self._locks.pop(gone, None)
                for old in [k for k, (_, at, _, _) in self._kept.items() if now - at >= self.keep_s]:
                    del self._kept[old]
            return tel


SHARED: Final = SharedReads()


def shared_read(db_path: str | os.PathLike[str], *, totals: bool = True) -> Telemetry:
    """:meth:`SharedReads.read` on the process's one :class:`SharedReads`."""
    return SHARED.read(db_path, totals=totals)


def pinned_read(db_path: str | os.PathLike[str], *, totals: bool = True) -> AbstractContextManager[Telemetry]:
    """:meth:`SharedReads.pinned` on the process's one :class:`SharedReads`."""
    return SHARED.pinned(db_path, totals=totals)


def shared_step_table(tel: Telemetry) -> StepTable:
    """:meth:`SharedReads.step_table` on the process's one :class:`SharedReads`."""
    return SHARED.step_table(tel)


def missing_database_detail(run_dir: str) -> str:
    """Why a run with an ``aggregator/`` folder has no ``telemetry.sqlite``, in the words of the run
    table and the CLI (review 13i: one removed database was said three ways): with a final summary
    the capture had written one, removed since; without, the run has none (yet)."""
    from traceml_ai.diagnose.perf import telemetry_damage
    from traceml_ai.diagnose.summary import AGGREGATOR_DIR, FINAL_SUMMARY, TELEMETRY_DB

    if os.path.isfile(os.path.join(run_dir, AGGREGATOR_DIR, FINAL_SUMMARY)):
        said = telemetry_damage(run_dir, summarised=True)
        if said is not None:
            return said
    return f"no {AGGREGATOR_DIR}/{TELEMETRY_DB} in this run"
