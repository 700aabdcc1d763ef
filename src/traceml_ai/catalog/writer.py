"""Writing run envelopes and attachments (004 seed; DESIGN §2.2): validated first, then written
atomically (a temp file in the same folder, then a rename), so a reader sees the old file or the new
one, never half of one. One writer per file (DESIGN §2.1): two processes adding to the same file at
once may lose one addition.
"""

from __future__ import annotations

import errno
import json
import math
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
from traceml_ai.catalog.sources import loads
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
        shown = "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in self.problems)
        super().__init__(f"{self.path}: not written: {shown}")


def _target(folder_or_file: str | os.PathLike[str], name: str, allowed: tuple[str, ...]) -> Path:
    """The file to write: ``<folder>/<name>``, or the path itself when it names a ``.json`` file.

    Raises:
        EnvelopeError: the path names a ``.json`` file that discovery would not read.
    """
    p = Path(folder_or_file)
    if p.is_dir() or p.suffix != ".json":
        return p / name
    if p.name not in allowed:
        raise EnvelopeError(p, [Problem("", f"discovery reads only files named {' or '.join(allowed)}; "
                                            f"{p.name} would never be found")])
    return p


def _check_folder(path: Path) -> None:
    """Raise a clear :class:`NotADirectoryError` / :class:`IsADirectoryError` when ``path`` cannot be
    a file: a part of the way to it is a file, or it is a folder itself (else ``mkdir`` and the
    rename fail with a bare message)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"not written: {path} is a folder", os.fspath(path))
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"not written: {parent} is a file, not a folder",
                                         os.fspath(path))
            return


def _read(path: Path) -> Any:
    """The parsed file, or None when it does not exist.

    Raises:
        orjson.JSONDecodeError: it is not valid JSON. OSError: it cannot be read.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return loads(raw)  # as the catalog reads it: integers beyond 64 bits exact, NaN accepted


def _describe(value: Any) -> str:
    """A value as a message shows it: JSON when it is JSON, else its Python type."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        return f"a Python {type(value).__name__} object"
    return text if len(text) <= 60 else text[:57] + "..."


def _json(value: Any, fld: str, problems: list[Problem]) -> Any:
    """``value`` as plain JSON (tuples become lists, mappings dicts). A value JSON cannot hold (NaN,
    infinity, bytes, any other object, a key that is not a string) is a problem naming its field
    (``metadata.x``), never changed silently into null or a string."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        problems.append(Problem(fld, f"is {value}, which JSON cannot hold (use null for a missing value)"))
        return None
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(Problem(fld, f"has the key {key!r} ({type(key).__name__}); JSON keys are strings"))
                continue
            out[key] = _json(item, f"{fld}.{key}" if fld else key, problems)
        return out
    if isinstance(value, (list, tuple)):
        return [_json(item, f"{fld}[{i}]", problems) for i, item in enumerate(value)]
    problems.append(Problem(fld, f"is {_describe(value)}, not a JSON value (string, number, true, false, "
                                 "null, object or list)"))
    return None


def _json_list(value: Any, fld: str, problems: list[Problem], *, of_objects: bool) -> list[Any] | None:
    """A list argument (``tags``, ``sessions``, ``attachments``) as JSON, or None (a problem) when
    it is not a list or tuple: a string would otherwise be split into its characters."""
    if not isinstance(value, (list, tuple)):
        wanted = "a list of objects (dicts)" if of_objects else "a list of strings"
        problems.append(Problem(fld, f"must be {wanted}, not {_describe(value)}"))
        return None
    if of_objects:
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                problems.append(Problem(f"{fld}[{i}]", f"must be an object (a dict), not {_describe(item)}"))
    out: list[Any] = _json(list(value), fld, problems)
    return out


def _json_object(value: Any, fld: str, problems: list[Problem]) -> dict[str, Any]:
    """A mapping argument (``metadata``) as a JSON object; None is ``{}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(Problem(fld, f"must be an object (a dict), not {_describe(value)}"))
        return {}
    out: dict[str, Any] = _json(value, fld, problems)
    return out


def _with_defaults(item: Any, keys: tuple[str, ...]) -> Any:
    """A session or attachment object with ``metadata`` ``{}`` when not given, and for an
    attachment ``title`` = its ``attachment_id`` or ``kind`` when not given (Stormlog requires both)."""
    if not isinstance(item, dict):
        return item
    out = dict(item)
    out.setdefault("metadata", {})
    if "title" in keys and out.get("title") is None:
        guess = out.get("attachment_id") or out.get("kind")
        if isinstance(guess, str) and guess:
            out["title"] = guess
    return out


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
    file's path. Replaces an existing envelope there, keeping its ``created_at_utc`` (one of another
    ``schema_version`` than 1 is refused, as :func:`add_attachment` refuses it).

    Args:
        folder: where the envelope goes; relative attachment paths are read against it.
        run_id: the run's stable identifier (unique among envelopes discovered together).
        started_at_ns, ended_at_ns: Unix epoch ns (end not before start).
        sessions: objects with ``session_id`` and optionally ``job_id``, ``rank``, ``local_rank``,
            ``world_size`` (≥ 1), ``role``, ``source_namespace``, ``source_ref``, ``metadata`` (``{}``
            when not given). Nothing else: Stormlog's v1 schema rejects other fields, so a
            session's status or times go in its ``metadata``.
        attachments: objects with ``kind``, ``storage`` (``reference``|``copy``), ``path`` or ``url``,
            and ``title`` (default: ``attachment_id``, else ``kind``); optionally ``attachment_id``,
            ``run_id``, ``session_id``, ``job_id``, ``rank``, ``local_rank``, ``world_size``,
            ``start_ns``, ``end_ns``, ``source_namespace``, ``source_ref``, ``metadata`` (``{}``).
        tags: a list (or tuple) of strings; a bare string is refused, not split.
        metadata: integration-specific details ({} when none).

    Every value must be one JSON can hold (str, int, finite float, bool, None, dicts with string
    keys, lists, tuples): NaN, infinity, bytes or any other object is refused, naming its field
    (``metadata.x``), never changed into null or a string.

    Raises:
        EnvelopeError: an argument has the wrong type, or the envelope would not be valid by
            Stormlog's v1 schema (every problem named, with its field: an unknown field, repeated
            tags, ...); or ``folder`` names a ``.json`` file other than ``stormlog_run.json``;
            or the envelope there has another ``schema_version`` than 1. Nothing is written.
        NotADirectoryError: a part of the way to the file is a file (the message names it).
        IsADirectoryError: the file's path is a folder.
        OSError: the file cannot be written (e.g. permission denied).
    """
    path = _target(folder, ENVELOPE_FILE, (ENVELOPE_FILE,))
    problems: list[Problem] = []
    doc: dict[str, Any] = {"schema_version": 1, "format": ENVELOPE_FORMAT, "run_id": _json(run_id, "run_id", problems)}
    optional = {"title": title, "description": description, "job_id": job_id, "started_at_ns": started_at_ns,
                "ended_at_ns": ended_at_ns, "source_namespace": source_namespace, "source_ref": source_ref}
    doc.update({k: _json(v, k, problems) for k, v in optional.items() if v is not None})
    now = iso_utc(time.time())
    doc.update(created_at_utc=now, updated_at_utc=now)
    if tags is not None:
        doc["tags"] = _json_list(tags, "tags", problems, of_objects=False)
    doc["sessions"] = [_with_defaults(x, ()) for x in _json_list(sessions or [], "sessions", problems,
                                                                  of_objects=True) or []]
    doc["attachments"] = [_with_defaults(x, ("title",)) for x in _json_list(attachments or [], "attachments",
                                                                           problems, of_objects=True) or []]
    doc["metadata"] = _json_object(metadata, "metadata", problems)
    if problems:  # the arguments themselves: the schema would only repeat them less clearly
        raise EnvelopeError(path, problems)
    problems = envelope_problems(doc)
    if problems:
        raise EnvelopeError(path, problems)
    _check_folder(path)
    try:
        old = _read(path)
    except (OSError, ValueError):
        old = None  # an unreadable old envelope is what is being replaced; only its created_at is lost
    if isinstance(old, dict) and "schema_version" in old and not (type(old["schema_version"]) is int
                                                                  and old["schema_version"] == 1):
        found = json.dumps(old["schema_version"])
        raise EnvelopeError(path, [Problem("schema_version", f"the existing envelope's is {found}, not 1 "
                                                             "(written by a newer Stormlog?); not replaced")])
    if isinstance(old, dict) and isinstance(old.get("created_at_utc"), str) and old["created_at_utc"]:
        doc["created_at_utc"] = old["created_at_utc"]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dump_json(doc))
    return path


def add_attachment(
    target: str | os.PathLike[str],
    attachment_id: str | None = None,
    *,
    kind: str,
    storage: str | None = "reference",
    path: str | None = None,
    url: str | None = None,
    title: str | None = None,
    session_id: str | None = None,
    job_id: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    created_at_utc: str | None = None,
    updated_at_utc: str | None = None,
    source_namespace: str | None = None,
    source_ref: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    run_id: str | None = None,
) -> Path:
    """Add one attachment to an envelope or a sidecar and return the file written.

    ``target`` is a ``stormlog_run.json`` (the attachment joins its run), a
    ``stormlog_attachments.json`` (created when missing), or a folder (created when missing): its
    envelope when it holds one, else its sidecar (created when missing). ``path`` is relative to that file's folder (or
    absolute); ``url`` is recorded, never fetched. ``run_id`` is only for sidecars. ``title``
    defaults to ``attachment_id``, else ``kind`` (Stormlog requires one); ``attachment_id`` is
    optional and need not be unique, as in Stormlog (which lists every item, repeats included);
    adding the same id twice adds two attachments; ``storage`` may be None in a
    sidecar (read as ``reference``). ``start_ns``/``end_ns`` (ns since the epoch, end not before
    start), ``created_at_utc``/``updated_at_utc`` (ISO 8601 text) and ``rank`` are the v1 fields of
    both files; ``local_rank`` (≥ 0) and ``world_size`` (≥ 1) exist only in an envelope's
    attachments (the sidecar schema refuses them, and so does this function, naming the field).

    Values are checked as in :func:`write_envelope`: a value JSON cannot hold is refused, naming
    its field. A sidecar's existing items without ``metadata`` (Stormlog's minimal shape, read as
    ``{}``) are written back with ``"metadata": {}``, which the v1 schema requires.

    Raises:
        EnvelopeError: an argument has the wrong type, the attachment or the resulting file would
            not be valid, the existing file is not
            valid JSON, or ``target`` names a ``.json`` file other than the two catalog files;
            nothing is written.
        NotADirectoryError, IsADirectoryError: as for :func:`write_envelope`.
        OSError: the file cannot be read or written (e.g. permission denied).
    """
    p = Path(target)
    if p.suffix == ".json" and not p.is_dir():
        file = _target(p, ENVELOPE_FILE, (ENVELOPE_FILE, SIDECAR_FILE))
    else:
        file = p / ENVELOPE_FILE if (p / ENVELOPE_FILE).is_file() else p / SIDECAR_FILE
    is_envelope = file.name == ENVELOPE_FILE
    if is_envelope and run_id is not None:
        raise EnvelopeError(file, [Problem("run_id", "an envelope's attachments belong to its run; "
                                                     "run_id is only for sidecar items")])
    problems: list[Problem] = []
    if title is None:
        title = attachment_id if attachment_id else kind
    item: dict[str, Any] = {"title": _json(title, "title", problems), "kind": _json(kind, "kind", problems)}
    optional = {"attachment_id": attachment_id, "storage": storage, "path": path, "url": url,
                "session_id": session_id, "job_id": job_id, "rank": rank, "local_rank": local_rank,
                "world_size": world_size, "start_ns": start_ns, "end_ns": end_ns, "created_at_utc": created_at_utc,
                "updated_at_utc": updated_at_utc, "source_namespace": source_namespace, "source_ref": source_ref,
                "run_id": run_id}
    item.update({k: _json(v, k, problems) for k, v in optional.items() if v is not None})
    item["metadata"] = _json_object(metadata, "metadata", problems)
    if not problems:
        if is_envelope:
            problems = attachment_problems(item)
        else:
            file_problems, item_problems = sidecar_problems({"schema_version": 1, "format": SIDECAR_FORMAT,
                                                             "attachments": [item]})
            problems = file_problems + [Problem(p.field.removeprefix("attachments[0]."), p.message)
                                        for p in item_problems.get(0, [])]
    if problems:
        raise EnvelopeError(file, problems)
    _check_folder(file)
    try:
        doc = _read(file)
    except ValueError as exc:
        raise EnvelopeError(file, [Problem("", f"the existing file is not valid JSON ({exc}); fix or remove it")]
                            ) from None
    if doc is None:
        if is_envelope:
            raise EnvelopeError(file, [Problem("", "no envelope here; write one with write_envelope() first")])
        doc = {"schema_version": 1, "format": SIDECAR_FORMAT, "attachments": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("attachments", []), list):
        raise EnvelopeError(file, [Problem("attachments", "the existing file has no attachments list")])
    attachments = doc.setdefault("attachments", [])
    if not is_envelope:
        # Items of Stormlog's own minimal shape (no metadata) are read as metadata {}; the v1 schema
        # the written file must meet requires the field, so it is written as Stormlog reads it.
        for old_item in attachments:
            if isinstance(old_item, dict) and "metadata" not in old_item:
                old_item["metadata"] = {}
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
    atomic_write(file, _dump_kept(doc))
    return file


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, list):
        return any(map(_non_finite, value))
    return False


def _dump_kept(doc: Any) -> bytes:
    """``doc`` as written back after adding to it: what the existing file held stays as it was,
    ``NaN`` / ``Infinity`` included (Stormlog and this catalog read them; orjson would write null)."""
    if _non_finite(doc):
        return (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=True) + "\n").encode("utf-8")
    return dump_json(doc)
