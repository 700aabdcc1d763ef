"""Listing the runs roots only when they changed (issue 16 item 1; 003 seed, "Live refresh").

A new or removed run folder changes its root directory's modification time and, for a folder, its
link count (the number of sub-folders plus two on ext4/XFS). :class:`RootWatch` keeps the last
:class:`~traceml_ai.runs.discovery.Listing` and one ``stat`` of each root; a poll lists the roots
again only when

- a root's stamp ``(inode, mtime_ns, link count, size)`` differs from the one taken before the last
  listing, or a root appeared or went;
- the last listing's stamp was *racy*: the root's mtime was less than :data:`RACY_S` seconds old
  when it was taken, so a folder created in the same file-system clock tick could hide behind an
  unchanged mtime (the same rule git applies to its index);
- :data:`RELIST_EVERY_POLLS` polls passed since the last listing, so a file system whose directory
  mtimes are coarse or cached (NFS attribute caching, some FUSE mounts) cannot hide a new run for
  longer than that many poll intervals (60 s at the default 5 s interval); such a poll reads the
  roots' entry names first and lists them only when the names differ from the previous check;
- the caller forces it (the viewer's Refresh).

The watch only reads (one ``stat`` per root per poll); it never writes anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Final

from traceml_ai.runs.discovery import Listing, list_runs, resolve_roots

RELIST_EVERY_POLLS: Final = 12
"""A root is listed again at least every this many polls, changed or not."""
RACY_S: Final = 2.0
"""A root whose mtime is younger than this (seconds, against the wall clock) is listed again at the
next poll too: its stamp cannot yet prove that nothing was added in the same clock tick."""

RootStamp = tuple[int, int, int, int]
"""``(st_ino, st_mtime_ns, st_nlink, st_size)`` of a root directory."""


def root_stamp(path: str) -> RootStamp | None:
    """The stamp of directory ``path`` (one ``stat``), or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_nlink, st.st_size


class RootWatch:
    """The listing of ``roots``, taken again only when a root changed (see the module docstring).

    Args:
        roots: the runs roots as configured (missing ones are skipped, as :func:`list_runs` does).
        relist_every: list again after this many polls without a change (at least 1).
        wall_clock: Unix seconds, compared with directory mtimes (the real clock: tests that move
            the store's clock by hand must not make a stamp look old).

    Example:
        >>> watch = RootWatch(["traceml/runs"])          # doctest: +SKIP
        >>> listing, relisted = watch.listing()          # doctest: +SKIP
    """

    def __init__(
        self,
        roots: Sequence[str | os.PathLike[str]],
        *,
        relist_every: int = RELIST_EVERY_POLLS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.roots = [os.fspath(r) for r in roots]
        self.relist_every = max(1, relist_every)
        self.wall_clock = wall_clock
        self.listings = 0
        """How many times the roots were listed (tests and the benchmark read it)."""
        self._listing: Listing | None = None
        self._stamps: dict[str, RootStamp | None] = {}
        self._trusted = False
        self._polls_since = 0
        self._names_listed: list[list[str]] | None = None

    def listing(self, *, force: bool = False) -> tuple[Listing, bool]:
        """The current listing and whether the roots were listed again for it.

        When nothing says a root changed, this is the previous :class:`Listing` object itself
        (``relisted`` False) and costs one ``stat`` per root.

        Raises:
            NoRootError: no root exists (only raised by a listing, as :func:`list_runs` does).
        """
        self._polls_since += 1
        if not force and self._listing is not None and self._trusted:
            stamps = self._current_stamps()
            if stamps == self._stamps:
                if self._polls_since < self.relist_every:
                    return self._listing, False
                # Due by count alone: the entry names say whether a run came or went, for less
                # than a listing (no entry types, no objects per run).
                self._polls_since = 0
                names = self._names(stamps)
                if names is not None and names == self._names_listed:
                    return self._listing, False
                self._names_listed = names  # (compared at the next due poll)
            else:
                self._names_listed = None
        else:
            self._names_listed = None
        # Stamps first, listing second: a folder made in between shows as a changed stamp next time.
        stamps = self._current_stamps()
        now = self.wall_clock()
        listing = list_runs(self.roots)
        self.listings += 1
        self._listing, self._stamps, self._polls_since = listing, stamps, 0
        # (a missing root cannot hide a change: its appearing changes the stamps themselves)
        self._trusted = all(s is None or s[1] < (now - RACY_S) * 1e9 for s in stamps.values())
        return listing, True

    @staticmethod
    def _names(stamps: dict[str, RootStamp | None]) -> list[list[str]] | None:
        """The sorted entry names of each existing root (dot-names left out), None if one fails."""
        out = []
        for root, stamp in stamps.items():
            if stamp is None:
                continue
            try:
                out.append(sorted(name for name in os.listdir(root) if not name.startswith(".")))
            except OSError:
                return None
        return out

    def _current_stamps(self) -> dict[str, RootStamp | None]:
        real, missing = resolve_roots(self.roots)
        stamps: dict[str, RootStamp | None] = {root: root_stamp(root) for root in real}
        for root in missing:
            stamps[root] = None
        return stamps


__all__ = ["RACY_S", "RELIST_EVERY_POLLS", "RootStamp", "RootWatch", "root_stamp"]
