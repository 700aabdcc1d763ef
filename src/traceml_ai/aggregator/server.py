"""The aggregator's TCP server: frames from the training ranks → projection → SQLite (DESIGN §3.1, §3.2).

One asyncio server, one coroutine per connection (no thread per connection). A connection must
open with a hello for protocol 1 and this aggregator's session id; anything else is answered with
a *refused* frame and closed. After the welcome, each frame's bytes go, in arrival order, into the
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
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from traceml_ai.aggregator.fastpath import FrameRows, project_frame
from traceml_ai.aggregator.projection import PayloadRows, envelope_of, project_payload, rank_log_lines
from traceml_ai.aggregator.stats import IngestStats, RankStats, keep_message
from traceml_ai.aggregator.store import DB_NAME, LogLine, StoreRows, StoreStats, TelemetryStore, Work
from traceml_ai.telemetry import frames, schema
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
# and resuming the transport several times.
_READ_LIMIT = 1 << 20


class _ConnectionDone(Exception):
    """The peer closed the connection, or it cannot be read any further."""


class _FrameTooLarge(_ConnectionDone):
    """A frame length above ``frames.MAX_FRAME_BYTES``: a rejected frame, and the end of the stream."""


class Aggregator:
    """Receives telemetry frames of one job and writes ``<run_dir>/aggregator/telemetry.sqlite``.

    Args:
        run_dir: the run folder (DESIGN §2.1); ``aggregator/`` is created inside it.
        session_id: the session every hello (and every envelope that names one) must carry.
        host: address to bind; 127.0.0.1 unless the job spans nodes (DESIGN §3.2).
        port: TCP port; 0 picks a free one (see :attr:`address` after :meth:`start`).
        world_size: expected number of ranks, for the missing-rank report; None takes the largest
            ``world_size`` the ranks announce in their hellos.
        payload_sinks: callables given every admitted payload (the exporter seam).
        frame_sinks: callables given the body bytes of every admitted payload frame.
        inbound_max: frames the inbound queue holds before connections stop being read.
        hello_timeout_s: a connection that sends no hello within this many seconds is closed.
        flush_interval_s, flush_rows: the store's flush rule (DESIGN §3.3).

    Example::

        agg = Aggregator(run_dir, "3f2a", world_size=2)
        host, port = await agg.start()
        ...
        await agg.stop(grace_s=2.0)      # then agg.stats / agg.store_stats
    """

    def __init__(
        self,
        run_dir: str | Path,
        session_id: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        world_size: int | None = None,
        payload_sinks: Sequence[PayloadSink] = (),
        frame_sinks: Sequence[FrameSink] = (),
        inbound_max: int = 256,
        hello_timeout_s: float = 30.0,
        flush_interval_s: float = 0.5,
        flush_rows: int = 50_000,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / AGGREGATOR_DIR
        self.session_id = session_id
        self.host = host
        self.port = port
        self.world_size = world_size
        self.payload_sinks = list(payload_sinks)
        self.frame_sinks = list(frame_sinks)
        self.hello_timeout_s = hello_timeout_s
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

        Raises:
            OSError: the folder cannot be created or the address cannot be bound.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.store.start)
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=_READ_LIMIT)
        except OSError:
            await asyncio.to_thread(self.store.close)
            raise
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, give open connections up to ``grace_s`` seconds to finish, then flush.

        Connections still open after the grace period are closed; whatever they had not sent is
        the rank's loss and shows up as a missing ``rank_finished``. Every admitted payload is
        projected and written before this returns.
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
            rank = await self._admit(reader, writer)
            if rank is not None:
                await self._receive(reader, rank)
        except (_ConnectionDone, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # a bug must cost this connection only, and be on record
            self.stats.reject(None, f"connection dropped: {type(exc).__name__}: {exc}", known=False)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RankStats | None:
        """Read the hello; answer welcome and return the rank's stats, or refuse and return None."""
        try:
            data = await asyncio.wait_for(_read_frame(reader), self.hello_timeout_s)
        except asyncio.TimeoutError:
            self.stats.reject(None, f"no hello within {self.hello_timeout_s:g} s", known=False)
            await _send(writer, frames.refused(f"no hello within {self.hello_timeout_s:g} s"))
            return None
        except _FrameTooLarge as exc:
            self.stats.reject(None, f"first frame: {exc}", known=False)
            await _send(writer, frames.refused(str(exc)))
            return None
        try:
            body = frames.decode_body(data)
        except frames.FrameError as exc:
            self.stats.reject(None, f"first frame: {exc}", known=False)
            await _send(writer, frames.refused("first frame is not msgpack"))
            return None
        reason, global_rank, known = self._hello_problem(body)
        if reason is not None:
            self.stats.reject(global_rank, reason, known=known)
            await _send(writer, frames.refused(reason))
            return None
        assert isinstance(body, dict)
        rank = self.stats.rank(global_rank)
        rank.hellos += 1
        hostname = body.get("hostname")
        if isinstance(hostname, str):
            rank.hostname = hostname
        world_size = as_int(body.get("world_size"))
        if world_size is not None and world_size > 0:
            self._announced_world_size = max(self._announced_world_size or 0, world_size)
        await _send(writer, frames.welcome())
        return rank

    def _hello_problem(self, body: Any) -> tuple[str | None, int | None, bool]:
        """``(reason to refuse or None, the global_rank the frame names, whether it names one)``."""
        global_rank = as_int(body.get("global_rank", body.get("rank"))) if isinstance(body, dict) else None
        known = global_rank is not None
        if frames.control_kind(body) != frames.HELLO:
            return "the first frame must be a hello", global_rank, known
        assert isinstance(body, dict)
        protocol = body.get("protocol")
        if as_int(protocol) != frames.PROTOCOL_VERSION:
            return (
                f"protocol {protocol!r} is not supported; this aggregator speaks protocol {frames.PROTOCOL_VERSION}",
                global_rank,
                known,
            )
        session = body.get("session_id")
        if session != self.session_id:
            return f"session {session!r} is not this aggregator's session", global_rank, known
        return None, global_rank, True

    async def _receive(self, reader: asyncio.StreamReader, rank: RankStats) -> None:
        """Read frames until the rank closes; queue each for the writer thread, in order."""
        while True:
            try:
                data = await _read_frame(reader)
            except _FrameTooLarge as exc:
                self.stats.reject(rank.global_rank, f"rank {rank.global_rank}: {exc}", batch=True)
                return
            await self._submit(partial(self._process, rank, data))

    async def _submit(self, work: Work) -> None:
        """Queue ``work`` for the writer thread; while the queue is full, wait without reading."""
        delay = 0.001
        while True:
            try:
                if self.store.put_work(work, block=False):
                    return
            except RuntimeError as exc:  # the writer thread is gone: count, never crash ingestion
                self.store.stats.errors += 1
                keep_message(self.store.stats.messages, f"store not running: {exc}")
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    # -- frames (run on the writer thread) ----------------------------------------------------------

    def _process(self, rank: RankStats, data: bytes) -> tuple[StoreRows, list[LogLine]]:
        """One frame after the hello: count it, and return the rows and log lines to write."""
        fast = project_frame(data)
        if fast is not None:
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


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """The body bytes of the next frame.

    Raises:
        _ConnectionDone: the peer closed (between or inside frames).
        _FrameTooLarge: a length above ``frames.MAX_FRAME_BYTES`` (the stream cannot be
            resynchronised after that).
    """
    try:
        header = await reader.readexactly(frames.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        raise _ConnectionDone("closed") from exc
    (length,) = frames.HEADER.unpack(header)
    if length > frames.MAX_FRAME_BYTES:
        raise _FrameTooLarge(f"frame length {length} exceeds {frames.MAX_FRAME_BYTES}")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise _ConnectionDone("closed inside a frame") from exc


async def _send(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(frames.encode_frame(body))
        await writer.drain()
