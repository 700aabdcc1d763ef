"""Finding catalog files under the paths given (004 seed, "Discovery Rules"; DESIGN §5).

Each path is a file or a folder (a root). Folders are walked recursively, in name order:

- ``stormlog_run.json``: a run envelope; ``stormlog_attachments.json``: an attachment sidecar;
- a folder with ``aggregator/manifest.json``: a TraceML session (the run folder); its
  ``aggregator/`` folder is read by name, not walked, and its ``metrics.jsonl`` is not telemetry;
- a folder with a ``manifest.json`` holding a ``sessions`` ledger: a Stormlog sink folder, not
  walked further (its segments belong to the ledger's sessions);
- a folder with a ``bundle.json`` of a diagnose or OOM bundle: not walked further;
- any other ``*.jsonl`` whose first line carries a ``session_id``: a telemetry JSONL file.

Dot-entries are skipped. Every entry is resolved with realpath: a symlink whose target leaves every
root is reported and not read; a folder reached twice (a symlink loop) is walked once. A path that
does not exist is a warning. Nothing is ever written here (the cache lives elsewhere).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from traceml_ai.catalog.cache import FactCache, Signature, file_signature
from traceml_ai.catalog.model import CatalogWarning
from traceml_ai.catalog.schema import ENVELOPE_FILE, SIDECAR_FILE
from traceml_ai.catalog.sources import (
    BUNDLE_FILE,
    SINK_MANIFEST_FILE,
    Fact,
    read_bundle,
    read_envelope,
    read_sidecar,
    read_sink_manifest,
    read_telemetry_jsonl,
    read_traceml_session,
)
from traceml_ai.runs.discovery import inside
from traceml_ai.runs.layout import METRICS_JSONL, RUN_JSON


@dataclass
class Found:
    """What discovery read: facts by real path, in walk order, and the warnings of the walk itself.

    Attributes:
        envelopes, sidecars: ``(path, fact)`` of each ``stormlog_run.json`` / ``stormlog_attachments.json``.
        sessions: ``(path, fact)`` of each file that gave session identities.
        session_dirs: real path of each TraceML run folder → its manifest path.
        roots: the real paths of the roots that exist.
        unread: the paths given (as given) that could not be read at all: permission denied on
            the way to them, on listing the folder, or on reading the file.
        warnings: missing paths, unreadable folders, symlinks leaving the roots.
    """

    envelopes: list[tuple[str, Fact]] = field(default_factory=list)
    sidecars: list[tuple[str, Fact]] = field(default_factory=list)
    sessions: list[tuple[str, Fact]] = field(default_factory=list)
    session_dirs: dict[str, str] = field(default_factory=dict)
    roots: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    warnings: list[CatalogWarning] = field(default_factory=list)


class _Walker:
    def __init__(self, cache: FactCache, found: Found) -> None:
        self.cache = cache
        self.found = found
        self.seen_dirs: set[str] = set()
        self.seen_files: set[str] = set()

    def warn(self, path: str, message: str, code: str) -> None:
        self.found.warnings.append(CatalogWarning(path=path, field=None, message=message, code=code))

    def _fact(self, path: str, read: Any, extra: Signature = ()) -> Fact | None:
        try:
            st = os.stat(path)
        except OSError as exc:
            self.warn(path, f"cannot be read: {exc.strerror or exc}", "unreadable")
            return None
        fact: Fact = self.cache.get(path, file_signature(st) + extra, read)
        return fact

    def file(self, path: str, name: str, in_run_folder: bool = False) -> None:
        if path in self.seen_files:
            return
        self.seen_files.add(path)
        if name == ENVELOPE_FILE:
            fact = self._fact(path, read_envelope)
            if fact is not None:
                self.found.envelopes.append((path, fact))
        elif name == SIDECAR_FILE:
            fact = self._fact(path, read_sidecar)
            if fact is not None:
                self.found.sidecars.append((path, fact))
        elif name.endswith(".jsonl") and not (in_run_folder and name == METRICS_JSONL):
            fact = self._fact(path, read_telemetry_jsonl)
            if fact is not None and fact["type"] == "sessions":
                self.found.sessions.append((path, fact))

    def folder(self, path: str) -> bool:
        """Walk folder ``path``; False when it cannot be listed (reported)."""
        if path in self.seen_dirs:
            return True
        self.seen_dirs.add(path)
        try:
            entries = self.cache.listing(path, os.stat(path))
        except OSError as exc:
            self.warn(path, f"folder cannot be read: {exc.strerror or exc}; skipped", "unreadable")
            return False
        names = dict(entries)
        skip: set[str] = set()
        walk_on = True
        if names.get("aggregator") == "d":
            self._traceml_session(path, skip)
        if names.get(SINK_MANIFEST_FILE) == "f" and os.path.basename(path) != "aggregator":
            fact = self._fact(os.path.join(path, SINK_MANIFEST_FILE), read_sink_manifest)
            if fact is not None and fact["type"] == "sessions":
                self.found.sessions.append((os.path.join(path, SINK_MANIFEST_FILE), fact))
                walk_on = False
        if names.get(BUNDLE_FILE) == "f":
            fact = self._fact(os.path.join(path, BUNDLE_FILE), read_bundle)
            if fact is not None and fact["type"] == "sessions":
                self.found.sessions.append((os.path.join(path, BUNDLE_FILE), fact))
                walk_on = False
        in_run_folder = RUN_JSON in names
        prefix = path.rstrip(os.sep) + os.sep  # plain concatenation: os.path.join costs a third of a warm walk
        for name, kind in entries:
            if name in skip:
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
                if walk_on:
                    self.folder(child)
            elif name in (ENVELOPE_FILE, SIDECAR_FILE) or walk_on:
                self.file(child, name, in_run_folder)
        return True

    def _traceml_session(self, run_dir: str, skip: set[str]) -> None:
        """``<run_dir>/aggregator/manifest.json`` when present: a TraceML session. Its aggregator/
        folder is read by name, never walked (the exporter's JSONL files are not Stormlog telemetry)."""
        agg = os.path.join(run_dir, "aggregator")
        manifest = os.path.join(agg, "manifest.json")
        try:
            agg_st = os.stat(agg)
            present = {name for name, _ in self.cache.listing(agg, agg_st)}
            if "manifest.json" not in present:
                return  # aggregator/ without a manifest is not a session (yet): nothing to report
            st = os.stat(manifest)
        except OSError:
            return
        fact: Fact = self.cache.get(manifest, (*file_signature(st), agg_st.st_mtime_ns),
                                    lambda _p: read_traceml_session(run_dir, present))
        if fact["type"] == "sessions":
            self.found.sessions.append((manifest, fact))
            self.found.session_dirs[run_dir] = manifest
            skip.add("aggregator")

def discover(paths: Sequence[str | os.PathLike[str]], cache: FactCache | None = None) -> Found:
    """Walk ``paths`` (files or folders) and read every catalog file found.

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
            # EACCES here: a folder on the way cannot be searched; the path may well exist
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
            if not walker.folder(real):
                found.unread.append(as_given)
        else:
            if not os.access(real, os.R_OK):
                found.unread.append(as_given)
            name = os.path.basename(real)
            parent = os.path.dirname(real)
            if name == SINK_MANIFEST_FILE and os.path.basename(parent) == "aggregator":
                walker.folder(os.path.dirname(parent))
            elif name in (SINK_MANIFEST_FILE, BUNDLE_FILE):
                walker.folder(parent)
            else:
                walker.file(real, name)
    return found
