"""The rank's transport client: payload frames to the aggregator on a background thread (DESIGN §3.2).

The training side only ever calls :meth:`TransportClient.submit`, which appends to a bounded queue
under a lock and returns at once; everything that can block (connect, hello/welcome, sends,
backoff) happens on the client's own daemon thread. Losses are counted, never silent:

- queue full → the *oldest* queued batch is dropped and counted;
- aggregator unreachable or the connection breaks → reconnect with jittered exponential backoff; a batch
  whose frame was cut off by the break is resent whole on the next connection (the aggregator
  never saw all of it, so this cannot duplicate it); batches still queued when ``close`` runs out
  of time are dropped;
- the aggregator refuses the hello → one ``[TraceML]`` line on stderr, nothing more is sent, every
  queued and later batch counts as dropped;
- the listener does not open with a challenge, or answers the hello with something other than a
  welcome that proves it holds the job secret (a process squatting on the aggregator's port) →
  the same: one line, nothing but (at most) the hello is sent to it, every batch counts as
  dropped (:attr:`TransportClient.unverified`).

The hello answers the aggregator's per-connection challenge and proves this rank holds the job
secret (:mod:`~traceml_ai.telemetry.jobsecret`); the secret itself never goes on the wire, and a
hello caught by a squatter is of no use on any other connection.

On :meth:`TransportClient.close` the queue is flushed and the last frame is ``rank_finished`` with
``sent_batches`` and ``dropped_batches``; after close, ``sent + dropped == submitted``.

A batch whose frame the kernel accepted counts as sent: TCP gives no receipt, so a connection that
dies with data still in the kernel's buffers loses it unseen here. The aggregator's own received
count, compared with ``sent_batches``, is what reveals that.
"""

from __future__ import annotations

import random
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from traceml_ai.telemetry import frames, jobsecret

DEFAULT_MAX_QUEUE = 256
"""Batches held while the aggregator is slow or away; at 1 envelope per second that is ~4 minutes."""

_SEND_SLICE_S = 0.2  # socket timeout of one send attempt, so a stuck peer never hides the close deadline
_HEALTHY_CONNECTION_S = 1.0  # a connection that lasted this long was working: its break resets the backoff


def warn(message: str) -> None:
    """One ``[TraceML]`` line on the process's real stderr (never raises)."""
    stream = sys.__stderr__ or sys.stderr
    try:
        if stream is not None:
            stream.write(f"[TraceML] {message}\n")
            stream.flush()
    except (OSError, ValueError):
        pass


class TransportClient:
    """Sends telemetry payloads of one rank to the aggregator at ``address`` (DESIGN §3.1–3.2).

    Args:
        address: ``(host, port)`` of the aggregator.
        session_id: the session of this run; the aggregator refuses any other.
        secret: the job secret (``TRACEML_JOB_SECRET``); the hello proves this rank holds it and
            the welcome must prove the aggregator does.
        identity: the rank's identity fields (envelope ``meta`` without ``sampler``) sent in the
            hello and rank_finished frames.
        max_queue: batches held before the oldest is dropped (>= 1).
        connect_timeout_s: seconds one connection attempt may take.
        welcome_timeout_s: seconds to wait for the aggregator's welcome after the hello.
        first_welcome_wait_s: seconds after :meth:`start` that the first connection may wait for
            the aggregator's challenge, even past :meth:`close`'s deadline (the launcher started
            the training before the aggregator listens; 0: no such wait).
        backoff_initial_s, backoff_max_s: the reconnect delay starts at the first and doubles up to
            the second after each failed attempt or connection that broke within
            :data:`_HEALTHY_CONNECTION_S` of its welcome; each pause is jittered down to half its
            length. A connection that broke after working longer is retried at once.

    Example::

        client = TransportClient(("127.0.0.1", 7000), "sess-1", identity.meta(), secret=job_secret)
        client.start()
        client.submit(envelope)          # O(1), never blocks, never raises
        client.close(timeout_s=2.0)      # flush, rank_finished, stop the thread
        assert client.sent_batches + client.dropped_batches == client.submitted_batches
    """

    def __init__(
        self,
        address: tuple[str, int],
        session_id: str,
        identity: Mapping[str, Any],
        *,
        secret: str,
        max_queue: int = DEFAULT_MAX_QUEUE,
        connect_timeout_s: float = 2.0,
        welcome_timeout_s: float = 5.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 5.0,
        first_welcome_wait_s: float = 0.0,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self.address = address
        self.session_id = session_id
        self._secret = secret
        self.identity = dict(identity)
        self._max_queue = max_queue
        self._connect_timeout_s = connect_timeout_s
        self._welcome_timeout_s = welcome_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._first_welcome_wait_s = first_welcome_wait_s
        self._first_welcome_by = 0.0  # monotonic end of that wait, set by start()
        self._pending_until = 0.0  # a first connection is waiting for its welcome until then
        self._close_timeout_s = 0.0
        self._jitter = random.Random()  # seeded from the OS: ranks restarted together spread out

        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Any] = deque()
        self._submitted = 0
        self._sent = 0
        self._dropped = 0
        self._dropped_output_lines = 0
        self._lost_rows: dict[str, int] = {}
        self._unencodable_rows: dict[str, int] = {}  # {stream: rows} msgpack could not encode
        self._step_counts: dict[str, int] = {}
        self._connections = 0
        self._closing = False
        self._deadline = float("inf")
        self._refused_reason: str | None = None
        self._unverified = False
        self._last_error: str | None = None
        self._finished_delivered = False
        self._connected = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._close_requested = threading.Event()

    # -- training side ---------------------------------------------------------------------------

    def submit(self, payload: Any) -> bool:
        """Queue one payload (an envelope or a list of envelopes) for sending.

        O(1) and non-blocking. When the queue is full the oldest queued batch is dropped. After a
        refusal or after :meth:`close` the payload itself is dropped.

        Returns:
            True when queued, False when it was counted as dropped at once.
        """
        with self._cond:
            self._submitted += 1
            if self._refused_reason is not None or self._closing or self._stopped:
                self._dropped += 1
                return False
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self._dropped += 1
            self._queue.append(payload)
            self._cond.notify()
            return True

    # -- counters ------------------------------------------------------------------------------------

    @property
    def submitted_batches(self) -> int:
        """Payloads passed to :meth:`submit`."""
        return self._submitted

    @property
    def sent_batches(self) -> int:
        """Payload frames written whole to a welcomed connection."""
        return self._sent

    @property
    def dropped_batches(self) -> int:
        """Payloads that will never be sent (queue overflow, refusal, close deadline, unencodable)."""
        return self._dropped

    @property
    def pending_batches(self) -> int:
        """Payloads neither sent nor dropped yet (queued or being sent)."""
        with self._cond:
            return self._submitted - self._sent - self._dropped

    @property
    def connected(self) -> bool:
        """True while a connection is open and the aggregator has welcomed it."""
        return self._connected

    @property
    def connections(self) -> int:
        """How many connections the aggregator has welcomed so far (reconnects included)."""
        return self._connections

    @property
    def refused_reason(self) -> str | None:
        """The aggregator's reason when it refused this rank, else None."""
        return self._refused_reason

    @property
    def unverified(self) -> bool:
        """True when the listener at the address could not prove it is this job's aggregator."""
        return self._unverified

    @property
    def last_error(self) -> str | None:
        """The last connection failure, one line, or None."""
        return self._last_error

    @property
    def finished_delivered(self) -> bool:
        """True once the rank_finished frame was written whole to the aggregator."""
        return self._finished_delivered

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sender thread (a daemon: it never keeps the interpreter alive). Idempotent."""
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            self._first_welcome_by = time.monotonic() + max(0.0, self._first_welcome_wait_s)
            self._thread = threading.Thread(target=self._run, name="traceml-transport", daemon=True)
            self._thread.start()

    def close(
        self,
        timeout_s: float = 2.0,
        *,
        dropped_output_lines: int = 0,
        lost_rows: dict[str, int] | None = None,
        step_counts: dict[str, int] | None = None,
    ) -> None:
        """Flush what is queued, send rank_finished, and stop, all within about ``timeout_s`` seconds.

        ``dropped_output_lines`` (stdout/stderr lines the rank's output capture lost) and ``lost_rows``
        ({stream: rows} its row sources lost) travel in the rank_finished frame so that the
        aggregator reports them, and so do ``step_counts`` (steps left without a row by design:
        ``StepTracer.step_counts``), which the run's summary shows. Batches still unsent at the deadline
        are counted as dropped. Never raises; calling it again does nothing.
        """
        with self._cond:
            if self._stopped or self._closing:
                return
            self._dropped_output_lines = dropped_output_lines
            self._lost_rows = dict(lost_rows or {})
            self._step_counts = dict(step_counts or {})
            self._closing = True
            self._close_timeout_s = max(0.0, timeout_s)
            self._deadline = time.monotonic() + self._close_timeout_s
            thread = self._thread
            self._cond.notify_all()
        self._close_requested.set()
        if thread is not None:
            # A first connection still waiting for the welcome of an aggregator that is starting
            # (``first_welcome_wait_s``) moves the deadline on; the join follows it.
            while thread.is_alive():
                left = max(self._deadline, self._pending_until + self._close_timeout_s) + 1.0 - time.monotonic()
                if left <= 0:
                    break
                thread.join(min(left, 0.25))
        with self._cond:
            # A thread that never started, or one still stuck past its deadline, leaves batches behind.
            self._dropped += len(self._queue)
            self._queue.clear()
            self._stopped = True

    def abandon(self) -> None:
        """Forget everything without sending (used in a forked child, whose copy of the thread is gone)."""
        self._stopped = True
        self._closing = True

    # -- sender thread ---------------------------------------------------------------------------------

    def _remaining(self) -> float:
        return max(self._deadline, self._pending_until) - time.monotonic()

    def _run(self) -> None:
        sock: socket.socket | None = None
        frame: memoryview | None = None
        offset = 0
        backoff = self._backoff_initial_s
        pause = False  # the last attempt failed, or its connection died young: wait before the next one
        connected_at: float | None = None
        try:
            while self._refused_reason is None:
                if self._closing and self._remaining() <= 0:
                    break
                if sock is None:
                    if self._closing and frame is None and not self._queue:
                        break  # nothing left to send; rank_finished below gets its own attempt
                    if connected_at is not None and time.monotonic() - connected_at >= _HEALTHY_CONNECTION_S:
                        # The connection that just broke had worked: retry at once, then back off anew.
                        pause, backoff = False, self._backoff_initial_s
                    connected_at = None
                    if pause:
                        # Exponential backoff with jitter: a port that keeps failing (a reset, or
                        # an aggregator that drops each connection after its welcome) sees a few
                        # attempts a second at first and one per backoff_max_s later, not a storm.
                        self._sleep(backoff * self._jitter.uniform(0.5, 1.0))
                        backoff = min(backoff * 2, self._backoff_max_s)
                    # Nothing leaves the queue before a connection is welcomed, so while the
                    # aggregator is away every waiting batch takes part in drop-oldest.
                    sock = self._connect()
                    pause = True
                    if sock is None:
                        if self._refused_reason is not None:
                            break
                        continue
                    connected_at = time.monotonic()
                if frame is None:
                    frame = self._next_frame(wait=True)
                    offset = 0
                    if frame is None:
                        if self._closing:
                            break
                        continue
                if offset == 0 and self._peer_gone(sock):
                    self._drop_connection(sock, "the aggregator closed the connection")
                    sock = None
                    continue
                try:
                    offset += sock.send(frame[offset:])
                except TimeoutError:
                    continue
                except OSError as exc:
                    # The aggregator never saw this frame whole: resend it from its start.
                    self._drop_connection(sock, f"send failed: {exc}")
                    sock = None
                    offset = 0
                    continue
                if offset >= len(frame):
                    with self._cond:
                        self._sent += 1
                    frame = None
                    offset = 0
            with self._cond:
                # Cut off by the deadline or a refusal: whatever is left will never be sent.
                self._dropped += len(self._queue) + (1 if frame is not None else 0)
                self._queue.clear()
            if self._refused_reason is None and self._closing:
                if sock is None and self._remaining() > 0:
                    sock = self._connect()
                if sock is not None and offset == 0:
                    self._send_finished(sock)
        except Exception as exc:  # the sender must never take the process down
            self._last_error = f"transport thread failed: {exc!r}"
            with self._cond:
                self._dropped += len(self._queue) + (1 if frame is not None else 0)
                self._queue.clear()
        finally:
            if sock is not None:
                self._drop_connection(sock, None)

    def _next_frame(self, *, wait: bool) -> memoryview | None:
        """The next queued payload encoded as a frame (None: queue empty); waits briefly when ``wait``."""
        with self._cond:
            if not self._queue and wait and not self._closing:
                self._cond.wait(_SEND_SLICE_S)
        while True:
            with self._cond:
                if not self._queue:
                    return None
                payload = self._queue.popleft()
            try:
                return memoryview(frames.encode_frame(payload))
            except (TypeError, ValueError, OverflowError) as exc:
                # A row holding a value msgpack cannot hold (an integer beyond 64 bits, an object
                # that is not data): leave out just those rows, counted by stream, not the batch.
                kept, lost = _encodable_part(payload)
                if lost:
                    self._last_error = f"{sum(lost.values())} row(s) could not be encoded ({exc}); left out"
                    with self._cond:
                        for stream, n in lost.items():
                            self._unencodable_rows[stream] = self._unencodable_rows.get(stream, 0) + n
                    try:
                        return memoryview(frames.encode_frame(kept))
                    except (TypeError, ValueError, OverflowError) as again:
                        exc = again
                self._last_error = f"a payload could not be encoded: {exc}"
                with self._cond:
                    self._dropped += 1

    def _sleep(self, seconds: float) -> None:
        # Its own event, not the queue's condition: a submit must not cut the backoff short.
        if self._closing:
            seconds = min(seconds, self._remaining())
        if seconds > 0:
            self._close_requested.wait(seconds)

    def _timeout(self, limit: float) -> float:
        if self._closing:
            return max(0.01, min(limit, self._remaining()))
        return limit

    def _connect(self) -> socket.socket | None:
        """Connect, send hello, wait for welcome. None on failure (sets ``refused_reason`` on a refusal)."""
        try:
            return self._handshake()
        finally:
            self._pending_until = 0.0  # a first connection's wait ends with its handshake, whatever came

    def _handshake(self) -> socket.socket | None:
        host, port = self.address
        try:
            sock = socket.create_connection((host, port), timeout=self._timeout(self._connect_timeout_s))
        except OSError as exc:
            self._last_error = f"cannot connect to {host}:{port}: {exc}"
            return None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._timeout(self._connect_timeout_s))
            reader = frames.FrameReader(frames.MAX_HELLO_BYTES)  # the peer has not proved itself yet
            wait = self._timeout(self._welcome_timeout_s)
            now = time.monotonic()
            if self._connections == 0 and self._first_welcome_by > now:
                # The launcher started the training before the aggregator listens: the connection
                # sits in the socket's queue until it accepts, even past the close deadline.
                wait = max(wait, self._first_welcome_by - now)
                self._pending_until = now + wait
            first = self._read_control(sock, reader, wait)
            challenge = frames.challenge_value(first)
            nonce = ""
            if challenge is None:
                answer = first  # a refusal (e.g. too many waiting connections), or not our aggregator
            else:
                nonce = jobsecret.new_nonce()
                hello = frames.hello(self.session_id, self.identity, self._secret, challenge, nonce)
                sock.sendall(frames.encode_frame(hello))
                answer = self._read_control(sock, reader, self._timeout(self._welcome_timeout_s))
        except (OSError, frames.FrameError) as exc:
            self._last_error = f"hello to {host}:{port} failed: {exc}"
            sock.close()
            return None
        if first is None:
            sock.close()
            self._last_error = f"no challenge from {host}:{port}"
            return None
        kind = frames.control_kind(answer)
        if challenge is None and kind != frames.REFUSED:
            # Something answers on that port, but not with this protocol's challenge: a listener
            # that is not this job's aggregator (or an aggregator of another TraceML version).
            sock.close()
            self._unverified = True
            self._refuse(f"it did not open with a protocol {frames.PROTOCOL_VERSION} challenge: it may be another "
                         "process on that port, or an aggregator of another TraceML version",
                         what="could not be verified as this job's aggregator")
            return None
        if kind == frames.WELCOME and isinstance(answer, dict) and answer.get("protocol") == frames.PROTOCOL_VERSION:
            assert challenge is not None
            if frames.welcome_is_genuine(answer, self._secret, self.session_id, challenge, nonce):
                sock.settimeout(_SEND_SLICE_S)
                self._connected = True
                self._connections += 1
                if self._pending_until:
                    with self._cond:  # welcomed late, after close(): the usual time to send what waits
                        if self._closing:
                            self._deadline = max(self._deadline, time.monotonic() + self._close_timeout_s)
                        self._pending_until = 0.0
                return sock
            sock.close()
            self._unverified = True
            self._refuse("its welcome does not prove it holds this job's secret: it may be another process on "
                         "that port, or a job started with a different TRACEML_JOB_SECRET",
                         what="could not be verified as this job's aggregator")
            return None
        sock.close()
        if kind == frames.REFUSED or kind == frames.WELCOME:
            reason = _short(answer.get("reason")) if isinstance(answer, dict) else None
            if kind == frames.WELCOME:
                reason = f"protocol {_short(answer.get('protocol'))}, this rank speaks {frames.PROTOCOL_VERSION}"
            self._refuse(str(reason or "no reason given"))
        else:
            self._last_error = f"no welcome from {host}:{port}"
        return None

    @staticmethod
    def _read_control(sock: socket.socket, reader: frames.FrameReader, timeout_s: float) -> Any:
        """The next frame the peer sends, or None when it closes or stays silent for ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while True:
            for body in reader.bodies():
                return body
            left = end - time.monotonic()
            if left <= 0:
                return None
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                return None
            reader.feed(chunk)

    def _refuse(self, reason: str, what: str = "refused this rank") -> None:
        with self._cond:
            self._refused_reason = reason
            self._dropped += len(self._queue)
            self._queue.clear()
        host, port = self.address
        warn(f"the telemetry aggregator at {host}:{port} {what} ({reason}); its telemetry is dropped")

    def _peer_gone(self, sock: socket.socket) -> bool:
        """True when the aggregator has closed its side (readable with EOF) or sent a refusal."""
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            sock.setblocking(False)
            try:
                data = sock.recv(65536)
            finally:
                sock.settimeout(_SEND_SLICE_S)
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True
        if not data:
            return True
        reader = frames.FrameReader(frames.MAX_HELLO_BYTES)
        reader.feed(data)
        try:
            for body in reader.bodies():
                if frames.control_kind(body) == frames.REFUSED:
                    self._refuse(_short(body.get("reason")) or "no reason given")
                    return True
        except frames.FrameError:
            return True
        return False

    def _drop_connection(self, sock: socket.socket, error: str | None) -> None:
        if error is not None:
            self._last_error = error
        self._connected = False
        try:
            sock.close()
        except OSError:
            pass

    def _send_finished(self, sock: socket.socket) -> None:
        with self._cond:
            body = frames.rank_finished(self.identity, self._sent, self._dropped, self._dropped_output_lines,
                                        self._lost_rows, self._step_counts, self._unencodable_rows)
        try:
            sock.settimeout(max(0.05, self._remaining()))
            sock.sendall(frames.encode_frame(body))
            self._finished_delivered = True
            # Half-close so the aggregator reads everything and sees EOF; unread input is drained so
            # that close() does not answer with a reset that could discard the frame just sent.
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            while sock.recv(65536):
                pass
        except (OSError, ValueError) as exc:
            if not self._finished_delivered:
                self._last_error = f"rank_finished not delivered: {exc}"


def _encodable_part(payload: Any) -> tuple[Any, dict[str, int]]:
    """``payload`` (an envelope or a list of them) without the table rows msgpack cannot encode,
    and how many rows each stream lost ({} when no single row is to blame: the caller drops the
    batch). Only called after the whole payload failed to encode, so its cost does not matter."""
    lost: dict[str, int] = {}

    def fits(value: Any) -> bool:
        try:
            frames.encode_body(value)
        except (TypeError, ValueError, OverflowError):
            return False
        return True

    def envelope(item: Any) -> Any:
        tables = item.get("tables") if isinstance(item, dict) else None
        if not isinstance(tables, dict):
            return item
        kept_tables: dict[Any, Any] = {}
        for stream, rows in tables.items():
            if isinstance(rows, list):
                good = [row for row in rows if fits(row)]
                if len(good) != len(rows):
                    lost[str(stream)] = lost.get(str(stream), 0) + len(rows) - len(good)
                kept_tables[stream] = good
            else:
                kept_tables[stream] = rows
        return {**item, "tables": kept_tables}

    kept = [envelope(item) for item in payload] if isinstance(payload, list) else envelope(payload)
    return kept, lost


def _short(value: Any, limit: int = 200) -> str:
    """A peer's text for a one-line message: a string cut to ``limit`` characters, else its repr."""
    text = value if isinstance(value, str) else ("" if value is None else repr(value))
    text = " ".join(text[:limit * 2].split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
