"""The aggregator server over real loopback sockets (DESIGN §3.1 wire format, §3.2 transport rules)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.aggregator.wire import (
    SECRET,
    SESSION,
    AggregatorThread,
    RankClient,
    step_memory_rows,
    step_time_rows,
)
from traceml_ai.aggregator.store import open_readonly
from traceml_ai.telemetry import frames
from traceml_ai.telemetry.envelope import make_envelope


@pytest.fixture
def agg(tmp_path: Path) -> Any:
    server = AggregatorThread(tmp_path, world_size=2, flush_interval_s=0.05)
    yield server
    if server.thread.is_alive():
        server.stop()


def db_rows(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = open_readonly(run_dir / "aggregator" / "telemetry.sqlite")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_welcome_for_the_right_session_and_protocol(agg: AggregatorThread) -> None:
    client = agg.client(0)
    answer = client.hello()
    assert answer == frames.welcome(SECRET, SESSION, client.challenge or "", client.nonce)
    assert frames.welcome_is_genuine(answer, SECRET, SESSION, client.challenge or "", client.nonce)
    client.close()


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"session_id": "another-job"}, "session 'another-job'"),
    ({"protocol": 1}, "protocol 1 is not supported"),
    ({"control": "rank_finished"}, "first frame must be a hello"),
])
def test_a_bad_hello_is_refused_with_a_reason_and_closed(agg: AggregatorThread, tmp_path: Path,
                                                        overrides: dict[str, Any], reason: str) -> None:
    client = agg.client(1)
    answer = client.hello(**overrides)
    assert answer["control"] == frames.REFUSED and reason in answer["reason"]
    assert client.receive() is None  # the aggregator closed the connection
    agg.stop()
    # Refused before it proved anything: counted as a refused connection, never as a rank.
    assert agg.agg.stats.refused_connections == 1 and reason in agg.agg.stats.refusal_reasons[0]
    assert 1 not in agg.agg.stats.ranks


def test_a_payload_before_any_hello_is_refused(agg: AggregatorThread) -> None:
    client = agg.client(0)
    client.read_challenge()
    client.send({"step_memory": step_memory_rows(0, 3)})
    assert client.receive()["control"] == frames.REFUSED
    agg.stop()
    assert db_rows(agg.agg.run_dir, "SELECT count(*) FROM step_memory_samples") == [(0,)]


def test_interleaved_frames_of_two_ranks_all_arrive_with_their_identity(agg: AggregatorThread) -> None:
    clients = [agg.client(0), agg.client(1)]
    for client in clients:
        assert client.hello()["control"] == frames.WELCOME
    for batch in range(10):
        for client in clients:
            client.send({"step_time": step_time_rows(batch * 5, 5), "step_memory": step_memory_rows(batch * 5, 5)})
    for client in clients:
        client.finish()
        client.close()
    agg.stop()
    per_rank = db_rows(agg.agg.run_dir, "SELECT global_rank, rank, count(*), min(step), max(step) "
                                        "FROM step_time_samples GROUP BY global_rank ORDER BY global_rank")
    assert per_rank == [(0, 0, 50, 0, 49), (1, 1, 50, 0, 49)]
    steps = db_rows(agg.agg.run_dir, "SELECT step FROM step_memory_samples WHERE global_rank = 1 ORDER BY id")
    assert [s for (s,) in steps] == list(range(50))  # one rank's rows keep their order
    stats = agg.agg.stats
    for rank in (0, 1):
        r = stats.ranks[rank]
        assert (r.hellos, r.batches, r.rows, r.finished, r.sent_batches, r.dropped_batches) == (
            1, 10, 100, True, 10, 0)
    assert stats.rejected_frames == 0 and stats.projection_skipped == 0


def test_a_payload_of_another_session_is_rejected_and_the_connection_goes_on(agg: AggregatorThread) -> None:
    """A rank still sending for an old session (a restarted job reusing the port): its envelopes are
    rejected whole, also in payloads the fast projection hands to the generic one (a step of 1.5) and
    beside an envelope of this session in the same list; nothing of them is stored."""
    client = agg.client(0)
    client.hello()
    foreign = make_envelope({**client.meta, "session_id": "old-run"}, {"step_memory": step_memory_rows(0, 4)})
    client.send_body(foreign)
    odd = {"step_time": [{"step": 1.5}], "step_memory": step_memory_rows(100, 3)}  # the generic path
    client.send_body(make_envelope({**client.meta, "session_id": "old-run"}, odd))
    client.send_body([make_envelope(client.meta, {"step_memory": step_memory_rows(200, 2)}),
                      make_envelope({**client.meta, "session_id": "old-run"}, odd)])
    client.send_raw(frames.HEADER.pack(3) + b"\xc1\xc1\xc1")          # not msgpack
    client.send_body({"control": "hello", "protocol": frames.PROTOCOL_VERSION, "session_id": SESSION})  # a 2nd hello
    client.send({"step_memory": step_memory_rows(10, 2)})
    client.finish()
    client.close()
    agg.stop()
    assert db_rows(agg.agg.run_dir, "SELECT step FROM step_memory_samples ORDER BY id") == [(10,), (11,)]
    rank = agg.agg.stats.ranks[0]
    assert rank.rejected_frames == 5 and rank.rejected_batches == 4 and rank.batches == 1
    assert rank.undelivered_batches == 0
    assert any("old-run" in r for r in agg.agg.stats.rejection_reasons)


def test_a_frame_longer_than_the_limit_ends_the_connection(agg: AggregatorThread) -> None:
    client = agg.client(0)
    client.hello()
    client.send_raw(frames.HEADER.pack(frames.MAX_FRAME_BYTES + 1))
    assert client.receive() is None
    agg.stop()
    assert agg.agg.stats.ranks[0].rejected_frames == 1


def test_stdout_and_stderr_lines_go_to_the_rank_log_apart(agg: AggregatorThread) -> None:
    client = agg.client(1)
    client.hello()
    client.send({"stdout_stderr": [
        {"timestamp_unix_ns": 1, "line": "epoch 1 loss 0.25", "stream": "stdout"},
        {"timestamp_unix_ns": 2, "line": "UserWarning: slow", "stream": "stderr"},
        {"timestamp_unix_ns": 3, "line": ""},
    ]})
    client.finish()
    client.close()
    agg.stop()
    log = (agg.agg.folder / "rank_1.log").read_text()
    assert log == "stdout | epoch 1 loss 0.25\nstderr | UserWarning: slow\n"
    assert db_rows(agg.agg.run_dir, "SELECT rank, line FROM stdout_stderr_samples ORDER BY id") == [
        (1, "epoch 1 loss 0.25"), (1, "UserWarning: slow")]


def test_payload_sinks_get_every_admitted_payload_and_a_raising_sink_is_counted(tmp_path: Path) -> None:
    got: list[Any] = []

    def broken(payload: Any) -> None:
        raise RuntimeError("exporter bug")

    server = AggregatorThread(tmp_path, payload_sinks=[got.append, broken])
    client = server.client(0)
    client.hello()
    client.send({"step_memory": step_memory_rows(0, 2)})
    client.send_body([make_envelope(client.meta, {"step_time": [{"step": 1.5}]})])  # the generic path
    client.send_body(make_envelope({**client.meta, "session_id": "x"}, {"step_memory": []}))  # rejected
    client.finish()
    client.close()
    server.stop()
    assert len(got) == 2
    assert got[0]["tables"]["step_memory"][1]["step"] == 1
    assert isinstance(got[1], list) and got[1][0]["tables"]["step_time"] == [{"step": 1.5}]
    assert server.agg.stats.sink_errors == 2 and "exporter bug" in server.agg.stats.sink_messages[0]
    assert db_rows(tmp_path, "SELECT count(*) FROM step_memory_samples") == [(2,)]


def test_when_the_inbound_queue_is_full_the_connection_is_not_read(tmp_path: Path) -> None:
    server = AggregatorThread(tmp_path, inbound_max=2)
    release = threading.Event()
    server.agg.store.put_work(lambda: (release.wait(), ({}, []))[1])  # the writer is busy
    client = server.client(0)
    client.hello()
    client.sock.settimeout(0.5)
    frame = frames.encode_frame(make_envelope(client.meta, {"step_memory": step_memory_rows(0, 2000)}))
    sent = 0
    with pytest.raises((socket.timeout, TimeoutError)):
        for _ in range(10_000):  # far more than socket buffers hold
            client.sock.sendall(frame)
            sent += 1
    assert sent < 10_000  # the aggregator stopped reading: the sender blocked (backpressure)
    release.set()
    client.sock.settimeout(30)
    client.close()
    time.sleep(0.2)
    server.stop(grace_s=10)
    stats = server.agg.stats
    assert stats.ranks[0].batches >= sent  # every whole frame that was sent arrived; none was dropped
    assert db_rows(tmp_path, "SELECT count(*) FROM step_memory_samples") == [(stats.ranks[0].batches * 2000,)]


def test_stop_waits_for_ranks_that_are_still_sending(tmp_path: Path) -> None:
    server = AggregatorThread(tmp_path)
    client = server.client(0)
    client.hello()

    def late_sender() -> None:
        time.sleep(0.3)
        client.send({"step_memory": step_memory_rows(0, 3)})
        client.finish()
        client.close()

    sender = threading.Thread(target=late_sender)
    sender.start()
    server.stop(grace_s=5)
    sender.join()
    assert server.agg.stats.ranks[0].finished
    assert db_rows(tmp_path, "SELECT count(*) FROM step_memory_samples") == [(3,)]
    with pytest.raises(OSError):
        RankClient(server.port, 1)  # no longer accepting


def test_rank_finished_step_counts_are_kept_and_wrong_typed_ones_skipped(agg: AggregatorThread) -> None:
    for rank, counts in ((0, {"discarded_steps": 2, "dropped_updates": 1, "dropped_micro_batches": 3}),
                         (1, {"discarded_steps": "2", "dropped_updates": -1, "dropped_micro_batches": True,
                              "later_counter": 4})):
        client = agg.client(rank)
        client.hello()
        ident = {k: v for k, v in client.meta.items() if k != "session_id"}
        client.send_body(frames.rank_finished(ident, 0, 0, step_counts=counts))
        client.close()
    agg.stop()
    assert agg.agg.stats.ranks[0].step_counts == {"discarded_steps": 2, "dropped_updates": 1,
                                                  "dropped_micro_batches": 3}
    assert agg.agg.stats.ranks[1].step_counts == {"later_counter": 4}  # a string, a negative, a bool: skipped
    assert agg.agg.stats.ranks[1].finished
