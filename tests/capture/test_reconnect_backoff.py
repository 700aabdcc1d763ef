"""The rank's reconnect loop backs off against a port that keeps failing it (issue 12): a
listener that resets every connection, and an aggregator that drops every connection right after
its welcome. Real sockets; the count of connection attempts is what a squatted or flapping port
would see."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.client import TransportClient

WATCH_S = 3.0


class ResettingListener:
    """Accepts every connection and resets it at once (SO_LINGER 0), counting the attempts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _feed(client: TransportClient, seconds: float) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        client.submit({"meta": {"global_rank": 0}, "tables": {"process": [{"seq": n}]}})
        n += 1
        time.sleep(0.05)


def _attempts_allowed() -> int:
    # Doubling from 0.05 s: about 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of pauses fit in 3 s, so about
    # seven attempts (jitter only shortens a pause to half); a loop without a pause makes hundreds.
    return 12


@pytest.mark.timeout(60)
def test_a_listener_that_resets_every_connection_sees_few_attempts() -> None:
    listener = ResettingListener()
    client = TransportClient(("127.0.0.1", listener.port), "sess-test", {"global_rank": 0}, secret=TEST_SECRET)
    client.start()
    try:
        _feed(client, WATCH_S)
        attempts = listener.accepted
    finally:
        client.close(timeout_s=0.5)
        listener.close()
    assert 2 <= attempts <= _attempts_allowed(), attempts
    assert client.sent_batches == 0 and client.dropped_batches == client.submitted_batches


@pytest.mark.timeout(60)
def test_an_aggregator_that_drops_each_connection_after_its_welcome_sees_few_attempts() -> None:
    server = FrameServer(close_after_welcome=True)
    client = TransportClient(server.address, "sess-test", {"global_rank": 0}, secret=TEST_SECRET)
    client.start()
    try:
        _feed(client, WATCH_S)
        attempts = server.accepted
    finally:
        client.close(timeout_s=0.5)
        server.stop()
    assert 2 <= attempts <= _attempts_allowed(), attempts
    assert client.sent_batches + client.dropped_batches == client.submitted_batches
