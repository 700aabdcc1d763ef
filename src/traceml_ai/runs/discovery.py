"""Finding runs: each direct subfolder of a runs root is a run (003 seed, "Security and resource use",
"Limitations"; DESIGN §2.1).

Every path is resolved with realpath; a run folder whose real location leaves its root is ignored
and reported, never read. Dot-folders (temp files of atomic writers, caches) are not runs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from traceml_ai.runs.layout import CORE_FILES

OUTSIDE_ROOT = "symlink points outside the run folder"


class NoRootError(ValueError):
    """None of the configured runs roots exists. The message names them and the fix."""


@dataclass(frozen=True, slots=True)
class RunLocation:
    """A run folder found under a root: ``id`` is the folder name, ``path`` its real path."""

    root: str
    id: str
    path: str


@dataclass
class Listing:
    """The result of listing the roots once.

    Attributes:
        runs: run folders in root order, then name order.
        ignored: ``(path, reason)`` for folders that were skipped.
        missing_roots: configured roots that do not exist (skipped).
        roots: the real paths of the roots that exist.
    """

    runs: list[RunLocation] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    missing_roots: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)


def inside(path: str, folder: str) -> bool:
    """True when real path ``path`` is ``folder`` or below it (both already real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


_GLOB_CHARS = frozenset("*?[")


def is_pattern(root: str | os.PathLike[str]) -> bool:
    """True when ``root`` holds a glob character (``*``, ``?``, ``[``)."""
    return not _GLOB_CHARS.isdisjoint(os.fspath(root))


def expand_root_patterns(roots: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Roots with glob patterns expanded as a shell would (``**`` matches any depth, hidden folders
    are not matched): ``**/runs`` → every folder named ``runs`` below the working directory, sorted.
    A root that names an existing folder is kept as it is, even with glob characters in its name; a
    pattern that matches no folder is kept as given, so that it is reported as missing.
    """
    out: list[str] = []
    for root in roots:
        text = os.fspath(root)
        if not is_pattern(text) or os.path.isdir(os.path.expanduser(text)):
            out.append(text)
            continue
        import glob

        matches = sorted(p for p in glob.glob(os.path.expanduser(text), recursive=True) if os.path.isdir(p))
        out.extend(matches or [text])
    return out


def resolve_roots(roots: Iterable[str | os.PathLike[str]]) -> tuple[list[str], list[str]]:
    """Return ``(existing real paths, missing as given)``, duplicates removed, order kept."""
    found: list[str] = []
    missing: list[str] = []
    for root in roots:
        real = os.path.realpath(os.path.expanduser(os.fspath(root)))
        if not os.path.isdir(real):
            missing.append(os.fspath(root))
        elif real not in found:
            found.append(real)
    return found, missing


def list_runs(roots: Sequence[str | os.PathLike[str]]) -> Listing:
    """List every root once (one directory read each).

    Raises:
        NoRootError: no root exists.
    """
    real_roots, missing = resolve_roots(roots)
    if not real_roots:
        shown = ", ".join(os.fspath(r) for r in roots) or "(none)"
        patterns = [os.fspath(r) for r in roots if is_pattern(r)]
        hint = (f"; the pattern {patterns[0]!r} matches no folder (patterns are expanded like a shell's, "
                "from the working directory)" if patterns else "")
        raise NoRootError(f"no runs folder found (looked for: {shown}){hint}; pass a folder or set TRACEML_ROOTS")
    listing = Listing(missing_roots=missing, roots=real_roots)
    seen: set[str] = set()
    for root in real_roots:
        try:
            with os.scandir(root) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=attrgetter("name"))
        except OSError as err:
            listing.ignored.append((root, f"cannot list: {err.strerror or err}"))
            continue
        found: list[RunLocation] = []
        links: list[os.DirEntry[str]] = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    found.append(RunLocation(root=root, id=entry.name, path=entry.path))
                    seen.add(entry.path)
                elif entry.is_symlink():
                    links.append(entry)
            except OSError:
                continue
        # Symlinks last: one pointing at a run folder of the same root (e.g. "best" -> a run) never
        # takes the place of the folder itself, whichever name sorts first.
        for entry in links:
            real = os.path.realpath(entry.path)
            if not inside(real, root) or real == root:
                listing.ignored.append((entry.path, OUTSIDE_ROOT))
            elif real in seen:
                listing.ignored.append((entry.path, f"same folder as another run ({os.path.basename(real)})"))
            elif os.path.isdir(real):
                seen.add(real)
                found.append(RunLocation(root=root, id=entry.name, path=real))
        if links:
            found.sort(key=attrgetter("id"))
        listing.runs += found
    return listing


CATALOG_FILES = ("stormlog_run.json", "stormlog_attachments.json", "manifest.json")
"""The run catalog's files (``traceml_ai.catalog.schema.ENVELOPE_FILE`` / ``SIDECAR_FILE``, and the
``manifest.json`` of a Stormlog sink, diagnose or OOM bundle; named here because runs may not
import the catalog, DESIGN §1). A folder of a root holding one of them and no run file is a
catalog folder (an envelope grouping run folders, a sink), not a broken run."""



def catalog_only_folder(path: str) -> bool:
    """True when folder ``path`` holds a catalog file (:data:`CATALOG_FILES`) and none of the run
    files: it is not a run. A few ``stat`` calls; the run store asks only for folders it has not
    seen before."""
    join = os.path.join
    if any(os.path.lexists(join(path, name)) for name in CORE_FILES):
        return False
    return any(os.path.lexists(join(path, name)) for name in CATALOG_FILES)


def stat_confined(path: str, root: str) -> tuple[os.stat_result | None, str | None]:
    """``lstat`` a file inside a run; follow a symlink only when its target stays inside ``root``.

    Returns ``(stat, None)`` for a readable regular file, ``(None, None)`` when it does not exist,
    and ``(None, reason)`` when it must be ignored.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None, None
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if not inside(real, root):
            return None, OUTSIDE_ROOT
        try:
            st = os.stat(real)
        except OSError:
            return None, None
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    return st, None
