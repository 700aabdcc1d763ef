"""The export worker (000 seed, "Stream selection" and "Custom exporters"; DESIGN §3.2 losses)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from tests.aggregator.export.sample import RECORDS_PER_FULL_ENVELOPE, full_envelope
from traceml_ai.aggregator.export import ExportRecord, ExportWorker, parse_export_streams, records_from_payload
from traceml_ai.telemetry.envelope import make_envelope

ALL = parse_export_streams("all")
PER_ENVELOPE = sum(RECORDS_PER_FULL_ENVELOPE.values())


class RecordingExporter:
    """A real exporter that keeps what it is given and checks how it is called."""

    def __init__(self, *, fail_in: str | None = None, exc: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.records: list[ExportRecord] = []
        self.batches: list[list[ExportRecord]] = []
        self.threads: set[int] = set()
        self.dropped: int | None = None
        self.fail_in = fail_in
        self.exc = exc or RuntimeError(f"exporter broke in {fail_in}")
        self._busy = threading.Lock()

    def _enter(self, name: str) -> None:
        assert self._busy.acquire(blocking=False), f"{name} overlapped another call"
        self.calls.append(name)
        self.threads.add(threading.get_ident())
        try:
            if name == self.fail_in:
                raise self.exc
        finally:
            self._busy.release()

    def open(self) -> None:
        self._enter("open")

    def write(self, records: Sequence[ExportRecord]) -> None:
        self._enter("write")
        self.batches.append(list(records))
        self.records.extend(records)

    def flush(self) -> None:
        self._enter("flush")

    def close(self, *, dropped_batches: int = 0) -> None:
        self._enter("close")
        self.dropped = dropped_batches


def run_worker(exporter: Any, payloads: list[Any], streams: tuple[str, ...] = ALL,
               **options: Any) -> tuple[ExportWorker, list[str]]:
    logged: list[str] = []
    worker = ExportWorker(exporter, name="tests:recording", streams=streams, log=logged.append, **options)
    worker.start()
    for payload in payloads:
        worker.submit(payload)
    worker.close()
    return worker, logged


def test_calls_come_from_one_background_thread_in_order_open_write_flush_close() -> None:
    exporter = RecordingExporter()
    worker, logged = run_worker(exporter, [full_envelope(0), full_envelope(1)])
    assert exporter.calls[0] == "open" and exporter.calls[-2:] == ["flush", "close"]
    assert set(exporter.calls[1:-2]) <= {"write", "flush"} and "write" in exporter.calls
    assert exporter.threads and threading.get_ident() not in exporter.threads and len(exporter.threads) == 1
    assert exporter.dropped == 0 and logged == []
    assert worker.report() == {
        "exporter": "tests:recording", "streams": list(ALL), "exporter_failed": False, "failure": None,
        "admitted_records": 2 * PER_ENVELOPE, "written_records": 2 * PER_ENVELOPE, "failed_records": 0,
        "dropped_batches": 0, "skipped": 0,
    }
    assert not worker.lost


def test_with_no_payload_the_exporter_is_opened_and_closed_without_write() -> None:
    exporter = RecordingExporter()
    run_worker(exporter, [])
    assert exporter.calls == ["open", "close"]


def test_the_exporter_gets_exactly_the_records_of_records_from_payload_for_the_selected_streams() -> None:
    payloads = [full_envelope(0), full_envelope(1, first_step=2)]
    streams = parse_export_streams("system,step_time")
    exporter = RecordingExporter()
    run_worker(exporter, payloads, streams)
    expected = [r for p in payloads for r in records_from_payload(p, streams=streams).records]
    strip = [{**r.to_dict(), "observed_timestamp_unix_ns": 0} for r in expected]
    assert [{**r.to_dict(), "observed_timestamp_unix_ns": 0} for r in exporter.records] == strip
    assert {r.STREAM for r in exporter.records} == {"step_time", "system", "system_gpu"}


def test_one_write_batch_may_hold_several_record_types_interleaved_in_payload_order() -> None:
    exporter = RecordingExporter()
    run_worker(exporter, [full_envelope(0), full_envelope(1)], parse_export_streams("step_memory,process"))
    streams = [r.STREAM for batch in exporter.batches for r in batch]
    assert streams == ["step_memory", "process", "step_memory", "process"]
    assert any(len({r.STREAM for r in batch}) > 1 for batch in exporter.batches)


def test_a_payload_that_gives_no_selected_record_is_not_a_dropped_batch() -> None:
    exporter = RecordingExporter()
    worker, _ = run_worker(exporter, [make_envelope({"global_rank": 0}, {"process": [{"seq": 1}]})], ("step_time",))
    assert exporter.calls == ["open", "close"] and exporter.dropped == 0 and worker.dropped_batches == 0


@pytest.mark.parametrize("method", ["open", "write", "flush", "close"])
def test_a_method_that_raises_is_logged_once_and_the_exporter_is_no_longer_used(method: str) -> None:
    exporter = RecordingExporter(fail_in=method)
    worker, logged = run_worker(exporter, [full_envelope(0), full_envelope(1)], flush_interval_s=0.01)
    assert exporter.calls.count(method) == 1 and exporter.calls[-1] == method  # nothing called after it
    assert len(logged) == 1
    assert logged[0].startswith("[TraceML] exporter 'tests:recording' failed in ")
    assert f"exporter broke in {method}" in logged[0]
    report = worker.report()
    assert report["exporter_failed"] is True and method in report["failure"] and worker.lost
    # every record admitted is written (delivery confirmed by a flush) or failed, also those that
    # came after the failure, never both (review 11e: 3 written + 76 failed of 76 admitted)
    assert report["admitted_records"] == 2 * PER_ENVELOPE
    assert report["written_records"] + report["failed_records"] == report["admitted_records"]
    if method == "close":  # the periodic flushes had confirmed every record before close raised
        assert report["written_records"] == 2 * PER_ENVELOPE and report["failed_records"] == 0
    else:
        assert report["written_records"] == 0 and report["failed_records"] == 2 * PER_ENVELOPE


class FailsOnSecondWrite(RecordingExporter):
    """Delivers one batch (its flush returns), then fails in the next write, as a full disk would."""

    def write(self, records: Sequence[ExportRecord]) -> None:
        if self.calls.count("write") == 1 and "flush" in self.calls:
            self.fail_in = "write"
        super().write(records)


def test_records_delivered_before_a_failure_are_written_and_only_the_rest_failed() -> None:
    """Review 11e: 3 records delivered, then write failed: the report said written 3, failed 76 of 76
    admitted, and the summary '76 records were not exported'."""
    import time

    exporter = FailsOnSecondWrite()
    logged: list[str] = []
    worker = ExportWorker(exporter, name="tests:recording", streams=ALL, log=logged.append, flush_interval_s=0.01)
    worker.start()
    worker.submit(full_envelope(0))
    deadline = time.monotonic() + 30
    while worker.written_records < PER_ENVELOPE:  # delivered: its flush returned
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.submit(full_envelope(1))
    worker.submit(full_envelope(2))
    worker.close()
    report = worker.report()
    assert report["exporter_failed"] is True and "write" in report["failure"] and len(logged) == 1
    assert report["admitted_records"] == 3 * PER_ENVELOPE
    assert report["written_records"] == PER_ENVELOPE and report["failed_records"] == 2 * PER_ENVELOPE


def test_close_is_not_called_when_open_raised() -> None:
    exporter = RecordingExporter(fail_in="open")
    run_worker(exporter, [full_envelope(0)])
    assert exporter.calls == ["open"]


def test_system_exit_from_an_exporter_method_is_a_failure_like_any_other() -> None:
    exporter = RecordingExporter(fail_in="write", exc=SystemExit(3))
    worker, logged = run_worker(exporter, [full_envelope(0)])
    assert worker.failed and "SystemExit: 3" in logged[0] and exporter.calls == ["open", "write"]


@pytest.mark.parametrize("method", ["open", "write", "flush", "close"])
def test_a_keyboard_interrupt_from_an_exporter_method_is_a_failure_like_any_other(method: str) -> None:
    """On the worker thread a KeyboardInterrupt is the exporter's own (Ctrl+C reaches the main thread):
    logged once, the exporter no longer used, the loss in the report; the thread does not die with it."""
    exporter = RecordingExporter(fail_in=method, exc=KeyboardInterrupt())
    worker, logged = run_worker(exporter, [full_envelope(0)], flush_interval_s=0.01)
    assert worker.closed and exporter.calls[-1] == method
    assert logged == [f"[TraceML] exporter 'tests:recording' failed in {method}: KeyboardInterrupt; export stopped, "
                      "the run goes on (see aggregator/finalization_warning.json)"]
    assert worker.report()["failure"] == f"{method}: KeyboardInterrupt"
    report = worker.report()
    assert report["written_records"] + report["failed_records"] == report["admitted_records"] == PER_ENVELOPE
    assert report["failed_records"] == (0 if method == "close" else PER_ENVELOPE)


class NoFlush:
    """An object that lacks one of the four methods: export fails when the worker first calls it."""

    def __init__(self) -> None:
        self.written = 0

    def open(self) -> None:
        pass

    def write(self, records: Sequence[ExportRecord]) -> None:
        self.written += len(records)

    def close(self, *, dropped_batches: int = 0) -> None:
        raise AssertionError("close must not be called after a failure")


def test_an_exporter_missing_a_method_fails_when_that_method_is_first_called() -> None:
    exporter = NoFlush()
    worker, logged = run_worker(exporter, [full_envelope(0)])
    assert exporter.written == PER_ENVELOPE  # write worked; flush did not exist
    assert worker.failed and "flush" in worker.report()["failure"] and "AttributeError" in logged[0]


def test_a_factory_failure_is_reported_by_the_worker_like_an_open_that_raised() -> None:
    worker, logged = run_worker(None, [full_envelope(0)], failure="cannot import my_exporters: ModuleNotFoundError")
    assert logged == ["[TraceML] exporter 'tests:recording' failed in factory: cannot import my_exporters: "
                      "ModuleNotFoundError; export stopped, the run goes on (see aggregator/finalization_warning.json)"]
    assert worker.report()["failed_records"] == PER_ENVELOPE


class GatedExporter(RecordingExporter):
    """Blocks in its first write until released, so payloads pile up behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, records: Sequence[ExportRecord]) -> None:
        self.entered.set()
        assert self.release.wait(30)
        super().write(records)


def test_payloads_that_find_the_queue_full_are_dropped_batches_counted_once_for_the_worker() -> None:
    exporter = GatedExporter()
    logged: list[str] = []
    worker = ExportWorker(exporter, name="gated", streams=ALL, max_queued_batches=2, log=logged.append)
    worker.start()
    worker.submit(full_envelope(0))
    assert exporter.entered.wait(30)
    for rank in range(1, 6):  # two fit in the queue, three are dropped
        worker.submit(full_envelope(rank))
    exporter.release.set()
    worker.close()
    assert worker.dropped_batches == 3 and exporter.dropped == 3 and worker.lost
    assert worker.report()["admitted_records"] == 3 * PER_ENVELOPE == len(exporter.records)
    assert not worker.failed and logged == []


class HangingExporter(RecordingExporter):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, records: Sequence[ExportRecord]) -> None:
        self.entered.set()
        self.release.wait(60)


def test_an_exporter_that_hangs_past_the_close_timeout_is_a_failure_and_its_queue_is_dropped() -> None:
    exporter = HangingExporter()
    logged: list[str] = []
    worker = ExportWorker(exporter, name="hangs", streams=ALL, log=logged.append)
    worker.start()
    worker.submit(full_envelope(0))
    worker.submit(full_envelope(1))
    assert exporter.entered.wait(30)  # the first payload is in write, the second waits in the queue
    worker.close(timeout_s=0.5)
    exporter.release.set()
    assert worker.failed and "did not finish within 0.5 s" in logged[0]
    assert worker.dropped_batches >= 1 and "close" not in exporter.calls


class SlowMethod(RecordingExporter):
    """Blocks inside ``method`` until released."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.entered = threading.Event()
        self.release = threading.Event()

    def _enter(self, name: str) -> None:
        super()._enter(name)
        if name == self.method:
            self.entered.set()
            self.release.wait(60)


@pytest.mark.parametrize("method", ["open", "write", "flush", "close"])
def test_the_timeout_message_names_the_method_that_was_running_at_the_deadline(method: str) -> None:
    """An exporter stuck in write is reported as failing in write, not in close (never reached)."""
    exporter = SlowMethod(method)
    logged: list[str] = []
    worker = ExportWorker(exporter, name="slow", streams=ALL, log=logged.append, flush_interval_s=0.01)
    worker.start()
    worker.submit(full_envelope(0))
    if method != "close":
        assert exporter.entered.wait(30)
    worker.close(timeout_s=0.5)
    exporter.release.set()
    assert logged == [f"[TraceML] exporter 'slow' failed in {method}: did not finish within 0.5 s; export stopped, "
                      "the run goes on (see aggregator/finalization_warning.json)"]
    assert worker.report()["failure"] == f"{method}: did not finish within 0.5 s"


def test_a_payload_submitted_after_close_is_a_dropped_batch() -> None:
    worker, _ = run_worker(RecordingExporter(), [])
    worker.submit(full_envelope(0))
    assert worker.dropped_batches == 1


def test_records_lost_while_building_are_counted_in_the_report() -> None:
    worker, _ = run_worker(RecordingExporter(), [["not an envelope", full_envelope(0)]])
    assert worker.report()["skipped"] == 1 and worker.lost


def test_frames_are_decoded_on_the_worker_thread_and_give_the_same_records_as_payloads() -> None:
    from traceml_ai.telemetry import frames

    body = frames.encode_frame([full_envelope(0), full_envelope(1)])[frames.HEADER.size:]
    exporter = RecordingExporter()
    logged: list[str] = []
    worker = ExportWorker(exporter, name="frames", streams=ALL, log=logged.append)
    worker.start()
    worker.submit_frame(body)
    worker.close()
    assert [r.STREAM for r in exporter.records] == [r.STREAM for r in records_from_payload(
        [full_envelope(0), full_envelope(1)]).records]
    assert worker.report()["admitted_records"] == 2 * PER_ENVELOPE and logged == []


def test_a_frame_that_would_pass_the_byte_bound_is_a_dropped_batch() -> None:
    from traceml_ai.telemetry import frames

    body = frames.encode_frame(full_envelope(0))[frames.HEADER.size:]
    exporter = GatedExporter()
    worker = ExportWorker(exporter, name="bytes", streams=ALL, max_queued_bytes=2 * len(body) + 1)
    worker.start()
    worker.submit_frame(body)
    assert exporter.entered.wait(30)  # the first frame is out of the queue, in write
    for _ in range(4):  # two fit in the byte bound, two do not
        worker.submit_frame(body)
    exporter.release.set()
    worker.close()
    assert worker.dropped_batches == 2 and exporter.dropped == 2
    assert len(exporter.records) == 3 * PER_ENVELOPE


def test_while_ingest_has_a_backlog_the_worker_waits_and_catches_up_when_it_is_over() -> None:
    from traceml_ai.telemetry import frames

    body = frames.encode_frame(full_envelope(0))[frames.HEADER.size:]
    backlog = threading.Event()
    backlog.set()
    exporter = RecordingExporter()
    worker = ExportWorker(exporter, name="polite", streams=ALL, busy=backlog.is_set, max_queued_batches=8)
    worker.start()
    for _ in range(3):
        worker.submit_frame(body)
    time.sleep(0.3)
    assert "write" not in exporter.calls  # ingest is busy and the queue is under half full: wait
    backlog.clear()
    deadline = time.monotonic() + 30
    while len(exporter.records) < 3 * PER_ENVELOPE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(exporter.records) == 3 * PER_ENVELOPE  # caught up once the backlog was over
    backlog.set()
    for _ in range(6):  # at half of the queue (4 of 8) and above, the worker stops waiting, busy or not
        worker.submit_frame(body)
    deadline = time.monotonic() + 30
    while len(exporter.records) < 5 * PER_ENVELOPE and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(exporter.records) in (5 * PER_ENVELOPE, 6 * PER_ENVELOPE)  # then under half: it waits again
    worker.close()  # stopping: no more waiting
    assert len(exporter.records) == 9 * PER_ENVELOPE and worker.dropped_batches == 0
