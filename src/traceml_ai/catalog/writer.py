"""Writing run envelopes and attachments (004 seed; DESIGN §2.2): validated first, then written
atomically (a temp file in the same folder, then a rename), so a reader sees the old file or the new
one, never half of one. One writer per file (DESIGN §2.1): two processes adding to the same file at
once may lose one addition.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from traceml_ai.catalog.schema import (
    ENVELOPE_FILE,
    ENVELOPE_FORMAT,
    SIDECAR_FILE,
    SIDECAR_FORMAT,
    Problem,
    attachment_problems,
    envelope_problems,
    sidecar_problems,
)
from traceml_ai.runs.writer import atomic_write, dump_json, iso_utc


class EnvelopeError(ValueError):
    """The envelope, sidecar or attachment would not be valid; nothing was written.

    Attributes:
        path: the file that was to be written.
        problems: every :class:`~traceml_ai.catalog.schema.Problem` (field and message).
    """

    def __init__(self, path: str | os.PathLike[str], problems: Sequence[Problem]) -> None:
        self.path = os.fspath(path)
        self.problems = list(problems)
        shown = "; ".join(f"{p.field or '(document)'}: {p.message}" for p in self.problems)
        super().__init__(f"{self.path}: not written: {shown}")


def _target(folder_or_file: str | os.PathLike[str], name: str) -> Path:
    p = Path(folder_or_file)
    return p / name if p.is_dir() or p.suffix != ".json" else p


def _read(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def write_envelope(
    folder: str | os.PathLike[str],
    run_id: str,
    *,
    title: str | None = None,
    description: str | None = None,
    job_id: str | None = None,
    started_at_ns: int | None = None,
    ended_at_ns: int | None = None,
    source_namespace: str | None = None,
    source_ref: str | None = None,
    tags: Sequence[str] | None = None,
    sessions: Sequence[Mapping[str, Any]] | None = None,
    attachments: Sequence[Mapping[str, Any]] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<folder>/stormlog_run.json`` (v1) and return its path. ``folder`` may also be the
    file's path. Replaces an existing envelope there, keeping its ``created_at_utc``.

    Args:
        folder: where the envelope goes; relative attachment paths are read against it.
        run_id: the run's stable identifier (unique among envelopes discovered together).
        started_at_ns, ended_at_ns: Unix epoch ns (end not before start).
        sessions: objects with ``session_id`` and optionally ``job_id``, ``rank``, ``local_rank``,
            ``world_size`` (≥ 1), ``role``, ``status``, ``metadata``.
        attachments: objects with ``attachment_id``, ``kind``, ``storage`` (``reference``|``copy``) and
            ``path`` or ``url``, optionally ``title``, ``session_id``, ``job_id``, ``rank``, ``metadata``.
        metadata: integration-specific details ({} when none).

    Raises:
        EnvelopeError: the envelope would not be valid (every problem named); nothing is written.
        OSError: the file cannot be written.
    """
    path = _target(folder, ENVELOPE_FILE)
    now = iso_utc(time.time())
    old = _read(path) if path.exists() else None
    created = old.get("created_at_utc") if isinstance(old, dict) and old.get("created_at_utc") else now
    doc: dict[str, Any] = {"schema_version": 1, "format": ENVELOPE_FORMAT, "run_id": run_id}
    optional = {"title": title, "description": description, "job_id": job_id, "started_at_ns": started_at_ns,
                "ended_at_ns": ended_at_ns, "source_namespace": source_namespace, "source_ref": source_ref}
    doc.update({k: v for k, v in optional.items() if v is not None})
    doc.update(created_at_utc=created, updated_at_utc=now)
    if tags is not None:
        doc["tags"] = list(tags)
    doc["sessions"] = [dict(s) for s in sessions or []]
    doc["attachments"] = [dict(a) for a in attachments or []]
    doc["metadata"] = dict(metadata or {})
    problems = envelope_problems(_plain(doc))
    if problems:
        raise EnvelopeError(path, problems)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dump_json(doc))
    return path


def _plain(doc: Any) -> Any:
    # what a reader will see: the JSON round trip (tuples → lists, non-JSON values → strings)
    return orjson.loads(orjson.dumps(doc, default=str))


def add_attachment(
    target: str | os.PathLike[str],
    attachment_id: str,
    *,
    kind: str,
    storage: str = "reference",
    path: str | None = None,
    url: str | None = None,
    title: str | None = None,
    session_id: str | None = None,
    job_id: str | None = None,
    rank: int | None = None,
    source_namespace: str | None = None,
    source_ref: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    run_id: str | None = None,
) -> Path:
    """Add one attachment to an envelope or a sidecar and return the file written.

    ``target`` is a ``stormlog_run.json`` (the attachment joins its run), a
    ``stormlog_attachments.json`` (created when missing), or a folder (created when missing): its
    envelope when it holds one, else its sidecar (created when missing). ``path`` is relative to that file's folder (or
    absolute); ``url`` is recorded, never fetched. ``run_id`` is only for sidecars.

    Raises:
        EnvelopeError: the attachment or the resulting file would not be valid, or ``attachment_id``
            is already used in that file; nothing is written.
        OSError: the file cannot be read or written.
    """
    p = Path(target)
    if p.suffix == ".json" and not p.is_dir():
        file = p
    else:
        file = p / ENVELOPE_FILE if (p / ENVELOPE_FILE).is_file() else p / SIDECAR_FILE
    item: dict[str, Any] = {"attachment_id": attachment_id, "kind": kind, "storage": storage}
    optional = {"title": title, "path": path, "url": url, "session_id": session_id, "job_id": job_id,
                "rank": rank, "source_namespace": source_namespace, "source_ref": source_ref, "run_id": run_id}
    item.update({k: v for k, v in optional.items() if v is not None})
    item["metadata"] = dict(metadata or {})
    item = _plain(item)
    is_envelope = file.name == ENVELOPE_FILE
    if is_envelope and run_id is not None:
        raise EnvelopeError(file, [Problem("run_id", "an envelope's attachments belong to its run; "
                                                     "run_id is only for sidecar items")])
    problems = attachment_problems(item)
    if problems:
        raise EnvelopeError(file, problems)
    doc = _read(file)
    if doc is None:
        if is_envelope:
            raise EnvelopeError(file, [Problem("", "no envelope here; write one with write_envelope() first")])
        doc = {"schema_version": 1, "format": SIDECAR_FORMAT, "attachments": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("attachments", []), list):
        raise EnvelopeError(file, [Problem("attachments", "the existing file has no attachments list")])
    attachments = doc.setdefault("attachments", [])
    if any(isinstance(a, dict) and a.get("attachment_id") == attachment_id for a in attachments):
        raise EnvelopeError(file, [Problem("attachment_id", f"{attachment_id!r} is already in this file")])
    attachments.append(item)
    if is_envelope:
        doc["updated_at_utc"] = iso_utc(time.time())
        problems = envelope_problems(doc)
    else:
        file_problems, item_problems = sidecar_problems(doc)
        problems = file_problems + [p for ps in item_problems.values() for p in ps]
    if problems:
        raise EnvelopeError(file, problems)
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(file, dump_json(doc))
    return file
