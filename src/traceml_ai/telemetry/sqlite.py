"""The one way we name a SQLite database file in a read-only URI (DESIGN §2.1, ``telemetry.sqlite``).

A run folder's path is the user's (``--name "exp#1"``, spaces, ``?``): put into ``file:{path}?mode=ro``
unquoted, a ``#`` or ``?`` ends the file name early, the ``mode=ro`` is lost, and SQLite opens (and
creates) a different, empty file. Every reader builds its URI here.
"""

from __future__ import annotations

import os
from urllib.parse import quote


def read_only_uri(path: str | os.PathLike[str], *, immutable: bool = False) -> str:
    """``file:`` URI that opens ``path`` read-only (``sqlite3.connect(uri, uri=True)``).

    The absolute path is percent-encoded (``#`` → ``%23``, ``?`` → ``%3F``, ``%`` → ``%25``, space
    → ``%20``), so the whole name reaches SQLite and nothing is ever created. ``immutable`` adds
    ``immutable=1``: SQLite then takes no locks and reads no ``-wal`` file, which is right only for
    a database whose writer is gone.
    """
    name = quote(os.path.abspath(os.fspath(path)))
    return f"file:{name}?mode=ro" + ("&immutable=1" if immutable else "")
