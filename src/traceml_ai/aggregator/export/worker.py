"""The export worker: admitted payloads → selected records → one exporter, on one background thread.

000 seed "Stream selection" and "Custom exporters", DESIGN §3.2 (losses are never silent), §3.4.

The aggregator's store thread hands every admitted payload frame to :meth:`ExportWorker.submit_frame`
(its msgpack body, undecoded) or a decoded payload to :meth:`ExportWorker.submit`, which only
queue it; the worker's own thread decodes it, builds the records of the selected streams with
:func:`~traceml_ai.aggregator.export.payload.build_records` (the selection is applied there,
once, before any exporter sees a record) and calls the exporter: ``open`` once, ``write`` per
group of queued payloads, ``flush`` every ``flush_interval_s`` and at the end, then
``close(dropped_batches=N)``.

Ingest comes first: SQLite is the run's record, the export a copy. While ``busy()`` says the
aggregator's writer thread has a backlog (a burst of frames), the worker waits, a few
milliseconds at a time, as long as its own queue is under half full; it catches up when the burst
is over. One Python process runs one thread at a time, so an export that competed for every
frame would slow ingest by what it costs (benchmarks/bench_export.py). A queue that passes half
full ends the waiting: then the export keeps pace at the cost of ingest, and beyond full it drops.

Losses:

- ``dropped_batches``: payloads never handed to ``write`` because the queue was full (the
  exporter was slower than the ranks) or the worker was stopped before reaching them. A payload
  that gives no selected record has nothing to hand over and is not a drop.
- A method that raises (or a factory that failed, given as ``failure``): the failure is logged
  once on stderr with the ``[TraceML]`` prefix, the exporter is no longer called (no ``close``
  either), and :meth:`ExportWorker.report` says ``exporter_failed: true`` with
  ``failed_records`` equal to the records admitted and not written (every record admitted when
  the exporter failed before any delivery, as a factory failure, the 000 document's case). The
  worker keeps counting the records it admits so that figure is whole; the aggregator and the
  training go on.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from traceml_ai.aggregator.export.exporter import Exporter
from traceml_ai.aggregator.export.payload import RecordBatch, build_records
from traceml_ai.aggregator.export.records import RECORD_STREAMS, ExportRecord
from traceml_ai.telemetry import frames

MAX_QUEUED_BATCHES = 4096
"""Payloads waiting for the worker; beyond that each new payload is a dropped batch."""
MAX_QUEUED_BYTES = 256 << 20
"""Frame bytes waiting for the worker (256 MiB); beyond that each new frame is a dropped batch."""
YIELD_S = 0.002
"""How long the worker waits at a time while ingest has a backlog (seconds)."""
BUSY_GRACE_S = 0.6
"""A backlog seen this recently (seconds) still counts: within a burst it empties for moments, and
after it the writer commits its last rows within its flush interval (0.5 s, DESIGN §3.3)."""
FLUSH_INTERVAL_S = 1.0
"""How often the exporter is flushed while records come in (seconds)."""
CLOSE_TIMEOUT_S = 30.0
"""How long :meth:`ExportWorker.close` waits for the queue to drain and the exporter to close."""
MAX_BATCH_RECORDS = 50_000
"""Queued payloads are gathered into one ``write`` until they hold this many records."""

_STOP = object()
_EMPTY = RecordBatch([], 0)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ExportWorker:
    """One exporter fed from one background thread.

    Args:
        exporter: the exporter, or None when its factory failed (then ``failure`` says why).
        name: the ``exporter`` setting's value (``jsonl``, ``otlp`` or ``module:factory``), for messages.
        streams: the selected record ``STREAM`` names (``parse_export_streams``).
        failure: why there is no exporter (a factory failure); treated like an ``open`` that raised.
        max_queued_batches, max_queued_bytes, flush_interval_s: see the module constants.
        busy: says whether ingest has a backlog (the worker then waits, see the module doc).
        log: where the one failure line goes (default: stderr).

    Example::

        worker = ExportWorker(JsonlExporter(context), name="jsonl", streams=("step_time",))
        worker.start()
        aggregator = Aggregator(run_dir, session_id, payload_sinks=[worker.submit])
        ...
        worker.close()
        block = worker.report()      # the "export" block of finalization_warning.json
    """

    def __init__(
        self,
        exporter: Exporter | None,
        *,
        name: str,
        streams: tuple[str, ...],
        failure: str | None = None,
        max_queued_batches: int = MAX_QUEUED_BATCHES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        busy: Callable[[], bool] | None = None,
        log: Callable[[str], None] = _stderr,
    ) -> None:
        if exporter is None and failure is None:
            raise ValueError("an ExportWorker needs an exporter or the failure that left it without one")
        self.exporter = exporter
        self.name = name
        self.streams = tuple(streams)
        # All streams: build every record without filtering (the same records, less work).
        self._selected = None if set(self.streams) >= set(RECORD_STREAMS) else frozenset(self.streams)
        self.flush_interval_s = flush_interval_s
        self._log = log
        self._queue: queue.Queue[Any] = queue.Queue(max_queued_batches)
        self._max_batches = max_queued_batches
        self._max_bytes = max_queued_bytes
        # Bytes queued = submitted - consumed; each counter has one writing thread, so no lock.
        self._submitted_bytes = 0
        self._consumed_bytes = 0
        self._busy = busy
        self._last_busy = -BUSY_GRACE_S
        self._thread = threading.Thread(target=self._run, name="traceml-export", daemon=True)
        self._failure_at_start = failure
        self.failure: str | None = None
        self.admitted_records = 0
        self.written_records = 0
        self.skipped = 0
        self.dropped_batches = 0
        self.closed = False
        self._stopping = False
        self._running: str | None = None  # the exporter method being called, for the timeout message
        self._unflushed = 0  # records write() took that no flush has confirmed yet

    # -- the aggregator's side ------------------------------------------------------------------------

    def set_busy(self, busy: Callable[[], bool] | None) -> None:
        """Set the ingest-backlog check (see the module doc); call before :meth:`start`."""
        self._busy = busy

    def start(self) -> None:
        """Start the worker thread (it calls ``open`` first)."""
        self._thread.start()

    def submit(self, payload: Any) -> None:
        """Queue one admitted payload (the aggregator's payload sink); never blocks.

        A payload that finds the queue full, or comes after :meth:`close`, is a dropped batch.
        """
        if self._stopping:
            self.dropped_batches += 1
            return
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.dropped_batches += 1

    def submit_frame(self, body: bytes) -> None:
        """Queue the msgpack body of one admitted payload frame (the aggregator's frame sink); never
        blocks. The worker decodes it. A frame that would pass :data:`MAX_QUEUED_BYTES` (or the
        batch bound) is a dropped batch."""
        if self._stopping or self._submitted_bytes - self._consumed_bytes + len(body) > self._max_bytes:
            self.dropped_batches += 1
            return
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped_batches += 1
            return
        self._submitted_bytes += len(body)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Let the worker export what is queued, flush and close the exporter; wait up to ``timeout_s``.

        When the worker is still busy after that (an exporter that hangs), it is left behind (a
        daemon thread), the export counts as failed and the payloads still queued as dropped.
        """
        self._stopping = True
        if not self._thread.is_alive():
            return
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=max(0.0, timeout_s))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # Name the exporter method still running at the deadline (close may never have been
            # reached); "worker" when the worker was between calls, building records.
            self._fail(self._running or "worker", f"did not finish within {timeout_s:g} s")
            self.dropped_batches += self._queue.qsize()

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def report(self) -> dict[str, Any]:
        """The ``export`` block of ``finalization_warning.json``.

        ``{"exporter", "streams", "exporter_failed", "failure", "admitted_records", "written_records",
        "failed_records", "dropped_batches", "skipped"}``: ``written_records`` counts the records
        handed to ``write`` whose delivery a later ``flush`` (or ``close``) confirmed by returning,
        so records an exporter only queued (otlp) and then failed to deliver are not written;
        ``failed_records`` is the admitted records not written when the exporter failed (so
        ``written_records + failed_records == admitted_records``; review 11e: it counted the
        written ones twice), else 0; ``skipped``
        the records_from_payload units lost.
        """
        return {
            "exporter": self.name,
            "streams": list(self.streams),
            "exporter_failed": self.failed,
            "failure": self.failure,
            "admitted_records": self.admitted_records,
            "written_records": self.written_records,
            "failed_records": max(0, self.admitted_records - self.written_records) if self.failed else 0,
            "dropped_batches": self.dropped_batches,
            "skipped": self.skipped,
        }

    @property
    def lost(self) -> bool:
        """Whether the report holds a loss (so finalization_warning.json must be written)."""
        return self.failed or self.dropped_batches > 0 or self.skipped > 0

    # -- the worker thread ----------------------------------------------------------------------------

    def _fail(self, where: str, message: str) -> None:
        if self.failure is not None:
            return
        self.failure = f"{where}: {message}"
        self._log(f"[TraceML] exporter {self.name!r} failed in {where}: {message}; export stopped, the run goes on "
                  "(see aggregator/finalization_warning.json)")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> bool:
        """Call the exporter's ``method``; on any ``BaseException`` (``SystemExit`` and
        ``KeyboardInterrupt`` included, and AttributeError for an exporter that lacks the method)
        record the failure and return False.

        A KeyboardInterrupt here is the exporter's own: the user's Ctrl+C (SIGINT) is delivered to
        the main thread, never to this one.
        """
        self._running = method
        try:
            getattr(self.exporter, method)(*args, **kwargs)
        except BaseException as exc:  # an exporter may raise anything; the aggregator must go on
            self._fail(method, _describe(exc))
            return False
        finally:
            self._running = None
        return True

    def _run(self) -> None:
        try:
            self._export()
        except BaseException as exc:  # a bug of ours: the export stops, on record; the aggregator goes on
            self._fail("worker", _describe(exc))

    def _export(self) -> None:
        exporter = self.exporter
        if self._failure_at_start is not None:
            self._fail("factory", self._failure_at_start)
        elif exporter is not None:
            self._call("open")
        last_flush = time.monotonic()
        dirty = False
        stop = False
        while not stop:
            self._wait_for_ingest()
            try:
                first = self._queue.get(timeout=self.flush_interval_s)
            except queue.Empty:
                first = None
            records: list[ExportRecord] = []
            if first is _STOP:
                stop = True
            elif first is not None:
                stop = self._gather(first, records)
            if records and not self.failed and exporter is not None:
                if self._call("write", records):
                    self._unflushed += len(records)
                    dirty = True
            now = time.monotonic()
            due = stop or now - last_flush >= self.flush_interval_s
            if dirty and due and not self.failed and exporter is not None:
                self._flush()
                last_flush = now
                dirty = False
        if not self.failed and exporter is not None:
            if dirty:
                self._flush()
            if not self.failed and self._call("close", dropped_batches=self.dropped_batches):
                self._confirm()
        self.closed = True

    def _flush(self) -> None:
        if self._call("flush"):
            self._confirm()

    def _confirm(self) -> None:
        """The records written since the last flush are delivered: a flush (or close) returned."""
        self.written_records += self._unflushed
        self._unflushed = 0

    def _should_wait(self) -> bool:
        """Whether ingest had a backlog within :data:`BUSY_GRACE_S` while the worker is not stopping
        and its queue is under half full (module doc: ingest comes first)."""
        busy = self._busy
        if busy is None or self._stopping:
            return False
        if self._queue.qsize() >= self._max_batches // 2:
            return False
        if self._submitted_bytes - self._consumed_bytes >= self._max_bytes // 2:
            return False
        now = time.monotonic()
        if busy():
            self._last_busy = now
        return now - self._last_busy < BUSY_GRACE_S

    def _wait_for_ingest(self) -> None:
        while self._should_wait():
            time.sleep(YIELD_S)

    def _gather(self, first: Any, records: list[ExportRecord]) -> bool:
        """Build the records of ``first`` and of the payloads queued behind it (up to
        :data:`MAX_BATCH_RECORDS`) into ``records``; return True when the stop mark was reached."""
        payload = first
        while True:
            if type(payload) is bytes:
                self._consumed_bytes += len(payload)
                try:
                    payload = frames.decode_body(payload)
                except frames.FrameError:  # admitted frames decode; count it all the same
                    payload = None
                    self.skipped += 1
            batch = build_records(payload, None, self._selected) if payload is not None else _EMPTY
            self.admitted_records += len(batch.records)
            self.skipped += batch.skipped
            records.extend(batch.records)
            if len(records) >= MAX_BATCH_RECORDS or self._should_wait():
                return False
            try:
                payload = self._queue.get_nowait()
            except queue.Empty:
                return False
            if payload is _STOP:
                return True
