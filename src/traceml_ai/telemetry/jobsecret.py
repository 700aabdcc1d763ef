"""The job secret: how a rank and its aggregator prove to each other that they belong to one job
(DESIGN §3.1; issue 12 points 1-2).

The session id is no secret (it is on the aggregator's command line and in ``manifest.json``). The
*job secret* is: a random string the launcher gives the aggregator and the ranks only through
their environment (``TRACEML_JOB_SECRET``), never on a command line and never in a file that
others can read. ``/proc/<pid>/environ`` is readable by the same user and root only.

The handshake (a challenge and one round trip, protocol 2):

- on accepting a connection the aggregator sends a *challenge* frame with a fresh random
  ``challenge`` (128 bits, new for every connection);
- the rank's hello carries its own fresh ``nonce`` and ``proof = HMAC-SHA256(secret, "traceml-hello"
  | challenge | every field of the hello but the proof)`` (:func:`hello_proof`: protocol, session id,
  nonce and every identity field, canonically encoded); the aggregator compares it in constant
  time. A hello caught by a squatter (or in an earlier run with the same secret) is useless on
  any other connection: its challenge differs; a hello with a field changed after signing fails;
- the welcome carries ``proof = HMAC-SHA256(secret, "traceml-welcome" | session_id | challenge |
  nonce)``; a rank that cannot verify it sends nothing to that listener and counts its batches as
  dropped.

What the secret does not protect: root on the same machine (it can read any process's
environment); frames after the handshake (they are neither encrypted nor signed: whoever can
write into an established connection can forge them); and a relay that sits between a rank and
its aggregator and passes the challenge, hello and welcome through both ways: it learns no secret,
but it holds a welcomed connection and may alter or inject the frames after it. Run multi-node
jobs on the cluster's private network.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import msgspec

ENV_JOB_SECRET = "TRACEML_JOB_SECRET"
"""The environment variable that carries the job secret to the aggregator and to every rank."""

MIN_SECRET_CHARS = 16
"""A job secret given by the user or the scheduler must be at least this long."""
MAX_SECRET_CHARS = 1024

NONCE_CHARS = 32
"""Hex characters of a hello's nonce and of an aggregator's challenge (128 bits each)."""

_HELLO = b"traceml-hello"
_WELCOME = b"traceml-welcome"
_PROOF_FIELD = "proof"


@functools.cache
def _canonical_encoder() -> msgspec.msgpack.Encoder:
    """msgspec's msgpack encoder, made on first use: the launcher imports this module for the secret
    alone, before the training starts, and should not pay for msgspec (issue 14, item 1)."""
    import msgspec

    return msgspec.msgpack.Encoder()


def new_secret() -> str:
    """A fresh random job secret: 64 hex characters (256 bits)."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    """A fresh random hello nonce or challenge: :data:`NONCE_CHARS` hex characters."""
    return secrets.token_hex(NONCE_CHARS // 2)


def check_secret(secret: str) -> str:
    """``secret`` when it is usable, stripped of surrounding white space.

    Raises:
        ValueError: shorter than :data:`MIN_SECRET_CHARS` or longer than :data:`MAX_SECRET_CHARS`
            characters (one line naming the variable).
    """
    value = secret.strip()
    if not MIN_SECRET_CHARS <= len(value) <= MAX_SECRET_CHARS:
        raise ValueError(f"{ENV_JOB_SECRET} must be {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters "
                         f"(it has {len(value)}); e.g. the output of `openssl rand -hex 32`")
    return value


def _mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signed_bytes(challenge: str, fields: Mapping[str, Any]) -> bytes:
    """The canonical bytes a hello's proof covers: the label, the aggregator's ``challenge`` and
    every ``(name, value)`` of ``fields`` but ``proof``, sorted by name, as msgpack.

    ``fields`` are the hello's plain values (str, int, float, bool, None, bytes), as decoded from
    the wire: re-encoding a decoded value gives the same bytes on both sides.

    Raises:
        TypeError: a field name is not a string, or a value msgpack cannot encode.
    """
    if any(not isinstance(k, str) for k in fields):
        raise TypeError("hello field names must be strings")
    items = sorted(((k, v) for k, v in fields.items() if k != _PROOF_FIELD), key=lambda item: item[0])
    return _canonical_encoder().encode([_HELLO.decode(), challenge, [[k, v] for k, v in items]])


def hello_proof(secret: str, challenge: str, fields: Mapping[str, Any]) -> str:
    """The hello's proof (64 hex characters) that the rank holds ``secret``, bound to this
    connection's ``challenge`` and to every field of the hello (:func:`signed_bytes`).

    Raises:
        TypeError: as :func:`signed_bytes`.
    """
    return _mac(secret, signed_bytes(challenge, fields))


def welcome_proof(secret: str, session_id: str, challenge: str, nonce: str) -> str:
    """The welcome's proof (64 hex characters) that the aggregator holds ``secret``, for this
    connection's ``challenge`` and the hello's ``nonce``."""
    parts = (_WELCOME, session_id.encode("utf-8", "surrogatepass"), challenge.encode("ascii", "replace"),
             nonce.encode("ascii", "replace"))
    return _mac(secret, b"\0".join(parts))


def proof_matches(expected: str, given: Any) -> bool:
    """Constant-time comparison of a proof with whatever the peer sent (False for a non-string)."""
    if not isinstance(given, str) or len(given) > 256:
        return False
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


def is_nonce(value: Any) -> bool:
    """True for a hello nonce or a challenge of the expected form (hex, :data:`NONCE_CHARS` characters)."""
    if not isinstance(value, str) or len(value) != NONCE_CHARS:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True

