"""The catalog's parse cache: facts of unchanged files kept between runs (DESIGN §2.1, §5).

One msgpack file, ``<cache_dir>/catalog-facts.msgpack``, maps a file's real path to its signature
(size, mtime and ctime in ns, inode; for a TraceML session also the ``aggregator/`` folder's
mtime, which changes when a final summary appears) and its
:data:`~traceml_ai.catalog.sources.Fact`, and each folder walked to its entries (kept while the
folder's mtime is unchanged). A file whose signature changed is read again; every folder is still
stat-ed on every discovery, so nothing changed goes unseen. The cache lives in the cache folder only, never inside a
root (the store refuses such a folder); a cache that cannot be read or written is ignored, as it
only saves time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

import msgspec

from traceml_ai.catalog.sources import Fact

CACHE_FILE: Final = "catalog-facts.msgpack"
CACHE_VERSION: Final = 6
"""Bumped whenever the shape of a fact changes, so older caches are dropped whole."""

Signature = tuple[int, ...]


class _Blob(msgspec.Struct):
    """The file's shape. Every entry stays msgpack bytes (``Raw``, views into the file's buffer)
    until it is looked up: decoding all of them at open built ~400,000 listings at 100,000 runs,
    half a gigabyte of Python objects at once (issue 16), most of them only to be written back."""

    version: int
    entries: dict[str, msgspec.Raw] = {}
    dirs: dict[str, msgspec.Raw] = {}


_BLOB: Final = msgspec.msgpack.Decoder(_Blob)


class FactCache:
    """Facts by real path, validated by signature.

    Args:
        folder: the cache folder, or None for no cache (every file is read).

    Example::

        cache = FactCache("/data/.cache")
        fact = cache.get(path, signature, read_envelope)   # parsed only if changed
        cache.save()
    """

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        self.path = os.path.join(os.fspath(folder), CACHE_FILE) if folder is not None else None
        self._old: dict[str, msgspec.Raw] = {}
        self._new: dict[str, Any] = {}  # [signature, fact], or the Raw entry read unchanged
        self._old_dirs: dict[str, msgspec.Raw] = {}
        self._new_dirs: dict[str, Any] = {}  # [signature, entries], or the Raw entry read unchanged
        self._dirty = False
        self.hits = 0
        self.misses = 0
        if self.path is not None:
            try:
                with open(self.path, "rb") as f:
                    blob = _BLOB.decode(f.read())
                if blob.version == CACHE_VERSION:
                    self._old, self._old_dirs = blob.entries, blob.dirs
            except (OSError, msgspec.DecodeError):
                self._old, self._old_dirs = {}, {}

    def get(self, path: str, signature: Signature, read: Callable[[str], Fact]) -> Fact:
        """The fact of ``path``: cached when its signature is unchanged, else ``read(path)``."""
        # Popped, so the old key texts are freed as the walk goes; a second look in the same
        # discovery (the root is listed twice) finds what the first one kept.
        raw = self._old.pop(path, None) or self._new.get(path)
        entry = _entry(raw)
        if entry is not None and tuple(entry[0]) == signature:
            self.hits += 1
            fact: Fact = entry[1]
            kept: Any = raw  # written back as read
        else:
            self.misses += 1
            self._dirty = True
            fact = read(path)
            kept = [list(signature), fact]
        if self.path is not None:
            self._new[path] = kept
        return fact

    def listing(self, path: str, st: os.stat_result) -> list[tuple[str, str]]:
        """The entries of folder ``path`` as ``(name, kind)`` in name order, dot-entries left out;
        kind is ``d`` (folder), ``f`` (anything else) or ``l`` (symlink, resolved by the caller).
        Kept while the folder's mtime is unchanged (adding, removing or renaming an entry changes it).

        Raises:
            OSError: the folder cannot be read.
        """
        signature = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        raw = self._old_dirs.pop(path, None) or self._new_dirs.get(path)
        entry = _entry(raw)
        if entry is not None and entry[0] == signature:
            entries: list[tuple[str, str]] = entry[1]
            kept: Any = raw  # written back as read
        else:
            with os.scandir(path) as it:
                entries = sorted((e.name, "l" if e.is_symlink() else "d" if e.is_dir() else "f")
                                 for e in it if not e.name.startswith("."))
            self._dirty = True
            kept = [signature, entries]
        if self.path is not None:
            self._new_dirs[path] = kept
        return entries

    def save(self) -> None:
        """Write the facts seen in this discovery (temp file + rename). Files no longer seen are
        forgotten. Errors are ignored: the cache only saves time."""
        # What was read and not seen again is still in _old and _old_dirs (the rest were popped).
        if self.path is None or not (self._dirty or self._old or self._old_dirs):
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            blob = {"version": CACHE_VERSION, "entries": self._new, "dirs": self._new_dirs}
            try:
                data = msgspec.msgpack.encode(blob)
            except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
                # a fact msgpack cannot hold (an integer beyond 64 bits): that file is read each time
                blob["entries"] = {k: v for k, v in self._new.items() if _encodable(v)}
                data = msgspec.msgpack.encode(blob)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _entry(raw: msgspec.Raw | list[Any] | None) -> list[Any] | None:
    """A cached ``[signature, value]`` pair (as stored, or as kept earlier in this discovery), or
    None when there is none or it is not such a pair (a damaged entry is read again, like a
    changed file)."""
    if raw is None or isinstance(raw, list):
        return raw
    try:
        entry = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return None
    return entry if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list) else None


def _encodable(value: Any) -> bool:
    try:
        msgspec.msgpack.encode(value)
    except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
        return False
    return True


def file_signature(st: os.stat_result) -> Signature:
    """(size, mtime ns, inode, ctime ns) of a stat result."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
