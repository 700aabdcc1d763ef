"""The job secret: how a rank and its aggregator prove to each other that they belong to one job
(DESIGN §3.1; issue 12 points 1-2).

The session id is no secret (it is on the aggregator's command line and in ``manifest.json``). The
*job secret* is: a random string the launcher gives the aggregator and the ranks only through
their environment (``TRACEML_JOB_SECRET``), never on a command line and never in a file that
others can read. ``/proc/<pid>/environ`` is readable by the same user and root only.

The handshake (one round trip, protocol 1):

- the rank's hello carries a fresh random ``nonce`` and ``proof = HMAC-SHA256(secret,
  "traceml-rank" | session_id | nonce)``; the aggregator compares it in constant time and refuses a
  nonce it has already accepted (a replayed hello);
- the welcome carries ``proof = HMAC-SHA256(secret, "traceml-aggregator" | session_id | nonce)``;
  a rank that cannot verify it sends nothing to that listener and counts its batches as dropped.

What the secret does not protect: root on the same machine (it can read any process's
environment), and frames on the network after the handshake (they are neither encrypted nor
signed; run multi-node jobs on the cluster's private network).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

ENV_JOB_SECRET = "TRACEML_JOB_SECRET"
"""The environment variable that carries the job secret to the aggregator and to every rank."""

MIN_SECRET_CHARS = 16
"""A job secret given by the user or the scheduler must be at least this long."""
MAX_SECRET_CHARS = 1024

NONCE_CHARS = 32
"""Hex characters of a hello's nonce (128 bits)."""

_RANK = b"traceml-rank"
_AGGREGATOR = b"traceml-aggregator"


def new_secret() -> str:
    """A fresh random job secret: 64 hex characters (256 bits)."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    """A fresh random hello nonce: :data:`NONCE_CHARS` hex characters."""
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


def _mac(secret: str, role: bytes, session_id: str, nonce: str) -> str:
    message = b"\0".join((role, session_id.encode("utf-8", "surrogatepass"), nonce.encode("ascii", "replace")))
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def rank_proof(secret: str, session_id: str, nonce: str) -> str:
    """The hello's proof that the rank holds ``secret`` (64 hex characters)."""
    return _mac(secret, _RANK, session_id, nonce)


def aggregator_proof(secret: str, session_id: str, nonce: str) -> str:
    """The welcome's proof that the aggregator holds ``secret`` (64 hex characters)."""
    return _mac(secret, _AGGREGATOR, session_id, nonce)


def proof_matches(expected: str, given: Any) -> bool:
    """Constant-time comparison of a proof with whatever the peer sent (False for a non-string)."""
    if not isinstance(given, str) or len(given) > 256:
        return False
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


def is_nonce(value: Any) -> bool:
    """True for a hello nonce of the expected form (hex, :data:`NONCE_CHARS` characters)."""
    if not isinstance(value, str) or len(value) != NONCE_CHARS:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True

