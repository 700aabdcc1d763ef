"""Opening a file of a runs root for reading: regular files only, never a blocking open (issue 12
point 7). Every reader of run folders and catalog files opens through :func:`open_regular`.

A FIFO named like a run file (``run.json``, ``metrics.jsonl``, ``aggregator/manifest.json``,
``stormlog_run.json``) would block a plain ``open()`` until some process writes to it: a viewer that
never starts, a ``traceml query`` that never returns. A device or a socket is no run file either.
The file's type is checked before opening (``stat``), the open itself is non-blocking
(``O_NONBLOCK``: a FIFO swapped in between opens at once rather than hanging), and the opened file
is checked again (``fstat``), so no race can slip a FIFO through.

Symbolic links are followed: the callers confine paths to their root themselves (the run store with
``stat_confined``, the catalog by its walk).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a folder; ``strerror`` says which."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegularFile:
    kind = _kind(mode)
    what = kind if kind.startswith("not") else f"{kind}, not a regular file"
    return NotRegularFile(errno.EINVAL, what, os.fspath(path))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, when it is a regular file (a symlink to one is fine).

    Raises:
        NotRegularFile: a FIFO, device, socket or folder (an ``OSError``: callers that report
            unreadable files report this one the same way, ``strerror`` naming the kind).
        OSError: it cannot be opened (missing, permissions).
    """
    fd, _ = _open_checked(path, os.stat(path))
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_checked(path: str | os.PathLike[str], before: os.stat_result) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` opened non-blocking, and its ``fstat``, when both ``before`` (the
    caller's ``stat``) and the opened file are regular files (the module docstring)."""
    if not stat.S_ISREG(before.st_mode):
        raise _refuse(path, before.st_mode)
    fd = os.open(path, _FLAGS)
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):
            raise _refuse(path, after.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, after


def read_stated(path: str | os.PathLike[str], before: os.stat_result) -> bytes:
    """The bytes of ``path``, which the caller's ``stat`` (``before``, links followed) found to be a
    regular file: :func:`read_regular` without its first ``stat``. The open is still non-blocking and
    the opened file is still checked (``fstat``), so a FIFO swapped in since ``before`` is refused,
    never waited on. The file is read with one ``read`` of its size plus one byte (a file that grew
    meanwhile is read to its end): no buffered reader for a file of a few KB (a cold scan of 100,000
    runs reads 400,000 of them, issue 16).

    Raises:
        NotRegularFile: ``before`` or the opened file is not a regular file.
        OSError: it cannot be opened or read.
    """
    fd, after = _open_checked(path, before)
    try:
        data = os.read(fd, after.st_size + 1)
        if len(data) <= after.st_size:
            return data
        parts = [data]
        while chunk := os.read(fd, 1 << 16):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike[str], max_bytes: int = -1) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes`` when given).

    Raises:
        NotRegularFile, OSError: see :func:`open_regular`.
    """
    with open_regular(path) as f:
        return f.read(max_bytes)
