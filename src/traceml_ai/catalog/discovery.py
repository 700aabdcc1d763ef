"""Finding catalog files under the paths given (004 seed, "Discovery Rules"; DESIGN §5).

Each path is a file or a folder (a root). A folder is searched as real Stormlog 0.4.3 searches it
(the differential tests compare), in this order:

1. its own ``stormlog_run.json``, ``stormlog_attachments.json`` and ``manifest.json``: a root that
   is an OOM bundle is read as that bundle and nothing else;
2. every ``manifest.json`` below it, in path order: an OOM bundle (``bundle_name`` ...), else a
   diagnose bundle (``command_line`` ...), else a sink ledger (``stormlog.append_only_telemetry_sink``);
3. every ``stormlog_attachments.json``, then every ``stormlog_run.json`` below it;
4. telemetry files: every ``*.jsonl`` and each ``*.json`` / ``*.csv`` whose name holds ``event``,
   ``track`` or ``telemetry``, except a sink's segments, the files of an OOM bundle, and the JSON
   files a diagnose bundle lists beside its own sink.

TraceML's own run folders are read too: a folder with ``aggregator/manifest.json`` (format
``traceml.session_manifest``) is a TraceML session; its ``aggregator/`` folder is read by name, not
searched (the exporter's JSONL files are not Stormlog telemetry), nor are the metric histories
(``metrics.jsonl``, each rank's ``metrics.rank<N>.jsonl``) beside a ``run.json``. Dot-entries are
skipped. Every entry is resolved with realpath: a symlink whose target leaves every root is
reported and not read; a folder reached twice is searched once. A path that does not exist is a
warning. Nothing is ever written here (the cache lives elsewhere).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceml_ai.catalog.cache import FactCache, Signature, file_signature
from traceml_ai.catalog.model import CatalogWarning
from traceml_ai.catalog.schema import ENVELOPE_FILE, SIDECAR_FILE
from traceml_ai.catalog.sources import (
    MANIFEST_FILE,
    ROLLUP_FILE,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    TELEMETRY_NAME_PARTS,
    Fact,
    read_envelope,
    read_manifest,
    read_sidecar,
    read_telemetry,
    read_traceml_session,
)
from traceml_ai.runs.discovery import inside
from traceml_ai.runs.layout import RUN_JSON, is_metrics_history

_TELEMETRY_NAME = re.compile("|".join(map(re.escape, TELEMETRY_NAME_PARTS)))
"""A name holding one of :data:`TELEMETRY_NAME_PARTS` (searched in its lower-cased form)."""


@dataclass
class Source:
    """One source of sessions, as Stormlog's catalog has them.

    Attributes:
        kind: ``sink``, ``diagnose_bundle``, ``telemetry_json``, ``telemetry_jsonl``, ``telemetry_csv``.
        path: the sink or bundle folder, or the telemetry file.
        manifest: the ``manifest.json`` of a sink or bundle, else None.
        fact: what was read (a manifest fact, or a telemetry fact).
        names: a sink's entries (to find its segments and ``rollups.json``).
        segment_facts: for a sink whose ledger has no sessions, the facts of its segment files.
        ledger: for a JSONL telemetry file beside a sink ``manifest.json`` (a segment given alone),
            that manifest's sink fact, whose ledger gives the sessions' lifecycle (as Stormlog's loader).
    """

    kind: str
    path: str
    manifest: str | None
    fact: Fact
    names: frozenset[str] = frozenset()
    segment_facts: list[tuple[str, Fact]] = field(default_factory=list)
    ledger: dict[str, Any] | None = None


@dataclass
class Found:
    """What discovery read, in Stormlog's discovery order, and the warnings of the search itself.

    Attributes:
        envelopes, sidecars: ``(path, fact)`` of each ``stormlog_run.json`` / ``stormlog_attachments.json``.
        sources: the session sources (sinks, diagnose bundles, telemetry files).
        oom_bundles: ``(bundle folder, manifest path, fact["oom"])`` of each OOM bundle.
        traceml: ``(manifest path, fact)`` of each TraceML run folder's ``aggregator/manifest.json``.
        manifest_problems: ``(path, fact)`` of manifests with problems (skipped ledger entries, ...).
        session_dirs: real path of each TraceML run folder → its manifest path.
        bundle_files: the files each diagnose bundle's manifest lists (``telemetry_timeline.json``, ...).
        roots: the real paths of the roots that exist.
        unread: the paths given (as given) that could not be read at all.
        warnings: missing paths, unreadable folders, symlinks leaving the roots.
    """

    envelopes: list[tuple[str, Fact]] = field(default_factory=list)
    sidecars: list[tuple[str, Fact]] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    oom_bundles: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    traceml: list[tuple[str, Fact]] = field(default_factory=list)
    manifest_problems: list[tuple[str, Fact]] = field(default_factory=list)
    session_dirs: dict[str, str] = field(default_factory=dict)
    bundle_files: set[str] = field(default_factory=set)
    roots: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    warnings: list[CatalogWarning] = field(default_factory=list)


_TELEMETRY_KINDS = {".jsonl": "telemetry_jsonl", ".json": "telemetry_json", ".csv": "telemetry_csv"}


@dataclass
class _Tree:
    """What one search of a root collected, before it is read in Stormlog's order."""

    manifests: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    sidecars: list[str] = field(default_factory=list)
    envelopes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


class _Walker:
    def __init__(self, cache: FactCache, found: Found) -> None:
        self.cache = cache
        self.found = found
        self.seen_dirs: set[str] = set()
        self.seen_envelopes: set[str] = set()
        self.seen_sidecars: set[str] = set()
        self.source_keys: set[tuple[str, str]] = set()
        self.oom_paths: set[str] = set()
        self.covered: set[str] = set()

    def warn(self, path: str, message: str, code: str) -> None:
        self.found.warnings.append(CatalogWarning(path=path, field=None, message=message, code=code))

    def _fact(self, path: str, read: Callable[[str], Fact], extra: Signature = ()) -> Fact | None:
        try:
            st = os.stat(path)
        except OSError as exc:
            self.warn(path, f"cannot be read: {exc.strerror or exc}", "unreadable")
            return None
        fact: Fact = self.cache.get(path, file_signature(st) + extra, read)
        return fact

    # -- the files ------------------------------------------------------------------------------

    def envelope(self, path: str) -> None:
        if path in self.seen_envelopes:
            return
        self.seen_envelopes.add(path)
        fact = self._fact(path, read_envelope)
        if fact is not None:
            self.found.envelopes.append((path, fact))

    def sidecar(self, path: str) -> None:
        if path in self.seen_sidecars:
            return
        self.seen_sidecars.add(path)
        fact = self._fact(path, read_sidecar)
        if fact is not None:
            self.found.sidecars.append((path, fact))

    def manifest(self, path: str, names: frozenset[str] | None, *, root: bool = False, warn: bool = False) -> bool:
        """Read one ``manifest.json``; True when it is an OOM bundle at a root (searched no further)."""
        folder = os.path.dirname(path)
        if names is None:
            try:
                names = frozenset(n for n, _ in self.cache.listing(folder, os.stat(folder)))
            except OSError:
                names = frozenset()
        fact = self._fact(path, read_manifest)
        if fact is None:
            return False
        if fact["error"] is not None:
            self.warn(path, f"{fact['error']}; not read as a sink, diagnose or OOM manifest", "unreadable")
            return False
        if fact["problems"]:
            self.found.manifest_problems.append((path, fact))
        if fact["oom"] is not None:
            real = os.path.realpath(folder)
            if real not in self.oom_paths:
                self.oom_paths.add(real)
                self.found.oom_bundles.append((folder, path, fact["oom"]))
            return root
        if fact["diagnose"] is not None:
            self.found.bundle_files.update(os.path.normpath(os.path.join(folder, n)) for n in fact["diagnose"]["files"])
            self._cover_beside_sink(folder, fact["diagnose"]["files"])
            self._source(Source("diagnose_bundle", folder, path, fact))
            if not root:
                return False
        if fact["sink"] is not None:
            segments = {n for n in names if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)}
            segments |= {s["filename"] for s in fact["sink"]["segments"] if s["filename"] in names}
            prefix = folder.rstrip(os.sep) + os.sep
            self.covered.update(prefix + n for n in segments)
            source = Source("sink", folder, path, fact, names)
            if not fact["sink"]["sessions"]:
                for n in sorted(segments):
                    seg = self._fact(prefix + n, lambda p: read_telemetry(p, "telemetry_jsonl"))
                    if seg is not None:
                        source.segment_facts.append((prefix + n, seg))
            self._source(source)
        elif fact["diagnose"] is None and (warn or fact.get("unrecognized")):
            why = f": it {fact['unrecognized']}" if fact.get("unrecognized") else ""
            self.warn(path, f"unrecognized manifest shape (not a sink, diagnose or OOM manifest){why}; not read",
                      "unreadable")
        return False

    def _cover_beside_sink(self, folder: str, files: list[str]) -> None:
        """A bundle that lists its own sink keeps its events there: the other JSON files it lists
        repeat them, so they are not read as telemetry (as Stormlog does)."""
        listed = [os.path.normpath(os.path.join(folder, n)) for n in files]
        if any(os.path.basename(p) == MANIFEST_FILE and os.path.dirname(p) != folder for p in listed):
            self.covered.update(p for p in listed if p.lower().endswith(".json")
                                and os.path.basename(p) != MANIFEST_FILE)

    def _source(self, source: Source) -> None:
        key = (source.path, source.kind)  # real already: roots are real, symlinks are resolved on the way
        if key not in self.source_keys:
            self.source_keys.add(key)
            self.found.sources.append(source)

    def telemetry(self, path: str) -> None:
        kind = _TELEMETRY_KINDS.get(os.path.splitext(path)[1].lower())
        if kind is None:
            return
        fact = self._fact(path, lambda p: read_telemetry(p, kind))
        if fact is None:
            return
        ledger = None
        beside = os.path.join(os.path.dirname(path), MANIFEST_FILE)
        if kind == "telemetry_jsonl" and os.path.isfile(beside):
            manifest = self._fact(beside, read_manifest)
            ledger = manifest["sink"] if manifest is not None else None
        self._source(Source(kind, path, None, fact, ledger=ledger))

    def file(self, path: str) -> None:
        """A file given as a path (as Stormlog's ``_discover_file``)."""
        name = os.path.basename(path)
        parent = os.path.dirname(path)
        if name == ENVELOPE_FILE:
            self.envelope(path)
        elif name == SIDECAR_FILE:
            self.sidecar(path)
        elif name == MANIFEST_FILE and os.path.basename(parent) == "aggregator":
            self._traceml_session(os.path.dirname(parent), None)
        elif name == MANIFEST_FILE:
            self.manifest(path, None, warn=True)
        else:
            self.telemetry(path)

    # -- the folders ----------------------------------------------------------------------------

    def root(self, path: str) -> bool:
        """Search root folder ``path``; False when it cannot be listed (reported)."""
        try:
            names = frozenset(n for n, _ in self.cache.listing(path, os.stat(path)))
        except OSError as exc:
            self.warn(path, f"folder cannot be read: {exc.strerror or exc}; skipped", "unreadable")
            return False
        prefix = path.rstrip(os.sep) + os.sep
        if ENVELOPE_FILE in names:
            self.envelope(prefix + ENVELOPE_FILE)
        if SIDECAR_FILE in names:
            self.sidecar(prefix + SIDECAR_FILE)
        if MANIFEST_FILE in names and self.manifest(prefix + MANIFEST_FILE, names, root=True):
            return True
        tree = _Tree()
        self._collect(path, tree, top=True)
        for manifest, folder_names in tree.manifests:
            self.manifest(manifest, folder_names)
        for sidecar in tree.sidecars:
            self.sidecar(sidecar)
        for envelope in tree.envelopes:
            self.envelope(envelope)
        for f in tree.files:
            if f in self.covered or self._in_oom_bundle(f):
                continue
            self.telemetry(f)
        return True

    def _in_oom_bundle(self, path: str) -> bool:
        here = os.path.dirname(path)
        while True:
            if here in self.oom_paths:
                return True
            parent = os.path.dirname(here)
            if parent == here:
                return False
            here = parent

    def _collect(self, path: str, tree: _Tree, top: bool = False) -> None:
        if path in self.seen_dirs:
            return
        self.seen_dirs.add(path)
        try:
            entries = self.cache.listing(path, os.stat(path))
        except OSError as exc:
            self.warn(path, f"folder cannot be read: {exc.strerror or exc}; skipped", "unreadable")
            return
        kinds = dict(entries)  # name → kind, built in C (a walk of 100,000 run folders lists 400,000 folders)
        names = kinds.keys()
        skip = ""
        if "aggregator" in kinds and self._traceml_session(path, None):
            skip = "aggregator"
        in_run_folder = RUN_JSON in kinds
        prefix = path.rstrip(os.sep) + os.sep  # plain concatenation: os.path.join costs a third of a walk
        for name, kind in entries:
            if name == skip:
                continue
            child = prefix + name
            if kind == "l":
                real = os.path.realpath(child)
                if not any(inside(real, root) for root in self.found.roots):
                    self.warn(child, f"symlink points outside the roots (to {real}); not read", "outside_root")
                    continue
                child = real
                kind = "d" if os.path.isdir(real) else "f"
            if kind == "d":
                self._collect(child, tree)
                continue
            if name == MANIFEST_FILE:
                if not top:
                    tree.manifests.append((child, frozenset(names)))
            elif name == SIDECAR_FILE:
                if not top:
                    tree.sidecars.append(child)
            elif name == ENVELOPE_FILE:
                if not top:
                    tree.envelopes.append(child)
            elif name.endswith(SEGMENT_SUFFIX):
                if not (in_run_folder and is_metrics_history(name)):
                    tree.files.append(child)
            elif name.endswith((".json", ".csv")) and name != ROLLUP_FILE:
                if _TELEMETRY_NAME.search(name.lower()):
                    tree.files.append(child)

    def _traceml_session(self, run_dir: str, _names: frozenset[str] | None) -> bool:
        """``<run_dir>/aggregator/manifest.json`` when present: a TraceML session. Its aggregator/
        folder is read by name, never searched."""
        agg = os.path.join(run_dir, "aggregator")
        manifest = os.path.join(agg, MANIFEST_FILE)
        try:
            agg_st = os.stat(agg)
            present = {name for name, _ in self.cache.listing(agg, agg_st)}
            if MANIFEST_FILE not in present:
                return False  # aggregator/ without a manifest is not a session (yet): nothing to report
            st = os.stat(manifest)
        except OSError:
            return False
        fact: Fact = self.cache.get(manifest, (*file_signature(st), agg_st.st_mtime_ns),
                                    lambda _p: read_traceml_session(run_dir, present))
        if fact["type"] != "sessions":
            return False
        if run_dir not in self.found.session_dirs:
            self.found.traceml.append((manifest, fact))
            self.found.session_dirs[run_dir] = manifest
        return True


def discover(paths: Sequence[str | os.PathLike[str]], cache: FactCache | None = None) -> Found:
    """Search ``paths`` (files or folders) and read every catalog file found.

    Never raises for bad input: a missing path (``missing_path``), a path or folder that cannot be
    read (``unreadable``, naming the cause, e.g. permission denied; also in :attr:`Found.unread`
    when it was given) or a symlink leaving the roots becomes a warning in :attr:`Found.warnings`;
    bad files become facts with problems.
    """
    found = Found()
    walker = _Walker(cache if cache is not None else FactCache(None), found)
    given: list[tuple[str, str]] = []
    for p in paths:
        text = os.path.expanduser(os.fspath(p))
        try:
            os.stat(text)
        except (FileNotFoundError, NotADirectoryError):
            walker.warn(os.fspath(p), "no such file or folder; skipped", "missing_path")
            continue
        except OSError as exc:
            why = "permission denied on a folder on the way to it" if isinstance(exc, PermissionError) else (
                exc.strerror or str(exc))
            walker.warn(os.fspath(p), f"cannot be reached: {why}; skipped", "unreadable")
            found.unread.append(os.fspath(p))
            continue
        real = os.path.realpath(text)
        given.append((os.fspath(p), real))
        root = real if os.path.isdir(real) else os.path.dirname(real)
        if root not in found.roots:
            found.roots.append(root)
    for as_given, real in given:
        if os.path.isdir(real):
            if not walker.root(real):
                found.unread.append(as_given)
        else:
            if not os.access(real, os.R_OK):
                found.unread.append(as_given)
            walker.file(real)
    return found
