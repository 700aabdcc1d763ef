"""The catalog's parse cache: facts of unchanged files kept between runs (DESIGN §2.1, §5).

One msgpack file, ``<cache_dir>/catalog-facts.msgpack``, maps a file's real path to its signature
(size, mtime and ctime in ns, inode; for a TraceML session also the ``aggregator/`` folder's
mtime, which changes when a final summary appears) and its
:data:`~traceml_ai.catalog.sources.Fact`, and each folder walked to its entries (kept while the
folder's mtime is unchanged). A folder with no folders in it (a leaf: a run's ``artifacts/``,
``logs/``) is kept inside its parent's entry, by name, not under a path of its own: a run folder
and its three leaves are one entry, not four (issue 16: 400,000 paths at 100,000 runs, 150 MB
once read). A file whose signature changed is read again; every folder is still stat-ed on every
discovery, so nothing changed goes unseen. The cache lives in the cache folder only, never inside a
root (the store refuses such a folder); a cache that cannot be read or written is ignored, as it
only saves time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

import msgspec

from traceml_ai.catalog.sources import Fact

CACHE_FILE: Final = "catalog-facts.msgpack"
CACHE_VERSION: Final = 7
"""Bumped whenever the shape of a fact or entry changes, so older caches are dropped whole (7: leaf
folders inside their parent's entry)."""

Signature = tuple[int, ...]


class _Blob(msgspec.Struct):
    """The file's shape. Every entry stays msgpack bytes (``Raw``, views into the file's buffer)
    until it is looked up: decoding all of them at open built ~400,000 listings at 100,000 runs,
    half a gigabyte of Python objects at once (issue 16), most of them only to be written back."""

    version: int
    entries: dict[str, msgspec.Raw] = {}
    dirs: dict[str, msgspec.Raw] = {}


_BLOB: Final = msgspec.msgpack.Decoder(_Blob)

Kind = Literal["d", "f", "l"]
"""A folder entry's kind: folder, anything else, symlink."""


class _Leaf(msgspec.Struct, array_like=True):
    """A folder with no folder in it, inside its parent's entry: ``[signature, entries]``."""

    signature: list[int]
    entries: list[tuple[str, Kind]]


class _Folder(msgspec.Struct, array_like=True, omit_defaults=True):
    """A folder's entry: ``[signature, entries]`` or ``[signature, entries, {leaf name: leaf}]``.
    Decoded and checked by msgspec in one pass (a Python check of each entry was a third of a walk
    of 100,000 run folders)."""

    signature: list[int]
    entries: list[tuple[str, Kind]]
    leaves: dict[str, _Leaf] = {}


_FOLDER: Final = msgspec.msgpack.Decoder(_Folder)
_ENCODE: Final = msgspec.msgpack.Encoder()


class _Fresh(NamedTuple):
    """A folder listed in this discovery, held as its msgpack entry (``[signature, entries]``), not
    as Python objects: a first walk of 100,000 run folders held 400,000 listings of tuples, ~300 MB
    until saved (review 16c: the viewer's peak after a cold start was 1.24 GB)."""

    data: bytes
    leaf: bool  # no folder (nor symlink) among its entries: written inside its parent's entry


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
        # A folder listed afresh (or a leaf whose parent was), or the Raw entry read unchanged
        # (with its leaves as stored).
        self._new_dirs: dict[str, msgspec.Raw | _Fresh] = {}
        # The leaves of the entries looked up so far, by path, until they are looked up: (the leaf,
        # its parent's path).
        self._leaves: dict[str, tuple[_Leaf, str]] = {}
        self._broken: set[str] = set()  # parents kept as read whose stored leaves no longer hold
        self._dirty = False
        self.hits = 0
        self.misses = 0
        self.listed = 0  # folders listed from disk (the others came from the cache)
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

    def listing(self, path: str, st: os.stat_result) -> list[tuple[str, Kind]]:
        """The entries of folder ``path`` as ``(name, kind)`` in name order, dot-entries left out;
        kind is ``d`` (folder), ``f`` (anything else) or ``l`` (symlink, resolved by the caller).
        Kept while the folder's mtime is unchanged (adding, removing or renaming an entry changes it).

        Raises:
            OSError: the folder cannot be read.
        """
        signature = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        leaf = self._leaves.pop(path, None)
        if leaf is not None:  # inside the entry of its parent, looked up before it
            stored, parent = leaf
            intact = parent not in self._broken and isinstance(self._new_dirs.get(parent), msgspec.Raw)
            if stored.signature != signature:
                self._broken.add(parent)  # (its entry holds this leaf as it was)
                return self._list(path, signature)
            if not intact:
                self._new_dirs[path] = _fresh(stored.signature, stored.entries)  # (written in its parent)
            return stored.entries
        raw: msgspec.Raw | _Fresh | None = self._old_dirs.pop(path, None)
        if raw is None:  # a second look in this discovery (the root is listed twice), or a new folder
            raw = self._new_dirs.get(path)
            if raw is None:
                return self._list(path, signature, self._stored_leaf(path))
        folder = _folder(raw)
        if folder is None:
            return self._list(path, signature)
        # Its leaves have signatures of their own: they hold even when the folder itself changed.
        prefix = path.rstrip(os.sep) + os.sep
        for name, stored_leaf in folder.leaves.items():
            if prefix + name not in self._new_dirs:
                self._leaves[prefix + name] = (stored_leaf, path)
        if folder.signature != signature:
            return self._list(path, signature)
        if self.path is not None and path not in self._new_dirs:
            self._new_dirs[path] = raw  # written back as read
        return folder.entries

    def _list(self, path: str, signature: list[int], stored: _Leaf | None = None) -> list[tuple[str, Kind]]:
        """The entries of ``path`` from disk, kept for the next discovery; or those of ``stored``, a
        leaf held by its parent's entry kept as read, when it has this signature (else that entry
        is written anew). A folder that is a leaf now goes into its parent's entry when saved."""
        if stored is not None:
            if stored.signature == signature:
                return stored.entries
            self._broken.add(os.path.dirname(path.rstrip(os.sep)))
        self.listed += 1
        with os.scandir(path) as it:
            entries: list[tuple[str, Kind]] = sorted(
                (e.name, "l" if e.is_symlink() else "d" if e.is_dir() else "f")
                for e in it if not e.name.startswith("."))
        self._dirty = True
        if self.path is not None:
            self._new_dirs[path] = _fresh(signature, entries)
        return entries

    def _stored_leaf(self, path: str) -> _Leaf | None:
        """Leaf ``path`` in its parent's entry kept as read (a leaf looked up a second time in one
        discovery), or None."""
        head, name = os.path.split(path.rstrip(os.sep))
        raw = self._new_dirs.get(head)
        folder = _folder(raw) if isinstance(raw, msgspec.Raw) else None
        return folder.leaves.get(name) if folder is not None else None

    def _dirs_to_save(self) -> dict[str, msgspec.Raw]:
        """The folder entries to write, as msgpack: each folder listed in this discovery, its
        leaves inside it. An entry read unchanged is written back as read unless one of its leaves
        was listed again; the others are built one at a time (never all of them as objects)."""
        new = self._new_dirs
        nested: dict[str, dict[str, msgspec.Raw]] = {}
        for path, kept in new.items():
            if isinstance(kept, _Fresh) and kept.leaf:
                head, name = os.path.split(path.rstrip(os.sep))
                if head in new and head != path:
                    nested.setdefault(head, {})[name] = msgspec.Raw(kept.data)  # (a leaf's layout)
        out: dict[str, msgspec.Raw] = {}
        for path, kept in new.items():
            head, name = os.path.split(path.rstrip(os.sep))
            if name in nested.get(head, ()):
                continue  # (inside its parent's entry)
            mine = nested.get(path)
            if isinstance(kept, msgspec.Raw) and path not in self._broken and mine is None:
                out[path] = kept
                continue
            if isinstance(kept, _Fresh) and mine is None:
                out[path] = msgspec.Raw(kept.data)
                continue
            folder = _folder(kept)
            if folder is None:
                continue
            leaves: dict[str, _Leaf | msgspec.Raw] = {}
            if isinstance(kept, msgspec.Raw):
                # the leaves not listed again (those that were are in nested, or no longer leaves)
                prefix = path.rstrip(os.sep) + os.sep
                leaves.update((n, leaf) for n, leaf in folder.leaves.items() if prefix + n not in new)
            leaves.update(mine or {})
            out[path] = msgspec.Raw(_ENCODE.encode(_Folder(folder.signature, folder.entries, leaves)))  # type: ignore[arg-type]
        return out

    def save(self) -> None:
        """Write the facts seen in this discovery (temp file + rename). Files no longer seen are
        forgotten. Errors are ignored: the cache only saves time."""
        # What was read and not seen again is still in _old and _old_dirs (the rest were popped).
        if self.path is None or not (self._dirty or self._old or self._old_dirs):
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            blob = {"version": CACHE_VERSION, "entries": self._new, "dirs": self._dirs_to_save()}
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


def _folder(raw: msgspec.Raw | _Fresh | None) -> _Folder | None:
    """A folder's entry (as stored, or as kept earlier in this discovery), or None when there is
    none or it is not a folder's entry (a damaged entry is listed again, like a changed folder)."""
    if raw is None:
        return None
    try:
        return _FOLDER.decode(raw.data if isinstance(raw, _Fresh) else raw)
    except msgspec.DecodeError:  # (a ValidationError too)
        return None


def _fresh(signature: list[int], entries: list[tuple[str, Kind]]) -> _Fresh:
    return _Fresh(_ENCODE.encode(_Folder(signature, entries)), _is_leaf(entries))


def _is_leaf(entries: list[tuple[str, Kind]]) -> bool:
    """A folder whose entries hold no folder (nor a symlink, which may point to one)."""
    return all(kind == "f" for _, kind in entries)


def _encodable(value: Any) -> bool:
    try:
        msgspec.msgpack.encode(value)
    except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
        return False
    return True


def file_signature(st: os.stat_result) -> Signature:
    """(size, mtime ns, inode, ctime ns) of a stat result."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
