"""A tiny test aggregator: a real TCP server on 127.0.0.1 speaking ``traceml_ai.telemetry.frames``.

It opens every connection with a challenge, welcomes hellos of its session (refuses others, or every
hello when ``refuse`` is set), records every
frame it receives, and can stop reading to let a client's queue fill up. One thread per connection:
fine for tests, unlike the real aggregator (DESIGN §3.2).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from traceml_ai.telemetry import frames, jobsecret

TEST_SECRET = "test-job-secret-0123456789abcdef"


class FrameServer:
    """Accepts rank connections and records ``hellos``, ``payloads`` (envelopes) and ``finished`` frames.

    Args:
        session_id: hellos of any other session are refused.
        refuse: when set, every hello is refused with this reason.
        port: 0 picks a free port; a fixed port lets a test restart a server in the same place.
        recv_buffer: SO_RCVBUF of accepted sockets (small makes a non-reading server fill up fast).
        close_after_welcome: close every connection right after its welcome.
    """

    def __init__(self, session_id: str = "sess-test", *, refuse: str | None = None, port: int = 0,
                 recv_buffer: int | None = None, secret: str = TEST_SECRET, close_after_welcome: bool = False) -> None:
        self.session_id = session_id
        self.close_after_welcome = close_after_welcome
        self.secret = secret
        self.refuse = refuse
        self.hellos: list[dict[str, Any]] = []
        self.payloads: list[Any] = []
        self.finished: list[dict[str, Any]] = []
        self.accepted = 0
        self._reading = threading.Event()
        self._reading.set()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if recv_buffer is not None:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(16)
        self.host, self.port = self._listener.getsockname()[:2]
        self._stopped = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def envelopes(self) -> list[dict[str, Any]]:
        """Every envelope received, payload lists flattened."""
        out: list[dict[str, Any]] = []
        with self._lock:
            for payload in self.payloads:
                out.extend(payload if isinstance(payload, list) else [payload])
        return out

    def rows(self, stream: str) -> list[dict[str, Any]]:
        return [row for env in self.envelopes for row in env["tables"].get(stream, [])]

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def stop(self) -> None:
        """Close the listener and every connection (as a crashed aggregator would)."""
        self._stopped = True
        self._reading.set()
        try:
            # Wakes the thread blocked in accept(); close() alone leaves the port listening on Linux.
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = frames.FrameReader()
        welcomed = False
        challenge = jobsecret.new_nonce()
        try:
            conn.sendall(frames.encode_frame(frames.challenge(challenge)))
            while True:
                self._reading.wait()
                if self._stopped:
                    return
                chunk = conn.recv(65536)
                if not chunk:
                    return
                reader.feed(chunk)
                for body in reader.bodies():
                    kind = frames.control_kind(body)
                    if not welcomed:
                        assert kind == frames.HELLO, body
                        with self._lock:
                            self.hellos.append(body)
                        reason = self.refuse
                        if reason is None and body.get("session_id") != self.session_id:
                            reason = f"wrong session {body.get('session_id')!r}"
                        nonce = str(body.get("nonce"))
                        if reason is None and not jobsecret.proof_matches(
                                jobsecret.hello_proof(self.secret, challenge, body), body.get("proof")):
                            reason = "no valid job secret proof"
                        if reason is not None:
                            conn.sendall(frames.encode_frame(frames.refused(reason)))
                            return
                        conn.sendall(frames.encode_frame(
                            frames.welcome(self.secret, self.session_id, challenge, nonce)))
                        if self.close_after_welcome:  # a flapping aggregator: every connection dies at once
                            return
                        welcomed = True
                    elif kind == frames.RANK_FINISHED:
                        with self._lock:
                            self.finished.append(body)
                    else:
                        with self._lock:
                            self.payloads.append(body)
        except OSError:
            return
        finally:
            conn.close()
