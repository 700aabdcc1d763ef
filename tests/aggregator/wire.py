"""The rank side of a telemetry connection for the aggregator tests: a blocking socket client built
on :mod:`traceml_ai.telemetry.frames` only, plus realistic rows of every stream."""

from __future__ import annotations

import socket
import time
from typing import Any

from traceml_ai.telemetry import frames, schema
from traceml_ai.telemetry.envelope import make_envelope

SESSION = "sess-test-1"
SECRET = "test-job-secret-0123456789abcdef"


def identity(global_rank: int, world_size: int = 2, hostname: str = "node-a") -> dict[str, Any]:
    return {
        "session_id": SESSION,
        "global_rank": global_rank,
        "local_rank": global_rank,
        "world_size": world_size,
        "local_world_size": world_size,
        "node_rank": 0,
        "hostname": hostname,
        "pid": 1000 + global_rank,
        "sampler": "test",
    }


class RankClient:
    """One rank's connection: ``hello()`` then ``send(payload)`` ... ``finish()``."""

    def __init__(self, port: int, global_rank: int, *, world_size: int = 2, session_id: str = SESSION,
                 host: str = "127.0.0.1", secret: str = SECRET) -> None:
        self.secret = secret
        self.global_rank = global_rank
        self.meta = {**identity(global_rank, world_size), "session_id": session_id}
        self.sock = socket.create_connection((host, port), timeout=10)
        self.reader = frames.FrameReader()
        self.sent = 0
        self.challenge: str | None = None
        self.nonce = ""

    def send_body(self, body: Any) -> None:
        self.sock.sendall(frames.encode_frame(body))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> Any:
        """The next frame from the aggregator, or None when it closed the connection."""
        while True:
            for body in self.reader.bodies():
                return body
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.reader.feed(chunk)

    def read_challenge(self) -> str:
        """The aggregator's challenge for this connection (its first frame)."""
        if self.challenge is None:
            first = self.receive()
            value = frames.challenge_value(first)
            assert value is not None, first
            self.challenge = value
        return self.challenge

    def signed_hello(self, **overrides: Any) -> dict[str, Any]:
        """A hello signed for this connection's challenge, ``overrides`` applied before signing."""
        ident = {k: v for k, v in self.meta.items() if k != "session_id"}
        return frames.hello(self.meta["session_id"], {**ident, **overrides}, self.secret, self.read_challenge())

    def hello(self, **overrides: Any) -> Any:
        """Read the challenge, send a signed hello with ``overrides`` applied after signing (a
        tampered hello when they are not empty), and return the aggregator's answer."""
        body = self.signed_hello()
        self.nonce = body["nonce"]
        body.update(overrides)
        self.send_body(body)
        return self.receive()

    def send(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        self.send_body(make_envelope(self.meta, tables))
        self.sent += 1

    def finish(self, dropped_batches: int = 0, sent_batches: int | None = None) -> None:
        ident = {k: v for k, v in self.meta.items() if k != "session_id"}
        self.send_body(frames.rank_finished(ident, self.sent if sent_batches is None else sent_batches,
                                            dropped_batches))

    def close(self) -> None:
        self.sock.close()


def events(cpu_ms: float = 1.5) -> dict[str, Any]:
    return {p: {"cpu": {"is_gpu": False, "duration_ms": cpu_ms, "cpu_ms": cpu_ms, "gpu_ms": None, "n_calls": 1}}
            for p in schema.BUILTIN_PHASES}


def step_time_rows(first_step: int, count: int) -> list[dict[str, Any]]:
    now = time.time_ns()
    return [{"seq": s, "timestamp_unix_ns": now + s, "step": s, "events": events()}
            for s in range(first_step, first_step + count)]


def step_memory_rows(first_step: int, count: int) -> list[dict[str, Any]]:
    now = time.time_ns()
    return [{"seq": s, "timestamp_unix_ns": now + s, "device": "cpu", "step": s,
             "peak_alloc_bytes": 1.0e6 + s, "peak_reserved_bytes": 2.0e6 + s}
            for s in range(first_step, first_step + count)]


class AggregatorThread:
    """An :class:`~traceml_ai.aggregator.server.Aggregator` serving on its own event loop thread,
    so a test can talk to it with blocking sockets."""

    def __init__(self, run_dir: Any, **kwargs: Any) -> None:
        import asyncio
        import threading

        from traceml_ai.aggregator.server import Aggregator

        self.agg = Aggregator(run_dir, kwargs.pop("session_id", SESSION), secret=kwargs.pop("secret", SECRET), **kwargs)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        _host, self.port = asyncio.run_coroutine_threadsafe(self.agg.start(), self.loop).result(30)

    def stop(self, grace_s: float = 2.0) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.agg.stop(grace_s), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def client(self, global_rank: int, **kwargs: Any) -> RankClient:
        return RankClient(self.port, global_rank, **kwargs)
