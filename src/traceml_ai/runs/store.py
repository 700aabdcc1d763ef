"""The run store: every run under the roots, parsed once and kept fresh cheaply (003 seed, "Live
refresh"; DESIGN §1, §4).

- A parse cache keyed by each file's ``(mtime_ns, size)``: a file is parsed again only when one of
  them changed.
- :meth:`RunStore.poll` costs what changed (issue 16): it lists the roots again only when a root's
  directory stamp changed (or every :data:`~traceml_ai.runs.watch.RELIST_EVERY_POLLS` polls; see
  :mod:`traceml_ai.runs.watch`), stats the core files of unfinished runs only, and re-parses only
  changed files. Completed, failed and killed runs are frozen until :meth:`RunStore.refresh`.
- Histories (``metrics.jsonl``) are read only on request (:meth:`RunStore.history`) and then advanced
  by the appended bytes.
- A file that turns corrupt keeps its last good parse and adds a warning to that run; a problem in
  one run never affects another.

The store only reads: it never writes inside a runs root.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import islice
from typing import Any

from traceml_ai.runs.discovery import (
    Listing,
    RunLocation,
    catalog_only_folder,
    inside,
    resolve_roots,
    stat_confined,
)
from traceml_ai.runs.layout import (
    CONFIG_JSON,
    DEFAULT_MAX_METRICS_FILE_MB,
    DEFAULT_STALE_AFTER_SECONDS,
    METRICS_HEAD_BYTES,
    METRICS_JSON,
    METRICS_JSONL,
    PARAMS_YAML,
    RUN_FOLDER_STAMP,
    RUN_ID_RE,
    RUN_JSON,
    VIEWABLE_FILES,
)
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import MetricValue, RunSummary, Scalar
from traceml_ai.runs.readers import (
    MetricsJson,
    RunFileError,
    RunJson,
    check_size,
    load_json,
    parse_iso,
    parse_metrics_json,
    parse_params_yaml,
    parse_run_json,
)
from traceml_ai.runs.safeio import NotRegularFile, open_regular, read_stated
from traceml_ai.runs.status import display_status
from traceml_ai.runs.watch import RootWatch


def _parse_run_json_typed(data: bytes, name: str) -> tuple[RunJson, list[str]]:
    # The store keeps the typed fields only: the whole object (command, host, git, ...) is re-read
    # for the inspector by RunStore.details, and with 10,000 runs in a viewer it was a third of the
    # store's memory.
    return parse_run_json(data, name, keep_raw=False)


_PARSERS: dict[str, Callable[[bytes, str], tuple[Any, list[str]]]] = {
    RUN_JSON: _parse_run_json_typed,
    PARAMS_YAML: parse_params_yaml,
    METRICS_JSON: parse_metrics_json,
    CONFIG_JSON: load_json,
}
_TABLE_FILES = (RUN_JSON, PARAMS_YAML, METRICS_JSON)


class NotFoundError(KeyError):
    """No such run (or viewable file of a run): what the user asked for is not there (the viewer
    answers HTTP 404, the CLI one line). A ``KeyError``, so callers that catch that keep working;
    a bare ``KeyError`` from a lookup in our own code is a bug, not this."""

_CLOCK_SKEW_S = 300.0
_NO_WARNINGS: tuple[str, ...] = ()
_FINISHED = frozenset(("completed", "failed", "killed"))
_POLL_CHUNK = 256  # runs checked per hold of the run table during a poll

# The per-run bookkeeping below is slotted, and warning lists that are empty (nearly all) are one
# shared empty tuple: a viewer keeps this for every run (10,000 and more).


@dataclass(slots=True)
class _FileState:
    """The parse cache entry of one file. ``value`` is the last good parse."""

    stamp: tuple[int, int] | None = None
    value: Any = None
    warnings: Sequence[str] = _NO_WARNINGS
    error: str | None = None
    present: bool = False


@dataclass(slots=True)
class _Head:
    """What the first 64 KB of metrics.jsonl told: start values and metric names."""

    stamp: tuple[int, int] | None = None
    start: dict[str, MetricValue] = field(default_factory=dict)
    last: dict[str, MetricValue] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    complete: bool = False  # the whole file fitted in the head
    final: bool = False  # read past 64 KB: never read again
    warnings: Sequence[str] = _NO_WARNINGS
    problem: str | None = None  # the file is refused (e.g. a symlink leaving the root)


_NO_HEAD = _Head()


@dataclass(slots=True)
class _RunState:
    loc: RunLocation
    files: dict[str, _FileState] = field(default_factory=dict)
    head: _Head = field(default_factory=lambda: _NO_HEAD)  # replaced, never changed in place
    tail: MetricsTail | None = None
    summary: RunSummary | None = None
    # From the run database (RunStore.seed): the summary stands while its files keep these stamps.
    seed: tuple[RunSummary, Mapping[str, tuple[int, int]]] | None = None
    # run.json's whole object as the inspector last read it (RunStore.details): (stamp, object).
    run_json: tuple[tuple[int, int], dict[str, Any]] | None = None
    # The run folder's (mtime_ns, inode) taken before its files were last stat'ed (issue 16).
    folder: tuple[int, int] | None = None


@dataclass(frozen=True)
class PollResult:
    """What one poll or refresh changed.

    Attributes:
        changed: keys of runs that are new or whose summary changed (display status included).
        removed: keys of runs whose folders disappeared.
        version: the store's version counter after this poll (it grows by one per poll that
            changed anything).
    """

    changed: list[str]
    removed: list[str]
    version: int


@dataclass(frozen=True)
class RunDetails:
    """Everything the inspector shows about one run: the summary plus config.json."""

    summary: RunSummary
    config: Any
    files: dict[str, int | None]  # file name → size in bytes (None when absent)


class RunStore:
    """All runs under ``roots``.

    Args:
        roots: runs folders; each direct subfolder is a run. Missing ones are skipped (listed in
            :attr:`warnings`); :class:`~traceml_ai.runs.discovery.NoRootError` when none exists.
        stale_after_seconds: heartbeat age after which a running run shows as ``stale``.
        max_metrics_file_mb: read at most this many MB of a metrics.jsonl.
        clock: Unix-seconds clock (tests pass a fake one).

    Thread safety: a web server may call every method from threads. Polls run one at a time and hold
    the run table a chunk of runs at a time; :meth:`history`, :meth:`details` and :meth:`read_file`
    wait for at most a chunk; :meth:`runs` and :meth:`get` do not wait.

    Example:
        >>> store = RunStore(["traceml/runs"])          # doctest: +SKIP
        >>> store.poll().changed                        # doctest: +SKIP
        ['/abs/traceml/runs/20261130-101500_baseline_a3f9', ...]
    """

    def __init__(
        self,
        roots: Sequence[str | os.PathLike[str]],
        *,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
        max_metrics_file_mb: float = DEFAULT_MAX_METRICS_FILE_MB,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.roots = [os.fspath(r) for r in roots]
        self.stale_after_seconds = stale_after_seconds
        self.max_metrics_bytes = int(max_metrics_file_mb * 2**20)
        self.clock = clock
        self.version = 0
        self.warnings: list[str] = []
        self._runs: dict[str, _RunState] = {}
        self._lock = threading.RLock()  # the run table and each run's state
        self._poll_lock = threading.Lock()  # one poll or refresh at a time
        self._scanned = False
        self._trust_folders = False  # see _check_run
        self._unchanged_since_seed: set[str] = set()
        # Polls cost what changed (issue 16): the roots are listed again only when their stamps say
        # so (runs/watch.py), and between listings a poll checks the unfinished runs only.
        self._watch = RootWatch(self.roots)
        self._listed: list[tuple[str, str]] = []  # (path, id) of the last listing's runs
        self._unfinished: list[str] = []  # keys of the runs a poll checks (not finished)
        self._members: set[str] = set()  # the keys as of the last change of membership
        self.membership = 0
        """Grows by one whenever runs appear or go (a poll that only updated runs leaves it): the
        layers above redo their per-run work over all runs only when it moved."""
        self.progress = (0, 0)
        """``(runs checked, runs listed)`` of the poll under way that lists the roots (the last
        one's when none is): what a command shows while a first scan of 100,000 runs lasts."""

    # -- public ----------------------------------------------------------------------------

    def poll(self) -> PollResult:
        """Bring the store up to date the cheap way (003 seed, "Live refresh").

        The first call scans everything; after :meth:`seed` it checks a finished cached run by one
        ``stat`` of its folder (its ``(mtime_ns, inode)`` as the run database recorded it: any file
        created, replaced or removed there moves it) and the other runs file by file. Later calls
        list the roots again only when a root's directory stamp changed or every
        :data:`~traceml_ai.runs.watch.RELIST_EVERY_POLLS` polls (:mod:`traceml_ai.runs.watch`), pick
        up new and removed runs, and re-check only unfinished runs (running, legacy, unreadable):
        a poll without changes costs O(unfinished runs), not O(runs). Raises
        :class:`~traceml_ai.runs.discovery.NoRootError` when no root exists.
        """
        return self._update(recheck_finished=not self._scanned, trust_folders=True)

    def refresh(self) -> PollResult:
        """Like :meth:`poll`, but also re-check finished runs (the Refresh button)."""
        return self._update(recheck_finished=True)

    def runs(self) -> list[RunSummary]:
        """Every run's summary, in root order then folder-name order.

        Does not wait for a poll in progress (which holds the store for its whole scan, seconds
        for 10,000 runs): it answers with each run as it stands, some maybe already updated by that
        poll. (Copying the run table is one C-level step, which no other thread interleaves with.)
        """
        return [s.summary for s in list(self._runs.values()) if s.summary is not None]

    def unfinished(self) -> list[str]:
        """The keys of the runs a poll checks: those whose run.json does not say completed, failed or
        killed (running, stale, legacy, unreadable), as of the last poll. Finished runs wait for
        :meth:`refresh`."""
        return list(self._unfinished)

    def unchanged_since_seed(self) -> set[str]:
        """After the first poll of a store started by :meth:`seed`: the keys of the finished cached
        runs that poll found unchanged by their folder's stamp alone (nothing created, replaced or
        removed in the folder since the run database recorded it; empty after any later poll). The
        layer above uses it the same way: a run whose cached ``perf`` is ``{}`` had no
        ``aggregator/`` folder, and still has none."""
        return set(self._unchanged_since_seed)

    def get(self, key: str) -> RunSummary | None:
        """The summary of the run with real path ``key``, or None (without waiting for a poll, as
        :meth:`runs`)."""
        state = self._runs.get(key)
        return state.summary if state else None

    def find(self, ref: str) -> RunSummary:
        """Find a run by folder path, id, unique id prefix, or name (:meth:`resolve` without its note).

        Raises:
            NotFoundError: no run matches, or several do by id prefix or by the start of
                different names (the message lists them).
        """
        return self.resolve(ref)[0]

    def resolve(self, ref: str) -> tuple[RunSummary, str | None]:
        """The run ``ref`` names, and a one-line note when the choice needs saying (else None).

        ``ref`` is tried as a folder path, an id, an id prefix, a name, then the start of a name.
        Names need not be unique (a script run three times makes three runs of one name): when
        several runs have that name (or a name starting with ``ref``, all the same) the newest by
        ``started_at`` (then by id) is taken, and the note says how many matched and how to pick
        another (its id or folder path; ``traceml runs ls --filter name=...`` lists them).

        Raises:
            NotFoundError: no run matches, several match an id prefix, or the start of a name
                matches different names (the message lists them).
        """
        with self._lock:
            real = os.path.realpath(ref)
            if real in self._runs and self._runs[real].summary is not None:
                return self._runs[real].summary, None  # type: ignore[return-value]
            runs = self.runs()
            by_id = [r for r in runs if r.id == ref] or [r for r in runs if r.id.startswith(ref)]
            if len(by_id) == 1:
                return by_id[0], None
            if len(by_id) > 1:
                shown = ", ".join(r.id for r in by_id[:5])
                raise NotFoundError(f"{ref!r} is the start of {len(by_id)} run ids ({shown}); give more of the id")
            by_name = [r for r in runs if r.name == ref] or [r for r in runs if r.name.startswith(ref)]
            names = sorted({r.name for r in by_name})
            if len(names) > 1:
                shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
                raise NotFoundError(f"{ref!r} is the start of {len(names)} run names ({shown}); "
                                    "give the whole name, an id or a folder path")
            if not by_name:
                raise NotFoundError(f"no run {ref!r} under {', '.join(self.roots)}")
            run = max(by_name, key=_newest_first_key)
            if len(by_name) == 1:
                return run, None
            listing = shlex.quote(f"name={names[0]}")
            note = (f"{len(by_name)} runs are named {names[0]!r}; using the newest, {run.id} (started "
                    f"{run.started_at or 'at an unknown time'}); name another by its id or folder path "
                    f"(traceml runs ls --filter {listing} lists them)")
            return run, note

    def history(self, key: str) -> MetricsTail:
        """The run's metrics.jsonl reader, loaded on first request and advanced by the appended
        bytes on each later call. Its warnings are added to the run's summary.

        Raises:
            NotFoundError: unknown run.
        """
        with self._lock:
            state = self._known(key)
            path = os.path.join(state.loc.path, METRICS_JSONL)
            _st, reason = stat_confined(path, state.loc.root)
            if state.tail is None:
                # A confined symlink is read through its real path; an outside one not at all. A file
                # that does not exist yet is read from its path once it appears.
                real = os.path.realpath(path) if reason is None else os.devnull
                state.tail = MetricsTail(real, self.max_metrics_bytes)
            before = list(state.tail.warnings)
            if reason is None:
                state.tail.advance()
            if state.tail.warnings != before and state.summary is not None:
                self._build_summary(state)
            return state.tail

    def loaded_rows(self, key: str) -> int:
        """How many rows of the run's metrics.jsonl are loaded now (0 before :meth:`history` was
        first asked, and for an unknown run); reads nothing."""
        state = self._runs.get(key)
        return len(state.tail.rows) if state is not None and state.tail is not None else 0

    def details(self, key: str) -> RunDetails:
        """The run's summary with :attr:`RunSummary.run_json` filled, plus its config.json (both
        read on request and cached by mtime and size; a file that cannot be read now gives the
        version last read, or nothing).

        Raises:
            NotFoundError: unknown run.
        """
        with self._lock:
            state = self._known(key)
            if self._update_file(state, CONFIG_JSON):
                self._build_summary(state)
            sizes: dict[str, int | None] = {}
            for name in VIEWABLE_FILES:
                st, _ = self._stat_viewable(state, name)
                sizes[name] = st.st_size if st is not None else None
            assert state.summary is not None
            summary = dataclasses.replace(state.summary, run_json=self._run_json(state))
            return RunDetails(summary, state.files[CONFIG_JSON].value, sizes)

    def _known(self, key: str) -> _RunState:
        state = self._runs.get(key)
        if state is None:
            raise NotFoundError(f"no run {key!r}")
        return state

    @staticmethod
    def _run_json(state: _RunState) -> dict[str, Any]:
        """run.json's whole object for the inspector, read again when its stamp changed."""
        path = state.loc.path + os.sep + RUN_JSON
        st, _reason = stat_confined(path, state.loc.root)
        if st is None:
            state.run_json = None
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if state.run_json is not None and state.run_json[0] == stamp:
            return state.run_json[1]
        try:
            check_size(RUN_JSON, st.st_size)
            with open_regular(path) as f:
                run, _warnings = parse_run_json(f.read(), RUN_JSON)
        except Exception:
            # Its problem is already a warning on the run (the table's parse saw the same file).
            return state.run_json[1] if state.run_json is not None else {}
        state.run_json = (stamp, run.raw)
        return run.raw

    def read_file(self, key: str, name: str, max_bytes: int, *, tail: bool = False) -> tuple[bytes, int]:
        """The first ``max_bytes`` bytes (the last ones with ``tail=True``) of one of the
        viewable files of a known run, and the file's size (003 seed, security: "a known run plus
        one of a few fixed file names"; :data:`~traceml_ai.runs.layout.VIEWABLE_FILES`).

        Raises:
            NotFoundError: unknown run, a name outside :data:`VIEWABLE_FILES` (such as ``../../secret``),
                or a file that is absent or refused (a symlink leaving the root).
        """
        if name not in VIEWABLE_FILES:
            raise NotFoundError(f"{name!r} is not one of the viewable files ({', '.join(VIEWABLE_FILES)})")
        with self._lock:
            state = self._known(key)
            st, reason = self._stat_viewable(state, name)
            if st is None:
                raise NotFoundError(f"{name} of {state.loc.id}: {reason or 'not found'}")
            try:
                with open_regular(os.path.realpath(os.path.join(state.loc.path, name))) as f:
                    if tail and st.st_size > max_bytes:
                        f.seek(st.st_size - max_bytes)
                    return f.read(max_bytes), st.st_size
            except NotRegularFile as err:
                raise NotFoundError(f"{name} of {state.loc.id}: {err.strerror}") from None

    @staticmethod
    def _stat_viewable(state: _RunState, name: str) -> tuple[os.stat_result | None, str | None]:
        path = os.path.join(state.loc.path, name)
        if "/" in name and not inside(os.path.realpath(os.path.dirname(path)), state.loc.path):
            return None, "symlink points outside the run folder"  # e.g. a symlinked aggregator/
        return stat_confined(path, state.loc.root)

    def seed(self, cached: Mapping[str, tuple[RunSummary, Mapping[str, tuple[int, int]]]]) -> int:
        """Fill the store from the run database before the first poll (003 seed, "Live refresh":
        "the table is filled from it right away. Then each run's files are stat'ed once, and only
        changed files are parsed again").

        Args:
            cached: run key → ``(summary, {file: (mtime_ns, size)})`` as
                :func:`traceml_ai.runs.rundb.load_db` returns them (``LoadedDb.runs``).

        The store keeps the summaries and stamp mappings it takes (it does not copy them). A cached
        run is taken only when its key lies inside one of the roots; it is shown at once by
        :meth:`runs`. The first :meth:`poll` lists the roots as usual (a cached run not found there is
        removed, one found elsewhere is read afresh), stats the core files of every run, keeps a cached
        summary whose files have the same stamps (its display status recomputed) and parses the runs
        whose files changed. Returns the number of runs taken.

        Raises:
            RuntimeError: the store has already been polled (seeding is for start-up only).
        """
        with self._lock:
            if self._scanned:
                raise RuntimeError("RunStore.seed() must be called before the first poll")
            # A run lies below its root: its key starts with the root and a separator.
            prefixes = {root: root.rstrip(os.sep) + os.sep for root in resolve_roots(self.roots)[0]}
            now = self.clock()
            taken = 0
            runs = self._runs
            # In the order a poll lists them (root order, then folder name), which is not the
            # database's once it has rewritten a run: the first table and its default columns are
            # those a poll gives.
            items = list(cached.items())
            rank = {root: i for i, root in enumerate(prefixes)}
            if len(prefixes) == 1:  # (one root: the keys' order is the listing's, no tuple per run)
                keys = list(cached)
                in_order = all(map(operator.le, keys, islice(keys, 1, None)))
            else:
                order = [(rank.get(summary.root, len(rank)), key) for key, (summary, _) in items]
                in_order = all(map(operator.le, order, islice(order, 1, None)))
            if not in_order:
                items.sort(key=lambda item: (rank.get(item[1][0].root, len(rank)), item[0]))
            for key, (summary, stamps) in items:
                prefix = prefixes.get(summary.root)
                if prefix is None or key in runs or summary.key != key or not key.startswith(prefix):
                    continue
                loc = RunLocation(summary.root, summary.id, key)
                runs[key] = _seeded(loc, summary, stamps)
                status = summary.status
                # A finished run shows its written status; only the others depend on the clock.
                summary.display_status = (
                    status if status in _FINISHED and not summary.legacy else self._seed_status(summary, now)
                )
                taken += 1
            if taken:
                self.version += 1
                self.membership += 1
                self._members = set(runs)
                self._unfinished = [key for key, state in runs.items() if _unfinished(state)]
            return taken

    def set_perf(self, key: str, perf: dict[str, Scalar]) -> bool:
        """Attach the performance facts of run ``key`` (:attr:`RunSummary.perf`, the ``perf.*``
        columns). The store never reads telemetry itself: the layer above reads it (see
        :mod:`traceml_ai.ui.perf`) and hands the facts in; they stay with the run's summary, also
        when its files change and it is parsed again. Returns True when the facts changed (False for
        an unknown run).
        """
        with self._lock:
            state = self._runs.get(key)
            if state is None or state.summary is None or state.summary.perf == perf:
                return False
            state.summary.perf = perf
            return True

    def stamps(self) -> dict[str, Mapping[str, tuple[int, int]]]:
        """Run key → ``{file: (mtime_ns, size)}`` of the files each summary was parsed from (absent
        files not listed), for the run database; read-only (a run seeded from the database and
        unchanged since has the mapping it was seeded with). These are the stamps of the parsed
        versions, so a file that changed after its parse is never recorded as fresh."""
        with self._lock:
            out: dict[str, Mapping[str, tuple[int, int]]] = {}
            for key, state in self._runs.items():
                if state.summary is None:
                    continue
                if state.seed is not None:
                    out[key] = state.seed[1]  # (read-only: the run database's stamps, decoded as read)
                    continue
                out[key] = _parsed_stamps(state)
            return out

    def forget_parse_state(self) -> int:
        """Keep of each finished run only its summary and the stamps of the files it was read from,
        as a start from the run database holds it (:meth:`seed`): the parsed files leave memory
        (after a first scan of 100,000 runs the viewer held 1.05 GB, against 0.84 GB from the
        database; review 16c). A Refresh then compares every file, as for a seeded run, and reads
        a run again when one changed. A run whose history is loaded (charts) keeps it. Returns how
        many runs were compacted."""
        with self._lock:
            compacted = 0
            for key, state in self._runs.items():
                summary = state.summary
                if summary is None or state.seed is not None or not summary.finished or state.tail is not None:
                    continue
                self._runs[key] = _seeded(state.loc, summary, _parsed_stamps(state), state.run_json)
                compacted += 1
            return compacted

    # -- updating --------------------------------------------------------------------------

    def _update(self, *, recheck_finished: bool, trust_folders: bool = False) -> PollResult:
        # One poll at a time; within it the run table is held a chunk of runs at a time, so a history
        # or details request waits for a chunk, not for a whole scan (seconds for 10,000 runs).
        with self._poll_lock:
            with self._lock:
                self._trust_folders = trust_folders and not self._scanned  # (the first poll only, not Refresh)
                self._unchanged_since_seed = set()
                self._scanned = True  # (seed() is refused from here on)
            try:
                return self._update_listed(recheck_finished=recheck_finished)
            finally:
                self._trust_folders = False

    def _update_listed(self, *, recheck_finished: bool) -> PollResult:
        listing, relisted = self._watch.listing(force=recheck_finished)
        if not recheck_finished:
            if not relisted:
                return self._poll_unfinished()
            if [(loc.path, loc.id) for loc in listing.runs] == self._listed:
                with self._lock:
                    self._set_listing_warnings(listing)
                return self._poll_unfinished()
        changed: list[str] = []
        seen: set[str] = set()
        # A folder holding only the run catalog's files (an envelope beside run folders) is not
        # a run; only folders not seen before are looked at (a few stats each).
        runs = [loc for loc in listing.runs if loc.path in self._runs or not catalog_only_folder(loc.path)]
        for start in range(0, len(runs), _POLL_CHUNK):
            self.progress = (start, len(runs))
            if start:
                time.sleep(0)  # let a thread waiting for the run table take it
            with self._lock:
                for loc in runs[start : start + _POLL_CHUNK]:
                    self._update_one(loc, seen, changed, recheck_finished=recheck_finished)
        self.progress = (len(runs), len(runs))
        with self._lock:
            self._set_listing_warnings(listing)
            removed = [key for key in self._runs if key not in seen]
            for key in removed:
                del self._runs[key]
            if len(seen) != len(self._runs) or (runs and list(self._runs) != [r.path for r in runs]):
                self._runs = {r.path: self._runs[r.path] for r in runs}
            if changed or removed:
                self.version += 1
            self._listed = [(loc.path, loc.id) for loc in listing.runs]
            self._unfinished = [key for key, state in self._runs.items() if _unfinished(state)]
            if removed or (len(changed) and any(key not in self._members for key in changed)):
                self.membership += 1
                self._members = set(self._runs)
            return PollResult(changed, removed, self.version)

    def _poll_unfinished(self) -> PollResult:
        """A poll whose listing did not change: check the unfinished runs only (O(running runs))."""
        changed: list[str] = []
        keys = self._unfinished
        for start in range(0, len(keys), _POLL_CHUNK):
            if start:
                time.sleep(0)  # let a thread waiting for the run table take it
            with self._lock:
                for key in keys[start : start + _POLL_CHUNK]:
                    state = self._runs.get(key)
                    if state is not None and self._check_run(state):
                        changed.append(key)
        with self._lock:
            if changed:
                self.version += 1
                self._unfinished = [k for k in keys if (st := self._runs.get(k)) is not None and _unfinished(st)]
            return PollResult(changed, [], self.version)

    def _update_one(self, loc: RunLocation, seen: set[str], changed: list[str], *, recheck_finished: bool) -> None:
        seen.add(loc.path)
        state = self._runs.get(loc.path)
        # (the same path: a RunLocation differs in its root or id; the field tests cost a third of
        # the dataclass comparison)
        if state is not None and state.seed is not None and (state.loc.id != loc.id or state.loc.root != loc.root):
            state = None  # the listing, never the cache, says where a run is
        if state is None:
            state = _RunState(loc)
            self._runs[loc.path] = state
            self._check_run(state)
            changed.append(loc.path)
            return
        summary = state.summary
        if summary is not None and summary.finished and not recheck_finished:
            return
        if self._check_run(state):
            changed.append(loc.path)

    def _set_listing_warnings(self, listing: Listing) -> None:
        self.warnings = [f"runs folder not found, skipped: {r}" for r in listing.missing_roots]
        self.warnings += [f"ignored {path}: {reason}" for path, reason in listing.ignored]

    def _check_run(self, state: _RunState) -> bool:
        """Stat the run's files, re-parse the changed ones; True when its summary changed."""
        folder = _folder_stamp(state.loc.path)
        if state.seed is not None and state.summary is not None:
            stamps = _plain(state.seed[1])  # (decoded once here, not at each look)
            # The first poll after a start from the run database checks a finished run by its folder
            # alone (one stat, not five): every writer replaces run files by rename, which moves the
            # folder's mtime. Refresh still compares every file.
            if (self._trust_folders and folder is not None and state.summary.finished
                    and stamps.get(RUN_FOLDER_STAMP) == folder):
                # Unchanged, and a finished run's display status is its written one (set by seed):
                # nothing more to do for nearly every run of a warm start (100,000 runs: issue 16).
                self._unchanged_since_seed.add(state.loc.path)
                return False
            if self._seed_holds(state, stamps):
                if folder is not None and stamps.get(RUN_FOLDER_STAMP) != folder:
                    state.seed = (state.summary, {**stamps, RUN_FOLDER_STAMP: folder})
                status = self._seed_status(state.summary)
                if status != state.summary.display_status:
                    state.summary.display_status = status
                    return True
                return False
            state.seed = None  # a file changed: parse the run (the cached summary is the old one)
        state.folder = folder
        touched = False
        for name in _TABLE_FILES:
            touched |= self._update_file(state, name)
        if CONFIG_JSON in state.files:
            touched |= self._update_file(state, CONFIG_JSON)
        touched |= self._update_head(state)
        old = state.summary
        if touched or old is None:
            self._build_summary(state)
        else:
            status = self._display_status(state)
            if status != old.display_status:
                old.display_status = status
                return True
            return False
        return old is None or state.summary != old

    def _update_file(self, state: _RunState, name: str) -> bool:
        fs = state.files.setdefault(name, _FileState())
        path = state.loc.path + os.sep + name
        st, reason = stat_confined(path, state.loc.root)
        if st is None:
            was = fs.present or fs.error is not None
            fs.present, fs.stamp, fs.value, fs.warnings = False, None, None, _NO_WARNINGS
            fs.error = f"{name}: ignored ({reason})" if reason else None
            return was or reason is not None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == fs.stamp:
            return False
        fs.present = True
        try:
            check_size(name, st.st_size)
            data = read_stated(path, st)
            value, warnings = _PARSERS[name](data, name)
        except RunFileError as err:
            kept = "; showing the last good version" if fs.value is not None else ""
            fs.error = f"{err}{kept}"
        except OSError as err:
            fs.error = f"{name}: cannot read ({err.strerror or err})"
            return True  # stamp not stored: try again next time
        except Exception as err:
            kept = "; showing the last good version" if fs.value is not None else ""
            fs.error = f"{name}: could not be parsed ({type(err).__name__}: {str(err)[:200]}){kept}"
        else:
            fs.value, fs.warnings, fs.error = value, tuple(warnings) if warnings else _NO_WARNINGS, None
        fs.stamp = stamp
        return True

    def _update_head(self, state: _RunState) -> bool:
        """Read the first 64 KB of metrics.jsonl for start values (and, without metrics.json,
        the metric names and last values). Once the file is past 64 KB it is never read again."""
        head = state.head
        if head.final:
            return False
        path = state.loc.path + os.sep + METRICS_JSONL
        st, reason = stat_confined(path, state.loc.root)
        if st is None:
            had = head.stamp is not None or head.problem is not None
            state.head = _Head(problem=f"{METRICS_JSONL}: ignored ({reason})" if reason else None)
            return had or reason is not None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == head.stamp:
            return False
        tail = MetricsTail(path, METRICS_HEAD_BYTES)  # stat_confined vouched for a symlink
        tail.advance()
        new = _Head(
            stamp=stamp, complete=st.st_size <= METRICS_HEAD_BYTES, final=st.st_size > METRICS_HEAD_BYTES
        )
        new.names = tail.metric_names()
        new.start = _first_values(tail.rows, new.names, finite=True)
        if new.complete and not state.files[METRICS_JSON].present:
            new.last = _first_values(reversed(tail.rows), new.names, finite=False)  # legacy: no metrics.json
        new.warnings = tuple(w for w in tail.warnings if "only the first" not in w)
        state.head = new
        return True

    def _display_status(self, state: _RunState) -> str:
        rj: RunJson | None = state.files[RUN_JSON].value
        return display_status(
            rj.status if rj else None,
            legacy=not state.files[RUN_JSON].present and state.files[RUN_JSON].error is None,
            heartbeat_s=rj.heartbeat_s if rj else None,
            now=self.clock(),
            stale_after_seconds=self.stale_after_seconds,
        )

    def _seed_holds(self, state: _RunState, stamps: Mapping[str, tuple[int, int]]) -> bool:
        """True when the seeded run's files still have ``stamps``, those its cached summary came from."""
        names = (*_TABLE_FILES, METRICS_JSONL, *((CONFIG_JSON,) if CONFIG_JSON in stamps else ()))
        for name in names:
            st, reason = stat_confined(state.loc.path + os.sep + name, state.loc.root)
            old = stamps.get(name)
            if reason is not None or (st is None) != (old is None):
                return False
            if st is None or old is None:
                continue
            new = (st.st_mtime_ns, st.st_size)
            if new != old and not (name == METRICS_JSONL and min(old[1], new[1]) > METRICS_HEAD_BYTES):
                return False  # (a head past 64 KB is final: _update_head never reads it again)
        return True

    def _seed_status(self, summary: RunSummary, now: float | None = None) -> str:
        """The display status of a cached summary at ``now`` (default: the store's clock)."""
        # Only a running run's status depends on its heartbeat: the others skip parsing it (this runs
        # for every cached run at start-up).
        running = summary.status == "running" and not summary.legacy
        return display_status(
            summary.status,
            legacy=summary.legacy,
            heartbeat_s=parse_iso(summary.heartbeat_at) if running else None,
            now=self.clock() if now is None else now,
            stale_after_seconds=self.stale_after_seconds,
        )

    def _warnings(self, state: _RunState, rj: RunJson | None) -> list[str]:
        """Every warning of a run: each file's own and its parse error, the metrics.jsonl head's
        problem and the tail's (or head's) warnings, no run file at all, a heartbeat in the future."""
        files = state.files
        warnings: list[str] = []
        for fname in (RUN_JSON, PARAMS_YAML, METRICS_JSON, CONFIG_JSON):
            fs = files.get(fname)
            if fs is not None:
                warnings += fs.warnings
                if fs.error:
                    warnings.append(fs.error)
        if state.head.problem:
            warnings.append(state.head.problem)
        warnings += state.tail.warnings if state.tail is not None else state.head.warnings
        if state.head.stamp is None and not any(fs.present or fs.error for fs in files.values()):
            warnings.append("no run files here (run.json, params.yaml, metrics.json, metrics.jsonl)")
        if rj is not None and rj.heartbeat_s is not None and rj.heartbeat_s > self.clock() + _CLOCK_SKEW_S:
            warnings.append("run.json: heartbeat_at is in the future (clocks of two machines disagree?)")
        return warnings

    def _build_summary(self, state: _RunState) -> None:
        if state.seed is not None:
            # A seeded run has no parsed files yet: parse them before building from them.
            state.seed = None
            for name in _TABLE_FILES:
                self._update_file(state, name)
            self._update_head(state)
        loc = state.loc
        files = state.files
        rj: RunJson | None = files[RUN_JSON].value
        mj: MetricsJson | None = files[METRICS_JSON].value
        params: dict[str, Any] = files[PARAMS_YAML].value or {}
        legacy = not files[RUN_JSON].present and files[RUN_JSON].error is None
        name, started = _name_and_start(loc.id, rj, legacy)
        warnings = self._warnings(state, rj)
        head = state.head
        perf = state.summary.perf if state.summary is not None else {}  # set by set_perf, kept
        # The summary shares the parsed dicts instead of copying them (they are never mutated):
        # with 10,000 runs in a viewer every copy costs megabytes.
        last = mj.last if mj else (head.last if head.complete else {})
        names = sorted(set(head.names) | set(last) | (set(mj.best) if mj else set()))
        state.summary = RunSummary(
            key=loc.path,
            id=loc.id,
            root=loc.root,
            name=name,
            group=rj.group if rj else None,
            tags=rj.tags if rj else [],
            notes=rj.notes if rj else "",
            status=rj.status if rj else None,
            display_status=self._display_status(state),
            legacy=legacy,
            schema_version=rj.schema_version if rj else None,
            started_at=started,
            ended_at=rj.ended_at if rj else None,
            heartbeat_at=rj.heartbeat_at if rj else None,
            duration_s=rj.duration_s if rj else None,
            step=mj.step if mj else None,
            epoch=mj.epoch if mj else None,
            exit=rj.exit if rj else None,
            params=params,
            start=head.start,
            last=last,
            best=mj.best if mj else {},
            summary=mj.summary if mj else {},
            metric_names=names,
            warnings=warnings,
            perf=perf,
        )


def _name_and_start(run_id: str, rj: RunJson | None, legacy: bool) -> tuple[str, str | None]:
    """The run's name (run.json's, else the one in its folder name, else the folder name) and start
    (run.json's; a legacy folder without run.json starts at its folder name's UTC stamp)."""
    m = RUN_ID_RE.match(run_id)
    name = (rj.name if rj else None) or (m.group("name") if m else run_id)
    started = rj.started_at if rj else None
    if started is None and legacy and m:
        stamp = m.group("stamp")
        started = f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}Z"
    return name, started


def _folder_stamp(path: str) -> tuple[int, int] | None:
    """``(mtime_ns, inode)`` of run folder ``path``, or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino


def _seeded(loc: RunLocation, summary: RunSummary, stamps: Mapping[str, tuple[int, int]],
            run_json: tuple[tuple[int, int], dict[str, Any]] | None = None) -> _RunState:
    """The state of a run held as its summary and the stamps of the files it came from (a run
    from the run database, or one whose parse state was forgotten); built without the default
    factories (100,000 of them at a warm start)."""
    return _RunState(loc, files={}, head=_NO_HEAD, summary=summary, seed=(summary, stamps), run_json=run_json)


def _parsed_stamps(state: _RunState) -> dict[str, tuple[int, int]]:
    """The stamps of the files a parsed (not seeded) run's summary came from, and its folder's."""
    files = {name: fs.stamp for name, fs in state.files.items() if fs.stamp is not None}
    if state.head.stamp is not None:
        files[METRICS_JSONL] = state.head.stamp
    if state.folder is not None:
        files[RUN_FOLDER_STAMP] = state.folder
    return files


def _plain(stamps: Mapping[str, tuple[int, int]]) -> Mapping[str, tuple[int, int]]:
    """``stamps`` decoded once, when they are the run database's text
    (:class:`traceml_ai.runs.rundb.StoredStamps`, which decodes at each look)."""
    decoded = getattr(stamps, "decoded", None)
    return decoded() if decoded is not None else stamps


def _unfinished(state: _RunState) -> bool:
    """Whether a poll checks this run: it has no summary yet or its run.json is not finished."""
    return state.summary is None or not state.summary.finished


def _first_values(rows: Iterable[dict[str, Any]], names: list[str], *, finite: bool) -> dict[str, MetricValue]:
    """The first number (or null, unless ``finite``) of each metric in ``rows``; stops early once
    every metric has one, so a head of many rows costs a few rows."""
    found: dict[str, MetricValue] = {}
    pending = set(names)
    for row in rows:
        for key in pending.intersection(row):
            v = row[key]
            if v is None:
                if not finite:
                    found[key] = None
            elif type(v) in (int, float):
                # A bare NaN/Infinity token is a gap: never a start value, a null last value.
                found_value = float(v) if math.isfinite(v) else None
                if found_value is not None or not finite:
                    found[key] = found_value
        if len(found) != len(names):
            pending.difference_update(found)
        else:
            break
    return found


def heartbeat_age(summary: RunSummary, now: float) -> float | None:
    """Seconds since the run's heartbeat, or None without one."""
    t = parse_iso(summary.heartbeat_at)
    return None if t is None else max(0.0, now - t)


__all__ = ["PollResult", "RunDetails", "RunStore", "heartbeat_age"]


def _newest_first_key(run: RunSummary) -> tuple[float, str]:
    """Sort key of the newest run: its ``started_at`` as Unix seconds (unknown: oldest), then its id
    (which starts with the start time)."""
    started = -math.inf
    if run.started_at:
        try:
            when = datetime.fromisoformat(run.started_at.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            started = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
    return started, run.id
