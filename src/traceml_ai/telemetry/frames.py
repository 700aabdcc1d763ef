"""Frames on a telemetry connection (DESIGN §3.1, protocol 2).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack. On accepting
a connection the aggregator sends a *challenge* (a fresh random ``challenge``); the rank answers with
a *hello* (its identity, a fresh ``nonce`` and the ``proof`` that it holds the job secret, bound to
the challenge and to every field of the hello, :mod:`~traceml_ai.telemetry.jobsecret`); the
aggregator answers *welcome* (with its own ``proof`` for the challenge and the nonce) or closes the
connection after a *refused* frame that says why. Before a
welcome each side reads frames of at most :data:`MAX_HELLO_BYTES`. The rank's last frame is
*rank_finished* with its sent and dropped batch counts. Every other frame is a telemetry payload:
one envelope or a list of envelopes.

msgpack encoding and decoding use msgspec (DESIGN §7b).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgspec

from traceml_ai.telemetry import jobsecret

PROTOCOL_VERSION = 2
"""2: the aggregator's challenge comes first and the hello's proof covers every hello field (1 had
no challenge: a caught hello could be replayed, issue 12)."""

# A frame larger than this is refused by both sides: a corrupt length must not make a reader
# allocate gigabytes. Rank-side batches are far smaller (a few hundred rows, well under 1 MiB).
MAX_FRAME_BYTES = 16 * 1024 * 1024

# Before a valid hello the aggregator reads no frame larger than this (a hello is < 1 KiB): an
# unauthenticated peer can make it hold this much per connection, no more (issue 12 point 3).
MAX_HELLO_BYTES = 64 * 1024

# Strings of the hello (session id, hostname, ...) longer than this are refused.
MAX_HELLO_FIELD_CHARS = 256

HEADER = struct.Struct(">I")

CHALLENGE = "challenge"
HELLO = "hello"
WELCOME = "welcome"
REFUSED = "refused"
RANK_FINISHED = "rank_finished"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class FrameError(ValueError):
    """A frame is too large or its body is not msgpack; the connection should be closed."""


def encode_body(body: Any) -> bytes:
    """``body`` as msgpack (no frame header).

    Raises:
        TypeError, OverflowError: ``body`` holds a value msgpack cannot encode (an integer beyond
            64 bits, an object that is not data).
    """
    return _encoder.encode(body)


def encode_frame(body: Any) -> bytes:
    """One frame for ``body`` (any msgpack-able value: dicts, lists, str, int, float, bool, None).

    Raises:
        FrameError: the encoded body exceeds :data:`MAX_FRAME_BYTES`.
        TypeError: ``body`` holds a value msgpack cannot encode.
    """
    data = _encoder.encode(body)
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(data)) + data


def decode_body(data: bytes | memoryview) -> Any:
    """The value of one frame body.

    Nesting is bounded by the decoder (about 1,000 levels, the interpreter's recursion limit): a
    deeper body is a :class:`FrameError`, never a ``RecursionError`` further on.

    Raises:
        FrameError: the bytes are not valid msgpack, or nest too deep.
    """
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise FrameError(f"frame body is not msgpack: {exc}") from exc
    except RecursionError:
        raise FrameError("frame body nests too deep") from None


class FrameReader:
    """Incremental frame splitter for a byte stream: ``feed(chunk)`` then iterate complete bodies.

    Example::

        reader = FrameReader()
        reader.feed(sock.recv(65536))
        for body in reader.bodies():
            handle(body)

    Args:
        max_frame_bytes: a frame longer than this is a :class:`FrameError` (a peer that has not
            proved itself gets :data:`MAX_HELLO_BYTES`).

    Raises (from :meth:`bodies`):
        FrameError: a length above ``max_frame_bytes`` or a body that is not msgpack.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk

    def bodies(self) -> Iterator[Any]:
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.max_frame_bytes:
                raise FrameError(f"frame length {length} exceeds {self.max_frame_bytes}")
            end = HEADER.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            yield decode_body(body)


# -- control frames -----------------------------------------------------------------------------------


def challenge(value: str | None = None) -> dict[str, Any]:
    """The aggregator's first frame on a connection: a fresh random ``challenge`` (hex) the hello
    must sign."""
    return {"control": CHALLENGE, "protocol": PROTOCOL_VERSION,
            "challenge": jobsecret.new_nonce() if value is None else value}


def challenge_value(body: Any) -> str | None:
    """The challenge of a challenge frame of this protocol, or None for any other frame."""
    if control_kind(body) != CHALLENGE or not isinstance(body, dict) or body.get("protocol") != PROTOCOL_VERSION:
        return None
    value = body.get("challenge")
    return value if jobsecret.is_nonce(value) else None


def hello(session_id: str, identity: dict[str, Any], secret: str, challenge: str,
          nonce: str | None = None) -> dict[str, Any]:
    """The rank's answer to a challenge: protocol version, session id, its identity (``meta``
    fields, plain values), a fresh ``nonce`` and the ``proof`` over all of them and ``challenge``
    (:func:`~traceml_ai.telemetry.jobsecret.hello_proof`)."""
    body = {**identity, "control": HELLO, "protocol": PROTOCOL_VERSION, "session_id": session_id,
            "nonce": jobsecret.new_nonce() if nonce is None else nonce}
    body.pop("proof", None)
    body["proof"] = jobsecret.hello_proof(secret, challenge, body)
    return body


def welcome(secret: str, session_id: str, challenge: str, nonce: str) -> dict[str, Any]:
    """The aggregator's answer to an accepted hello, with its own ``proof`` for this connection's
    ``challenge`` and the hello's ``nonce``."""
    return {"control": WELCOME, "protocol": PROTOCOL_VERSION,
            "proof": jobsecret.welcome_proof(secret, session_id, challenge, nonce)}


def welcome_is_genuine(body: Any, secret: str, session_id: str, challenge: str, nonce: str) -> bool:
    """True when ``body`` is a welcome whose proof only a holder of ``secret`` could make."""
    if control_kind(body) != WELCOME or not isinstance(body, dict):
        return False
    return jobsecret.proof_matches(jobsecret.welcome_proof(secret, session_id, challenge, nonce), body.get("proof"))


def refused(reason: str) -> dict[str, Any]:
    """The aggregator's last frame before closing a connection it does not accept (``reason``: one line)."""
    return {"control": REFUSED, "protocol": PROTOCOL_VERSION, "reason": reason}


def rank_finished(
    identity: dict[str, Any],
    sent_batches: int,
    dropped_batches: int,
    dropped_output_lines: int = 0,
    lost_rows: dict[str, int] | None = None,
    step_counts: dict[str, int] | None = None,
    unencodable_rows: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The last frame of a rank: how many payload batches it sent and how many it dropped, how many
    stdout/stderr lines its output capture dropped, ``lost_rows`` ({stream: rows}) its row sources
    lost before they reached a batch (e.g. a full step hand-off queue), and ``step_counts``
    ({counter: n}: steps left without a row by design, e.g. ``discarded_steps`` for blocks that
    raised; empty when the rank traced no step), and ``unencodable_rows`` ({stream: rows}) left out
    of their batches because msgpack cannot encode a value they hold (an integer beyond 64 bits)."""
    return {"control": RANK_FINISHED, **identity, "sent_batches": sent_batches, "dropped_batches": dropped_batches,
            "dropped_output_lines": dropped_output_lines, "lost_rows": dict(lost_rows or {}),
            "step_counts": dict(step_counts or {}), "unencodable_rows": dict(unencodable_rows or {})}


def control_kind(body: Any) -> str | None:
    """The ``control`` name of a control frame, or None for a telemetry payload."""
    if isinstance(body, dict):
        kind = body.get("control")
        if isinstance(kind, str):
            return kind
    return None
