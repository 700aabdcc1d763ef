"""The aggregator's TCP server: frames from the training ranks → projection → SQLite (DESIGN §3.1, §3.2).

One asyncio server, one coroutine per connection (no thread per connection). On accepting a
connection the aggregator sends a fresh random *challenge*; the peer must answer with a hello for
protocol 2, this aggregator's session id and the proof that it holds the job secret, computed over
that challenge and every field of the hello (:mod:`~traceml_ai.telemetry.jobsecret`), so a hello
caught elsewhere or edited after signing is refused. Anything else is answered with a *refused*
frame, closed, and counted in ``refused_connections``. The welcome carries the aggregator's own
proof, so a rank can tell its aggregator from a listener squatting on the port.

What an unauthenticated peer can make the aggregator hold is bounded (issue 12 point 3): at most
:data:`MAX_PENDING` connections wait for a hello (a newer one closes the one that waited longest, so
idle connections cannot keep ranks out), each reads one frame of at most
``frames.MAX_HELLO_BYTES``, within ``hello_timeout_s``; refusal reasons quote at most a few dozen
characters of what the peer sent. After the welcome, frames are at most ``frames.MAX_FRAME_BYTES``
and the inbound queue holds at most ``inbound_max`` frames and ``inbound_max_bytes`` bytes.

After the welcome, each frame's bytes go, in arrival order, into the
store's bounded inbound queue as a unit of work; when the queue is full the connection's coroutine
stops reading, so TCP pushes back on the rank (whose own queue drops its oldest batch and counts
it, DESIGN §3.2). The store's writer thread runs the work: decode (the typed hot path of
:mod:`~traceml_ai.aggregator.fastpath`, else the generic :mod:`~traceml_ai.aggregator.projection`),
count, project, write. Keeping all per-row Python work on that one thread avoids handing the GIL
back and forth at every row SQLite inserts (benchmarks/bench_aggregator.py).

Every loss is counted in :class:`~traceml_ai.aggregator.stats.IngestStats`: rejected frames per
rank, projection skips, and each rank's own ``rank_finished`` counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from traceml_ai.aggregator.fastpath import FrameRows, project_frame
from traceml_ai.aggregator.projection import PayloadRows, envelope_of, project_payload, rank_log_lines
from traceml_ai.aggregator.stats import IngestStats, RankStats, keep_message
from traceml_ai.aggregator.store import DB_NAME, LogLine, StoreRows, StoreStats, TelemetryStore, Work
from traceml_ai.telemetry import frames, jobsecret, schema
from traceml_ai.telemetry.envelope import EnvelopeError, as_int, payload_items

PayloadSink = Callable[[Any], None]
"""Given every admitted payload (one envelope dict or a list of them), on the store's writer thread.

The seam for exporters (000 seed): a sink must return quickly (queue the payload for its own
worker); one that raises is counted in ``IngestStats.sink_errors`` and keeps being called.
"""

FrameSink = Callable[[bytes], None]
"""Given the msgpack body of every admitted payload frame, undecoded, on the store's writer thread.

The export worker's seam: it decodes the body on its own thread, so the writer thread (the
ingest path) does no work for the export but this call. Same rules as :data:`PayloadSink`.
"""

AGGREGATOR_DIR = "aggregator"

# StreamReader buffer limit: large enough that a typical batch frame arrives without pausing
# and resuming the transport several times; small enough that a peer that never says hello
# makes the aggregator buffer little (the transport pauses at twice this).
_READ_LIMIT = 256 * 1024

MAX_PENDING = 64
"""Connections that may wait for their hello at once; more are closed at once and counted."""

INBOUND_MAX_BYTES = 256 * 1024 * 1024
"""Bytes of frames the inbound queue holds before connections stop being read (backpressure)."""



def _quote(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: a peer's bytes in a reason stay short."""
    text = repr(value) if not isinstance(value, str | bytes) or len(value) <= 4 * limit else repr(value[:4 * limit])
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _ConnectionDone(Exception):
    """The peer closed the connection, or it cannot be read any further."""


class _FrameTooLarge(_ConnectionDone):
    """A frame length above ``frames.MAX_FRAME_BYTES``: a rejected frame, and the end of the stream."""


class Aggregator:
    """Receives telemetry frames of one job and writes ``<run_dir>/aggregator/telemetry.sqlite``.

    Args:
        run_dir: the run folder (DESIGN §2.1); ``aggregator/`` is created inside it.
        session_id: the session every hello (and every envelope that names one) must carry.
        secret: the job secret (``TRACEML_JOB_SECRET``); a hello must prove it holds it.
        host: address to bind; 127.0.0.1 unless the job spans nodes (DESIGN §3.2).
        port: TCP port; 0 picks a free one (see :attr:`address` after :meth:`start`).
        world_size: expected number of ranks, for the missing-rank report; None takes the largest
            ``world_size`` the ranks announce in their hellos.
        payload_sinks: callables given every admitted payload (the exporter seam).
        frame_sinks: callables given the body bytes of every admitted payload frame.
        inbound_max: frames the inbound queue holds before connections stop being read.
        inbound_max_bytes: bytes of frames it holds before connections stop being read.
        max_pending: connections that may wait for their hello at once.
        hello_timeout_s: a connection that sends no hello within this many seconds is closed.
        flush_interval_s, flush_rows: the store's flush rule (DESIGN §3.3).

    Example::

        agg = Aggregator(run_dir, "3f2a", secret=os.environ["TRACEML_JOB_SECRET"], world_size=2)
        host, port = await agg.start()
        ...
        await agg.stop(grace_s=2.0)      # then agg.stats / agg.store_stats
    """

    def __init__(
        self,
        run_dir: str | Path,
        session_id: str,
        *,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        world_size: int | None = None,
        payload_sinks: Sequence[PayloadSink] = (),
        frame_sinks: Sequence[FrameSink] = (),
        inbound_max: int = 256,
        inbound_max_bytes: int = INBOUND_MAX_BYTES,
        max_pending: int = MAX_PENDING,
        hello_timeout_s: float = 10.0,
        flush_interval_s: float = 0.5,
        flush_rows: int = 50_000,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / AGGREGATOR_DIR
        self.session_id = session_id
        self.secret = secret
        self.host = host
        self.port = port
        self.sock = sock
        self.world_size = world_size
        self.payload_sinks = list(payload_sinks)
        self.frame_sinks = list(frame_sinks)
        self.hello_timeout_s = hello_timeout_s
        self.inbound_max_bytes = inbound_max_bytes
        self.max_pending = max_pending
        # Connections waiting for their hello, oldest first (each closed in turn when more arrive).
        self._pending: OrderedDict[object, asyncio.StreamWriter] = OrderedDict()
        self._open_ranks = 0
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self.stats = IngestStats()
        self.store = TelemetryStore(
            self.folder / DB_NAME,
            log_dir=self.folder,
            flush_interval_s=flush_interval_s,
            flush_rows=flush_rows,
            max_queued=inbound_max,
        )
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._announced_world_size: int | None = None
        # Per global rank, the step_time device of its last frame: the hot path's hint (writer thread only).
        self._step_devices: dict[int | None, str | None] = {}
        self.address: tuple[str, int] | None = None

    @property
    def store_stats(self) -> StoreStats:
        return self.store.stats

    @property
    def expected_world_size(self) -> int | None:
        """``world_size`` given at start, else the largest one announced in a hello, else None."""
        return self.world_size if self.world_size is not None else self._announced_world_size

    async def start(self) -> tuple[str, int]:
        """Create ``aggregator/``, open the store, start listening; returns the bound ``(host, port)``.
        With ``sock`` (a socket already bound and listening, e.g. by the launcher, whose ranks may
        be connecting already) that socket is served and ``host``/``port`` are not used.

        Raises:
            OSError: the folder cannot be created or the address cannot be bound.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.store.start)
        try:
            if self.sock is not None:
                self._server = await asyncio.start_server(self._handle, sock=self.sock, limit=_READ_LIMIT)
            else:
                self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=_READ_LIMIT)
        except OSError:
            await asyncio.to_thread(self.store.close)
            raise
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    @property
    def open_ranks(self) -> int:
        """Connections of admitted ranks open now."""
        return self._open_ranks

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames waiting in the inbound queue."""
        return self._queued_bytes

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, give open connections up to ``grace_s`` seconds to finish, then flush.

        Connections still open after the grace period are closed (quietly: no traceback per
        connection); whatever they had not sent is the rank's loss and shows up as a missing
        ``rank_finished``. Every admitted payload is projected and written before this returns.
        """
        if self._server is not None:
            self._server.close()
        open_now = set(self._connections)
        if open_now:
            await asyncio.wait(open_now, timeout=grace_s)
            for task in open_now:
                task.cancel()
            await asyncio.gather(*open_now, return_exceptions=True)
        # Runs every frame still queued, then the last flush.
        await asyncio.to_thread(self.store.close)

    # -- connections ----------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        self.stats.connections += 1
        try:
            if len(self._pending) >= self.max_pending:
                # Full: close the connection that has waited longest, not the new one. A real rank
                # sends its hello within a round trip of the challenge, so connections held open
                # without a hello (another local user filling the slots) cannot keep ranks out.
                _, oldest = self._pending.popitem(last=False)
                self.stats.refuse(f"{_peer(oldest)}: closed while waiting for its hello (the oldest of "
                                  f"{self.max_pending} connections waiting for their hello)")
                oldest.close()
            key = object()
            self._pending[key] = writer
            try:
                rank = await self._admit(reader, writer)
            finally:
                self._pending.pop(key, None)
            if rank is not None:
                self._open_ranks += 1
                try:
                    await self._receive(reader, rank)
                finally:
                    self._open_ranks -= 1
        except (_ConnectionDone, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop() closing a connection after its grace period: expected, not a traceback
        except Exception as exc:  # a bug must cost this connection only, and be on record
            self.stats.reject(None, f"connection dropped: {type(exc).__name__}: {exc}", known=False)
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RankStats | None:
        """Read the hello; answer welcome and return the rank's stats, or refuse and return None."""
        peer = _peer(writer)
        challenge = jobsecret.new_nonce()
        await _send(writer, frames.challenge(challenge))
        try:
            data = await asyncio.wait_for(_read_frame(reader, frames.MAX_HELLO_BYTES), self.hello_timeout_s)
        except asyncio.TimeoutError:
            self.stats.refuse(f"{peer}: no hello within {self.hello_timeout_s:g} s")
            await _send(writer, frames.refused(f"no hello within {self.hello_timeout_s:g} s"))
            return None
        except _FrameTooLarge as exc:
            self.stats.refuse(f"{peer}: first frame: {exc}")
            await _send(writer, frames.refused(str(exc)))
            return None
        try:
            body = frames.decode_body(data)
        except frames.FrameError as exc:
            self.stats.refuse(f"{peer}: first frame: {exc}")
            await _send(writer, frames.refused("first frame is not msgpack"))
            return None
        reason = self._hello_problem(body, challenge)
        if reason is not None:
            self.stats.refuse(f"{peer}: {reason}")
            await _send(writer, frames.refused(reason))
            return None
        assert isinstance(body, dict)
        nonce = body["nonce"]
        global_rank = as_int(body.get("global_rank", body.get("rank")))
        rank = self.stats.rank(global_rank)
        rank.hellos += 1
        hostname = body.get("hostname")
        if isinstance(hostname, str):
            rank.hostname = hostname
        world_size = as_int(body.get("world_size"))
        if world_size is not None and world_size > 0:
            self._announced_world_size = max(self._announced_world_size or 0, world_size)
        await _send(writer, frames.welcome(self.secret, self.session_id, challenge, nonce))
        return rank

    def _hello_problem(self, body: Any, challenge: str) -> str | None:
        """Why the first frame ``body`` is not an acceptable hello to ``challenge`` (one short line), or None."""
        if frames.control_kind(body) != frames.HELLO:
            return "the first frame must be a hello"
        assert isinstance(body, dict)
        protocol = body.get("protocol")
        if as_int(protocol) != frames.PROTOCOL_VERSION:
            return (f"protocol {_quote(protocol)} is not supported; "
                    f"this aggregator speaks protocol {frames.PROTOCOL_VERSION}")
        for key, value in body.items():
            if not isinstance(key, str) or len(key) > 64:
                return f"hello field {_quote(key)} is not a short name"
            if isinstance(value, dict | list):
                return f"hello field {key!r} is not a plain value"
            if isinstance(value, str | bytes) and len(value) > frames.MAX_HELLO_FIELD_CHARS:
                return f"hello field {key!r} is longer than {frames.MAX_HELLO_FIELD_CHARS} characters"
        session = body.get("session_id")
        if session != self.session_id:
            return f"session {_quote(session)} is not this aggregator's session"
        nonce = body.get("nonce")
        if not jobsecret.is_nonce(nonce):
            return "the hello carries no nonce (a rank of an older TraceML, or not a rank of this job)"
        assert isinstance(nonce, str)
        try:
            expected = jobsecret.hello_proof(self.secret, challenge, body)
        except (TypeError, ValueError, OverflowError):
            return "the hello holds a value that cannot be signed"
        if not jobsecret.proof_matches(expected, body.get("proof")):
            return ("the hello does not prove it holds this job's secret (TRACEML_JOB_SECRET) for this "
                    "connection's challenge: a wrong secret, a replayed hello, or a field changed after signing")
        return None

    async def _receive(self, reader: asyncio.StreamReader, rank: RankStats) -> None:
        """Read frames until the rank closes; queue each for the writer thread, in order."""
        while True:
            try:
                data = await _read_frame(reader, frames.MAX_FRAME_BYTES)
            except _FrameTooLarge as exc:
                self.stats.reject(rank.global_rank, f"rank {rank.global_rank}: {exc}", batch=True)
                self.stats.dropped_connections += 1
                return
            await self._submit(partial(self._process_counted, rank, data), len(data))

    def _process_counted(self, rank: RankStats, data: bytes) -> tuple[StoreRows, list[LogLine]]:
        try:
            return self._process(rank, data)
        finally:
            with self._bytes_lock:
                self._queued_bytes -= len(data)

    async def _submit(self, work: Work, size: int = 0) -> None:
        """Queue ``work`` (a frame of ``size`` bytes) for the writer thread; while the queue is full
        (frames or bytes), wait without reading."""
        delay = 0.001
        while True:
            with self._bytes_lock:
                room = self._queued_bytes == 0 or self._queued_bytes + size <= self.inbound_max_bytes
                if room:
                    self._queued_bytes += size
            try:
                if room and self.store.put_work(work, block=False):
                    return
            except RuntimeError as exc:  # the writer thread is gone: count, never crash ingestion
                with self._bytes_lock:
                    self._queued_bytes -= size
                self.store.stats.errors += 1
                keep_message(self.store.stats.messages, f"store not running: {exc}")
                return
            if room:  # the frame count was the limit: give the bytes back until it fits
                with self._bytes_lock:
                    self._queued_bytes -= size
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    # -- frames (run on the writer thread) ----------------------------------------------------------

    def _process(self, rank: RankStats, data: bytes) -> tuple[StoreRows, list[LogLine]]:
        """One frame after the hello: count it, and return the rows and log lines to write."""
        fast = project_frame(data, device=self._step_devices.get(rank.global_rank))
        if fast is not None:
            if fast.device is not None or schema.STEP_TIME_SAMPLES.name in fast.tables:
                self._step_devices[rank.global_rank] = fast.device  # kept across frames without step_time
            foreign = next((s for s in fast.session_ids if s is not None and s != self.session_id), None)
            if foreign is not None:
                return self._reject_foreign(rank, foreign)
            if self.payload_sinks:
                self._feed_sinks(frames.decode_body(data))
            if self.frame_sinks:
                self._feed_sinks(data, self.frame_sinks)
            return self._admitted(rank, fast, fast.log_lines)
        try:
            body = frames.decode_body(data)
        except frames.FrameError as exc:
            self.stats.reject(rank.global_rank, f"rank {rank.global_rank}: {exc}", batch=True)
            return {}, []
        kind = frames.control_kind(body)
        if kind is None:
            foreign = self._foreign_session(body)
            if foreign is not None:
                return self._reject_foreign(rank, foreign)
            self._feed_sinks(body)
            if self.frame_sinks:
                self._feed_sinks(data, self.frame_sinks)
            return self._admitted(rank, project_payload(body), _log_lines(body))
        if kind == frames.RANK_FINISHED:
            assert isinstance(body, dict)
            rank.finished = True
            rank.sent_batches = as_int(body.get("sent_batches"))
            rank.dropped_batches = as_int(body.get("dropped_batches"))
            rank.dropped_output_lines = as_int(body.get("dropped_output_lines"))
            lost = body.get("lost_rows")
            if isinstance(lost, dict):
                rank.lost_rows = {str(k): n for k, v in lost.items() if (n := as_int(v))}
            bad = body.get("unencodable_rows")
            if isinstance(bad, dict):
                rank.unencodable_rows = {str(k): n for k, v in bad.items() if (n := as_int(v))}
            counts = body.get("step_counts")
            if isinstance(counts, dict):
                rank.step_counts = {str(k): n for k, v in counts.items() if (n := as_int(v)) is not None and n >= 0}
        else:
            self.stats.reject(rank.global_rank, f"rank {rank.global_rank}: unexpected control frame {kind!r}")
        return {}, []

    def _reject_foreign(self, rank: RankStats, session: Any) -> tuple[StoreRows, list[LogLine]]:
        self.stats.reject(rank.global_rank, f"rank {rank.global_rank}: payload of session {session!r}", batch=True)
        return {}, []

    def _admitted(
        self, rank: RankStats, projected: PayloadRows | FrameRows, lines: list[LogLine]
    ) -> tuple[StoreRows, list[LogLine]]:
        """Count one admitted payload and its losses."""
        stats = self.stats
        rank.batches += 1
        rank.rows += projected.rows
        if projected.skipped:
            stats.projection_skipped += projected.skipped
            for failure in projected.failures:
                keep_message(stats.projection_failures, f"rank {rank.global_rank}: {failure}")
        for stream, count in projected.unknown_streams.items():
            stats.unknown_streams[stream] = stats.unknown_streams.get(stream, 0) + count
        return projected.tables, lines

    def _foreign_session(self, payload: Any) -> Any:
        """The session id of an envelope in ``payload`` that names another session, else None."""
        for item in payload_items(payload):
            if type(item) is dict:
                meta = item.get("meta")
                if type(meta) is dict:
                    session = meta.get("session_id")
                    if session is not None and session != self.session_id:
                        return session
        return None

    def _feed_sinks(self, payload: Any, sinks: Sequence[Callable[[Any], None]] | None = None) -> None:
        for sink in self.payload_sinks if sinks is None else sinks:
            try:
                sink(payload)
            except Exception as exc:
                self.stats.sink_errors += 1
                keep_message(self.stats.sink_messages, f"{getattr(sink, '__name__', sink)!s}: {exc}")


def _log_lines(payload: Any) -> list[LogLine]:
    """The ``rank_<g>.log`` lines of a payload (only envelopes that carry stdout_stderr rows)."""
    out: list[LogLine] = []
    for item in payload_items(payload):
        if type(item) is dict:
            tables = item.get("tables")
            if type(tables) is dict and tables.get(schema.STDOUT_STDERR):
                with contextlib.suppress(EnvelopeError):
                    out.extend(rank_log_lines(envelope_of(item)[0]))
    return out


def _peer(writer: asyncio.StreamWriter) -> str:
    """``host:port`` of the connection's peer, for refusal reasons."""
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return "a peer"


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """The body bytes of the next frame.

    Raises:
        _ConnectionDone: the peer closed (between or inside frames).
        _FrameTooLarge: a length above ``limit`` bytes (the stream cannot be resynchronised
            after that, and nothing of the body is read).
    """
    try:
        header = await reader.readexactly(frames.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        raise _ConnectionDone("closed") from exc
    (length,) = frames.HEADER.unpack(header)
    if length > limit:
        raise _FrameTooLarge(f"frame length {length} exceeds {limit}")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise _ConnectionDone("closed inside a frame") from exc


async def _send(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(frames.encode_frame(body))
        await writer.drain()
