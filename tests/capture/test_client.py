"""The transport client against a real TCP server on 127.0.0.1 (DESIGN §3.2)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.client import TransportClient
from traceml_ai.telemetry import frames

IDENTITY = {"global_rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "node_rank": 1,
            "hostname": "node-b", "pid": 4242}


def envelope(i: int, pad: int = 0) -> dict[str, Any]:
    return {"meta": {"session_id": "sess-test", "global_rank": 3, "sampler": "test"},
            "tables": {"process": [{"seq": i, "timestamp_unix_ns": i, "pad": "x" * pad}]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server() -> Any:
    srv = FrameServer()
    yield srv
    srv.stop()


def make_client(address: tuple[str, int], **kwargs: Any) -> TransportClient:
    kwargs.setdefault("secret", TEST_SECRET)
    client = TransportClient(address, "sess-test", IDENTITY, **kwargs)
    client.start()
    return client


def test_hello_welcome_payloads_in_order_then_rank_finished(server: FrameServer) -> None:
    client = make_client(server.address)
    assert server.wait_for(lambda: client.connected)
    hello = server.hellos[0]
    assert hello["control"] == "hello" and hello["protocol"] == frames.PROTOCOL_VERSION
    assert hello["session_id"] == "sess-test"
    assert {k: hello[k] for k in IDENTITY} == IDENTITY
    for i in range(20):
        assert client.submit(envelope(i)) is True
    client.close(timeout_s=5)
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert [e["tables"]["process"][0]["seq"] for e in server.envelopes] == list(range(20))
    finished = server.finished[0]
    assert finished["sent_batches"] == 20 and finished["dropped_batches"] == 0
    assert finished["global_rank"] == 3 and finished["hostname"] == "node-b"
    assert client.finished_delivered and not client.connected


def test_refused_session_stops_sending_and_counts_everything_dropped(capfd: pytest.CaptureFixture[str]) -> None:
    srv = FrameServer(session_id="another-session")
    try:
        client = make_client(srv.address)
        assert srv.wait_for(lambda: client.refused_reason is not None)
        for i in range(5):
            assert client.submit(envelope(i)) is False
        client.close(timeout_s=2)
        assert client.dropped_batches == client.submitted_batches == 5
        assert client.sent_batches == 0
        assert srv.payloads == [] and srv.finished == []
        assert srv.accepted == 1  # a refusal is final: no reconnect attempts
    finally:
        srv.stop()
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[TraceML]")]
    assert len(lines) == 1 and "refused this rank (wrong session 'sess-test')" in lines[0]


def test_queue_full_drops_oldest_when_aggregator_absent() -> None:
    client = make_client(("127.0.0.1", free_port()), max_queue=4, backoff_max_s=0.2)
    for i in range(10):
        client.submit(envelope(i))
    assert client.dropped_batches == 6  # counted at submit time, the training thread never waits
    assert client.pending_batches == 4
    client.close(timeout_s=0.3)
    assert client.sent_batches == 0
    assert client.dropped_batches == client.submitted_batches == 10
    assert client.last_error is not None and "cannot connect" in client.last_error


def test_an_aggregator_that_comes_up_late_gets_the_newest_batches() -> None:
    """The rank started before its aggregator listened (a slow node 0): when the queue overflowed the
    oldest batches went, so the aggregator, once up, receives the newest ones, in order."""
    port = free_port()
    client = make_client(("127.0.0.1", port), max_queue=4, backoff_max_s=0.1)
    try:
        for i in range(10):
            client.submit(envelope(i))
        assert client.dropped_batches == 6 and client.pending_batches == 4
        srv = FrameServer(port=port)
        try:
            assert srv.wait_for(lambda: len(srv.payloads) == 4)
            client.close(timeout_s=5)
            assert srv.wait_for(lambda: len(srv.finished) == 1)
            assert [e["tables"]["process"][0]["seq"] for e in srv.envelopes] == [6, 7, 8, 9]
            assert srv.finished[0]["sent_batches"] == 4 and srv.finished[0]["dropped_batches"] == 6
        finally:
            srv.stop()
    finally:
        client.close(timeout_s=0.1)


def test_drop_oldest_when_server_stops_reading_and_newest_arrive_after_resume() -> None:
    srv = FrameServer(recv_buffer=4096)
    try:
        client = make_client(srv.address, max_queue=8)
        assert srv.wait_for(lambda: client.connected)
        srv.pause_reading()
        # 64 KiB envelopes: the socket buffers fill after a few, then the queue, then the oldest go.
        for i in range(200):
            client.submit(envelope(i, pad=64 * 1024))
        assert srv.wait_for(lambda: client.dropped_batches > 0)
        srv.resume_reading()
        client.close(timeout_s=20)
        assert srv.wait_for(lambda: len(srv.finished) == 1)
        got = [e["tables"]["process"][0]["seq"] for e in srv.envelopes]
        assert got == sorted(got) and got[-1] == 199  # the newest survive, order kept
        assert len(got) < 200
        finished = srv.finished[0]
        assert finished["sent_batches"] == len(got) == client.sent_batches
        assert finished["dropped_batches"] == 200 - len(got) == client.dropped_batches
    finally:
        srv.stop()


def test_reconnects_after_aggregator_restart_and_counts_add_up() -> None:
    srv = FrameServer()
    port = srv.port
    client = make_client(srv.address, backoff_max_s=0.1)
    try:
        assert srv.wait_for(lambda: client.connected)
        for i in range(5):
            client.submit(envelope(i))
        assert srv.wait_for(lambda: len(srv.payloads) == 5)
        srv.stop()
        for i in range(5, 10):
            client.submit(envelope(i))
        srv2 = FrameServer(port=port)
        try:
            assert srv2.wait_for(lambda: client.connections >= 2)
            for i in range(10, 15):
                client.submit(envelope(i))
            client.close(timeout_s=5)
            assert srv2.wait_for(lambda: len(srv2.finished) == 1)
            first = [e["tables"]["process"][0]["seq"] for e in srv.envelopes]
            second = [e["tables"]["process"][0]["seq"] for e in srv2.envelopes]
            assert first == list(range(5))
            assert second[-5:] == list(range(10, 15))
            finished = srv2.finished[0]
            # Batches sent into the dying connection are counted sent (no receipts in TCP), so the
            # rank-side books balance even where the aggregator saw fewer.
            assert finished["sent_batches"] + finished["dropped_batches"] == 15
            assert finished["sent_batches"] >= len(first) + len(second)
        finally:
            srv2.stop()
    finally:
        client.close(timeout_s=0.1)


def test_submit_never_blocks_the_caller_while_the_server_is_stuck() -> None:
    srv = FrameServer(recv_buffer=4096)
    try:
        client = make_client(srv.address, max_queue=2)
        assert srv.wait_for(lambda: client.connected)
        srv.pause_reading()
        done = threading.Event()

        def produce() -> None:
            for i in range(500):
                client.submit(envelope(i, pad=32 * 1024))
            done.set()

        threading.Thread(target=produce, daemon=True).start()
        # Generous bound: the point is that it finishes while the server reads nothing at all.
        assert done.wait(30)
        assert client.submitted_batches == 500 and client.dropped_batches >= 490
        client.close(timeout_s=0.5)  # server still stuck: the deadline bounds close
        assert client.sent_batches + client.dropped_batches == 500
    finally:
        srv.stop()


def test_a_row_msgpack_cannot_encode_is_left_out_and_counted_not_its_batch(server: FrameServer) -> None:
    """Review 11d: an integer beyond 64 bits dropped the whole batch, and the summary blamed a full
    send queue. Now only the rows that cannot be encoded are left out, counted by stream."""
    client = make_client(server.address)
    client.submit({"meta": {"session_id": "sess-test", "global_rank": 3},
                   "tables": {"process": [{"seq": 1}, {"bad": object()}, {"seq": 1 << 64}, {"seq": 2}],
                              "system": [{"seq": 1}]}})
    client.submit(envelope(1))
    client.close(timeout_s=5)
    assert server.wait_for(lambda: len(server.finished) == 1)
    finished = server.finished[0]
    assert finished["sent_batches"] == 2 and finished["dropped_batches"] == 0
    assert finished["unencodable_rows"] == {"process": 2}
    first = server.envelopes[0]["tables"]
    assert first == {"process": [{"seq": 1}, {"seq": 2}], "system": [{"seq": 1}]}
