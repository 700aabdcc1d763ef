"""The run catalog as the viewer shows it (docs/catalog.md, "In the viewer"; DESIGN §4, §5).

The viewer's runs are run folders; the catalog's runs are envelopes (``stormlog_run.json``) grouping
sessions, or implicit runs of sessions no envelope covers. A run folder with
``aggregator/manifest.json`` is one catalog session, so each such run folder maps to the catalog run
holding its session: the table's ``catalog_run`` column (the run id), which the grouping feature
groups by, so that an envelope run appears as the group of its sessions' run folders.

:class:`CatalogView` opens the catalog over the viewer's roots (parse cache in the viewer's cache
folder, never inside a root) and keeps one immutable snapshot: the run id of each run folder, the
catalog warnings of each run folder (shown as its file problems) and the others (a global notice),
and each catalog run's attachments. Local attachments are named to the page by an opaque token,
never by path; :meth:`CatalogView.attachment_text` serves one read-only, and only when its real path
lies inside a root. Remote attachments are sent as data (``url``) and never fetched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from traceml_ai.runs.discovery import inside, resolve_roots
from traceml_ai.runs.filters import ColumnFilter, FilterError, parse_filter
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.store import NotFoundError
from traceml_ai.runs.table import NONE_GROUP_LABEL, Group, SortKey, sort_runs

if TYPE_CHECKING:  # the catalog package loads on the first refresh, not with the viewer (issue 16 warm start)
    from traceml_ai.catalog import AttachmentRow, CatalogStore, CatalogWarning

log = logging.getLogger("traceml.ui")

CATALOG_COLUMN: Final = "catalog_run"
"""The table column holding a run folder's catalog run id (``exp-42``, ``job:train-42``,
``session:<session_id>``), or null for a run folder that holds no TraceML session."""

CATALOG_EVERY_S: Final = 30.0
"""A poll opens the catalog again at most this often, unless the set of run folders changed or the
user pressed Refresh (opening it walks every folder under the roots: ~0.1 s per 2,000 run folders
with a warm parse cache, eight times the run store's poll; docs/catalog.md, "In the viewer")."""
CATALOG_COST_FACTOR: Final = 50.0
"""...and at most every this many times the last opening took (issue 16): with 100,000 run folders
an opening takes seconds, so the periodic re-opening stays under 2 % of one core."""

MAX_LISTED_ENTRIES: Final = 1000
"""A folder attachment is listed (names and sizes, one level), at most this many entries."""

_BINARY_PROBE: Final = 8192


class AttachmentRefused(PermissionError):
    """A local attachment whose real path lies outside every root of the viewer (HTTP 403)."""


@dataclass(frozen=True)
class _Local:
    """A local attachment the page may ask for by token."""

    path: str
    run_id: str | None
    attachment_id: str


@dataclass(frozen=True)
class _Snapshot:
    """One opening of the catalog, as the viewer uses it. Replaced whole, never changed."""

    run_of: dict[str, str] = field(default_factory=dict)
    """run folder (real path) → catalog run id"""
    explicit: frozenset[str] = frozenset()
    """catalog run ids that come from an accepted envelope"""
    titles: dict[str, str | None] = field(default_factory=dict)
    run_warnings: dict[str, list[str]] = field(default_factory=dict)
    """run folder → catalog warnings about files inside it, as lines"""
    global_warnings: list[str] = field(default_factory=list)
    attachments: dict[str | None, list[AttachmentRow]] = field(default_factory=dict)
    tokens: dict[str, _Local] = field(default_factory=dict)
    roots: tuple[str, ...] = ()


def attachment_token(row: AttachmentRow) -> str:
    """The opaque name of a local attachment: a hash of its run, id and path, stable across polls
    (a page may open an attachment listed before the last poll). 32 hex characters."""
    text = f"{row.run_id}\0{row.attachment_id}\0{row.path}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class CatalogView:
    """The catalog over the viewer's roots, opened again by :meth:`refresh`.

    Args:
        roots: the viewer's roots (as given; missing ones are skipped).
        cache_dir: the viewer's cache folder for the parse cache, or None to read every file each
            time. A folder inside a root is not used (the catalog never writes inside a root).
        clock: monotonic seconds (tests).
    """

    def __init__(self, roots: Sequence[str], cache_dir: str | None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._roots = list(roots)
        self._cache_dir = cache_dir
        self._clock = clock
        self._snap = _Snapshot()
        self._opened_at: float | None = None
        self._opened_keys: frozenset[str] = frozenset()
        self._lock = threading.Lock()  # one opening at a time (poll thread and Refresh)
        self._missed_force = False  # a Refresh came while another opening was under way
        self.last_open_s: float | None = None
        """Seconds the last opening took (discovery + build), for the benchmark."""

    # -- updating --------------------------------------------------------------------------

    def due(self, keys: Iterable[str], *, force: bool) -> bool:
        """Whether a poll should open the catalog again: on Refresh, at the first poll, when run
        folders appeared or went, or :data:`CATALOG_EVERY_S` after the last opening."""
        if force or self._opened_at is None or self._missed_force:
            return True
        if frozenset(keys) != self._opened_keys:
            return True
        return self.stale()

    def stale(self) -> bool:
        """Whether :meth:`due` holds whatever the runs: never opened, or opened
        :data:`CATALOG_EVERY_S` (or :data:`CATALOG_COST_FACTOR` times its cost) ago. A caller that
        knows the run set did not change asks this, which costs nothing per run."""
        if self._opened_at is None:
            return True
        every = max(CATALOG_EVERY_S, CATALOG_COST_FACTOR * (self.last_open_s or 0.0))
        return self._clock() - self._opened_at >= every

    def refresh(self, runs: Sequence[RunSummary], *, force: bool = False) -> list[str]:
        """Open the catalog again when :meth:`due`; return the keys of the viewer's runs whose
        ``catalog_run`` or catalog warnings changed (so the viewer sends those rows again).

        Never waits for another opening: while one is under way (the first poll's walk of every
        folder takes minutes on a cold disk at 100,000 runs) the call returns ``[]`` at once, so the
        poll that made it goes on updating the live runs (review 16a: every poll waited for the
        walk, the page froze for 4 minutes). The opening under way reports its own changes; a
        Refresh that came meanwhile makes the next call open the catalog again.

        Never raises: a catalog that cannot be opened becomes one global warning.
        """
        keys = [r.key for r in runs]
        if not self.due(keys, force=force):
            return []
        if not self._lock.acquire(blocking=False):
            if force:
                self._missed_force = True
            return []
        try:
            self._missed_force = False
            started = time.perf_counter()
            real_roots = resolve_roots(self._roots)[0]
            try:
                store = self._open(real_roots)
                snap = _snapshot(store, keys, real_roots)
            except Exception as err:  # a catalog bug must not take the run table down
                log.warning("[TraceML] run catalog not read: %s", err)
                snap = _Snapshot(global_warnings=[f"catalog: not read ({type(err).__name__}: {err})"],
                                 roots=tuple(real_roots))
            self.last_open_s = time.perf_counter() - started
            old = self._snap
            self._snap = snap
            self._opened_at = self._clock()
            self._opened_keys = frozenset(keys)
        finally:
            self._lock.release()
        return [k for k in keys if old.run_of.get(k) != snap.run_of.get(k)
                or old.run_warnings.get(k) != snap.run_warnings.get(k)]

    def _open(self, real_roots: list[str]) -> CatalogStore:
        from traceml_ai.catalog import CacheFolderError
        from traceml_ai.catalog import open as open_catalog

        if not real_roots:
            return open_catalog([])
        if self._cache_dir is not None:
            try:
                return open_catalog(real_roots, cache_dir=self._cache_dir)
            except CacheFolderError as err:
                log.warning("[TraceML] catalog parse cache not used: %s", err)
                self._cache_dir = None
        return open_catalog(real_roots)

    # -- reading ---------------------------------------------------------------------------

    def run_of(self, key: str) -> str | None:
        """The catalog run id of run folder ``key``, or None."""
        return self._snap.run_of.get(key)

    def warnings_of(self, key: str) -> list[str]:
        """Catalog warnings about files inside run folder ``key`` (``catalog: <file>: <field>: <message>``)."""
        return self._snap.run_warnings.get(key, [])

    @property
    def global_warnings(self) -> list[str]:
        """Catalog warnings about files in no run folder (e.g. an envelope in the root)."""
        return self._snap.global_warnings

    @property
    def has_explicit(self) -> bool:
        """True when at least one run folder belongs to an envelope's run."""
        snap = self._snap
        return any(r in snap.explicit for r in snap.run_of.values())

    @property
    def has_runs(self) -> bool:
        """True when at least one run folder has a catalog run."""
        return bool(self._snap.run_of)

    def attachments_payload(self, key: str) -> dict[str, Any]:
        """``GET /api/runs/{key}/attachments`` (docs/viewer-api.md): the attachments of run folder
        ``key``'s catalog run.

        Returns ``{"catalog_run": str|None, "explicit": bool, "title": str|None, "attachments": [...]}``,
        each attachment ``{"id", "title", "kind", "storage", "rank", "session", "url", "token",
        "state", "size_bytes"}``: ``url`` for a remote one (data, never fetched), ``token`` for a
        local one; ``state`` is ``remote``, ``file``, ``folder``, ``missing`` or ``outside_root``
        (``size_bytes`` only for a file).
        """
        snap = self._snap
        run_id = snap.run_of.get(key)
        rows = snap.attachments.get(run_id, []) if run_id is not None else []
        return {
            "catalog_run": run_id,
            "explicit": run_id in snap.explicit if run_id is not None else False,
            "title": snap.titles.get(run_id) if run_id is not None else None,
            "attachments": [_attachment_item(a, snap.roots) for a in rows],
        }

    def attachment_text(self, token: str, max_bytes: int) -> str:
        """``GET /api/attachments/{token}``: a local attachment as text, read-only.

        A file: its first ``max_bytes`` bytes (UTF-8, bad bytes replaced; a note when cut), or one
        line when it is binary. A folder: its entries, one level, not their content.

        Raises:
            NotFoundError: no attachment has this token, or it does not exist (HTTP 404).
            AttachmentRefused: its real path (symlinks resolved) lies outside every root (HTTP 403).
        """
        snap = self._snap
        local = snap.tokens.get(token)
        if local is None:
            raise NotFoundError(f"no attachment {token!r} (the catalog may have changed: refresh the page)")
        real = os.path.realpath(local.path)
        if not any(inside(real, root) for root in snap.roots):
            # name where it really is: for a link inside a root, its own path says nothing
            where = real if os.path.normpath(local.path) == real else f"{local.path} points to {real}"
            raise AttachmentRefused(
                f"attachment {local.attachment_id!r} lies outside the viewer's roots ({where}); "
                "the viewer only opens files inside the folders it was started on"
            )
        try:
            st = os.stat(real)
        except OSError:
            raise NotFoundError(f"attachment {local.attachment_id!r}: {local.path} does not exist") from None
        if stat.S_ISDIR(st.st_mode):
            return _listing(real, local.attachment_id)
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError(f"attachment {local.attachment_id!r}: {local.path} is not a regular file")
        # O_NOFOLLOW: the checked real path is what is opened, not a link put there since.
        try:
            fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as err:
            raise NotFoundError(f"attachment {local.attachment_id!r}: cannot be read ({err.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(max_bytes)
        if b"\0" in data[:_BINARY_PROBE]:
            return f"[TraceML: {os.path.basename(real)} is a binary file of {size:,} bytes; not shown as text]\n"
        text = data.decode("utf-8", errors="replace")
        if size > len(data):
            text += f"\n… [TraceML: showing the first {len(data):,} of {size:,} bytes]\n"
        return text

    # -- the table column ------------------------------------------------------------------

    def is_filter(self, expr: str) -> bool:
        """Whether a ``COLUMN:EXPR`` filter names the catalog column."""
        head = expr.strip()
        return head.startswith(CATALOG_COLUMN) and head[len(CATALOG_COLUMN):].lstrip()[:1] in (":", "<", ">", "=", "!")

    def parse_filter(self, expr: str) -> ColumnFilter:
        """Parse a filter on the catalog column (a text column).

        Raises:
            FilterError: a bad expression (one line).
        """
        rest = expr.strip()[len(CATALOG_COLUMN):].lstrip()
        if rest.startswith(":"):
            rest = rest[1:]
        try:
            return parse_filter(rest)
        except FilterError as err:
            raise FilterError(f"{CATALOG_COLUMN}: {err}") from None

    def filter(self, runs: Iterable[RunSummary], filters: Sequence[ColumnFilter]) -> list[RunSummary]:
        """The runs whose catalog run id matches every filter (none: all runs)."""
        items = list(runs)
        if not filters:
            return items
        run_of = self._snap.run_of
        return [r for r in items if all(f.matches(run_of.get(r.key)) for f in filters)]

    def sort(self, runs: Iterable[RunSummary], keys: Sequence[SortKey]) -> list[RunSummary]:
        """:func:`traceml_ai.runs.table.sort_runs` with the catalog column as one more text column
        (case-insensitive, runs without a catalog run last in either direction)."""
        if all(k.column != CATALOG_COLUMN for k in keys):
            return sort_runs(runs, keys)
        run_of = self._snap.run_of
        items = list(runs)
        # One stable pass per key, last key first, as sort_runs does.
        for key in reversed(keys):
            if key.column != CATALOG_COLUMN:
                items = sort_runs(items, [key])
                continue
            present = [r for r in items if run_of.get(r.key)]
            present.sort(key=lambda r: run_of[r.key].casefold(), reverse=key.descending)
            items = present + [r for r in items if not run_of.get(r.key)]
        return items

    def group(self, runs: Iterable[RunSummary]) -> list[Group]:
        """The runs grouped by catalog run: groups ordered by run id (case-insensitive), runs
        without a catalog run last in ``(none)``; runs keep their order inside a group."""
        run_of = self._snap.run_of
        groups: dict[str | None, Group] = {}
        for run in runs:
            rid = run_of.get(run.key)
            g = groups.get(rid)
            if g is None:
                g = groups[rid] = Group(rid if rid is not None else NONE_GROUP_LABEL, rid)
            g.runs.append(run)
        return sorted(groups.values(), key=lambda g: (g.value is None, g.label.casefold(), g.label))

    def columns(self, available: list[str], default: list[str]) -> tuple[list[str], list[str]]:
        """The table's available and default columns with the catalog column added: available when
        a run folder has a catalog run, shown by default when one belongs to an envelope's run."""
        if not self.has_runs:
            return available, default
        available = [*available[:available.index("warnings") + 1], CATALOG_COLUMN,
                     *available[available.index("warnings") + 1:]] if "warnings" in available else [
                         *available, CATALOG_COLUMN]
        if self.has_explicit and CATALOG_COLUMN not in default:
            at = default.index("tags") + 1 if "tags" in default else len(default)
            default = [*default[:at], CATALOG_COLUMN, *default[at:]]
        return available, default


def _snapshot(store: CatalogStore, keys: Sequence[str], roots: list[str]) -> _Snapshot:
    """The viewer's view of one opened catalog."""
    runs = {r.run_id: r for r in store.list_runs()}
    folders = set(keys)
    run_of: dict[str, str] = {}
    also: dict[str, list[str]] = {}
    for s in store.list_sessions(kind="traceml_session"):
        # source_path is <run folder>/aggregator/manifest.json (real path, as the run store's keys).
        folder = os.path.dirname(os.path.dirname(s.source_path))
        if folder not in folders:
            continue
        for run_id in s.run_ids:  # explicit runs first
            have = run_of.get(folder)
            if have is None or (not runs[have].explicit and runs[run_id].explicit):
                run_of[folder] = run_id
            also.setdefault(folder, []).append(run_id)
    run_warnings: dict[str, list[str]] = {}
    global_warnings: list[str] = []
    for w in store.warnings:
        owner = _owner(w.path, folders)
        if owner is None:
            global_warnings.append(f"catalog: {w}")
        else:
            run_warnings.setdefault(owner, []).append(_run_line(w, owner))
    for folder, ids in also.items():
        if len(set(ids)) > 1:
            shown = run_of[folder]
            others = ", ".join(sorted(set(ids) - {shown}))
            run_warnings.setdefault(folder, []).append(
                f"catalog: this run's session is in several catalog runs; grouped under {shown!r}, also in {others}"
            )
    attachments: dict[str | None, list[AttachmentRow]] = {}
    tokens: dict[str, _Local] = {}
    for a in store.list_run_attachments():
        attachments.setdefault(a.run_id, []).append(a)
        if a.path is not None:
            tokens[attachment_token(a)] = _Local(a.path, a.run_id, a.attachment_id or a.title)
    return _Snapshot(
        run_of=run_of,
        explicit=frozenset(r for r, row in runs.items() if row.explicit),
        titles={r: row.title for r, row in runs.items()},
        run_warnings=run_warnings,
        global_warnings=global_warnings,
        attachments=attachments,
        tokens=tokens,
        roots=tuple(roots),
    )


def _owner(path: str, folders: set[str]) -> str | None:
    """The run folder holding ``path`` (the path itself or its nearest ancestor among ``folders``),
    or None; one set lookup per level, so many warnings over many runs stay cheap."""
    here = path
    while True:
        if here in folders:
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _run_line(w: CatalogWarning, folder: str) -> str:
    rel = os.path.relpath(w.path, folder) if w.path != folder else "."
    where = f"{rel}: {w.field}" if w.field else rel
    return f"catalog: {where}: {w.message}"


def _attachment_item(a: AttachmentRow, roots: Sequence[str]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": a.attachment_id,
        "title": a.title,
        "kind": a.kind,
        "storage": a.storage,
        "rank": a.rank,
        "session": a.session_id,
        "url": a.url if a.path is None else None,
        "token": None,
        "state": "remote",
        "size_bytes": None,
    }
    if a.path is None:
        return item
    item["token"] = attachment_token(a)
    real = os.path.realpath(a.path)
    if not any(inside(real, root) for root in roots):
        item["state"] = "outside_root"
        return item
    try:
        st = os.stat(real)
    except OSError:
        item["state"] = "missing"
        return item
    if stat.S_ISDIR(st.st_mode):
        item["state"] = "folder"
    elif stat.S_ISREG(st.st_mode):
        item["state"] = "file"
        item["size_bytes"] = st.st_size
    else:
        item["state"] = "missing"
    return item


def _listing(folder: str, attachment_id: str) -> str:
    """A folder attachment as text: one line per entry (name, then size or ``folder``), not followed
    into; symlinks are named, not resolved."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as err:
        raise NotFoundError(f"attachment {attachment_id!r}: cannot be listed ({err.strerror})") from None
    lines = [f"[TraceML: folder {os.path.basename(folder)}/, {len(entries):,} entries; listed, not opened]"]
    for e in entries[:MAX_LISTED_ENTRIES]:
        try:
            if e.is_symlink():
                lines.append(f"{e.name}  (link)")
            elif e.is_dir(follow_symlinks=False):
                lines.append(f"{e.name}/")
            else:
                lines.append(f"{e.name}  {e.stat(follow_symlinks=False).st_size:,} bytes")
        except OSError:
            lines.append(f"{e.name}  (unreadable)")
    if len(entries) > MAX_LISTED_ENTRIES:
        lines.append(f"… {len(entries) - MAX_LISTED_ENTRIES:,} more")
    return "\n".join(lines) + "\n"
