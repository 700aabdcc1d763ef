"""Readers of the small files TraceML's capture leaves in a run's ``aggregator/`` folder besides the
telemetry database and the final summary (DESIGN §2.1, §5): ``manifest.json`` (the session),
``finalization_warning.json`` (what was lost) and ``rank_<g>.log`` (each rank's captured output).

Every reader is read-only and tolerant: it opens only regular files
(:func:`traceml_ai.runs.safeio.open_regular`, so a FIFO or device never blocks it), reads at most a
bounded number of bytes, and turns what is wrong with a file into one warning line
(``aggregator/<name>: <what>``) appended to the caller's list, returning None (or an empty tail)
instead of raising. :func:`list_aggregator_files` lists the folder (confined to the run folder)
with each file's ``(mtime_ns, size)`` for a reader's cache. The telemetry database and
``final_summary.json`` have their readers in :mod:`traceml_ai.diagnose`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from traceml_ai.runs.discovery import inside, stat_confined
from traceml_ai.runs.safeio import open_regular

AGGREGATOR_DIR: Final = "aggregator"
MANIFEST: Final = "manifest.json"
FINALIZATION_WARNING: Final = "finalization_warning.json"
MAX_JSON_BYTES: Final = 16 * 1024 * 1024
"""manifest.json and finalization_warning.json above this size are not read."""
LOG_TAIL_MAX_BYTES: Final = 1024 * 1024
"""At most this much of the end of a rank log is read for its tail (longer lines are cut)."""
MAX_LINE_CHARS: Final = 4000
"""A log line longer than this is cut (with a marker), so one huge line cannot bloat an answer."""

RANK_LOG: Final = re.compile(r"^rank_(\d+|unknown)\.log$")
"""The name of a rank's captured output: ``rank_<global rank>.log`` or ``rank_unknown.log``."""

_STREAM_PREFIXES = (("stdout | ", "stdout"), ("stderr | ", "stderr"))
# Terminal control sequences (colours, cursor moves) a script printed: shown raw they read as
# "[31mred[0m"; readers get the text without them (the rank log on disk keeps them).
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

Scalar = str | int | float | None
Stamp = tuple[str, int, int]
"""``(name, mtime_ns, size)`` of one file: a reader's cache key."""


@dataclass(frozen=True)
class Manifest:
    """The session facts of ``manifest.json`` a viewer shows (DESIGN §5): its ``session_id``, the
    lifecycle ``status`` (``running``, ``completed``, ``incomplete`` ...), the job shape
    (``world_size``, ``nnodes``, ``nproc_per_node``, ``mode``), start and end (ns since the Unix
    epoch), the launcher's ``exit_code`` and ``hostname``. A field that is missing or not a JSON
    scalar is None."""

    session_id: Scalar = None
    status: Scalar = None
    world_size: Scalar = None
    nnodes: Scalar = None
    nproc_per_node: Scalar = None
    mode: Scalar = None
    started_at_ns: Scalar = None
    ended_at_ns: Scalar = None
    exit_code: Scalar = None
    hostname: Scalar = None

    def to_dict(self) -> dict[str, Scalar]:
        """Every field by name (docs/viewer-api.md, telemetry ``manifest``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class FinalizationWarning:
    """What ``finalization_warning.json`` says was lost during capture: its ``summary`` lines."""

    summary: tuple[str, ...]


@dataclass(frozen=True)
class RankLogTail:
    """The end of one ``rank_<g>.log``: ``rank`` (the ``<g>`` text, ``unknown`` allowed), the file
    ``name``, its ``size`` in bytes (None when it could not be read), the last lines as
    ``(stream, text)`` with stream ``stdout``/``stderr`` or None for a line without a prefix
    (terminal control sequences removed, lines over :data:`MAX_LINE_CHARS` cut), and whether
    earlier lines were left out (``truncated``)."""

    rank: str
    name: str
    lines: tuple[tuple[str | None, str], ...] = ()
    size: int | None = None
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{"rank", "name", "lines": [[stream, text], ...], "size", "truncated"}``."""
        return {"rank": self.rank, "name": self.name, "lines": [list(line) for line in self.lines],
                "size": self.size, "truncated": self.truncated}


def list_aggregator_files(
    run_dir: str, wanted: Callable[[str], bool]
) -> tuple[tuple[Stamp, ...], str | None, str | None]:
    """The :data:`Stamp` of each ``wanted`` file in ``<run_dir>/aggregator/`` (by name), the folder's
    real path (None when there is none, or it is refused), and why something was refused or left
    out (None when nothing was): an ``aggregator/`` that is a link out of the run folder is not read;
    a FIFO, device or link out of the run folder inside it is left out and named (at most five).
    Only ``stat`` calls: nothing is opened."""
    path = os.path.join(run_dir, AGGREGATOR_DIR)
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        return (), None, None
    if not inside(real, run_dir):
        return (), None, f"{AGGREGATOR_DIR}/ points outside the run folder: not read"
    try:
        names = sorted(e.name for e in os.scandir(real))
    except OSError as err:
        return (), real, f"{AGGREGATOR_DIR}/ cannot be listed ({err})"
    out: list[Stamp] = []
    skipped: list[str] = []
    for name in names:
        if not wanted(name):
            continue
        st, reason = stat_confined(os.path.join(real, name), run_dir)
        if st is not None:
            out.append((name, st.st_mtime_ns, st.st_size))
        else:  # a FIFO, a device, a link leaving the run folder: said, not silently left out
            skipped.append(f"{AGGREGATOR_DIR}/{name}: {reason or 'not a regular file'}; not read")
    return tuple(out), real, ("; ".join(skipped[:5]) or None)


def rank_log_order(name: str) -> tuple[bool, int]:
    """Sort key of rank log names: by rank, ``rank_unknown.log`` last."""
    m = RANK_LOG.match(name)
    rank = m.group(1) if m else "unknown"
    return (rank == "unknown", int(rank) if rank.isdigit() else 0)


def _read_json(path: str, name: str, warnings: list[str]) -> dict[str, Any] | None:
    try:
        with open_regular(os.path.realpath(path)) as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        warnings.append(f"{AGGREGATOR_DIR}/{name}: cannot be read ({err})")
        return None
    if len(data) > MAX_JSON_BYTES:
        warnings.append(f"{AGGREGATOR_DIR}/{name}: larger than {MAX_JSON_BYTES // (1024 * 1024)} MB, not read")
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        warnings.append(f"{AGGREGATOR_DIR}/{name}: not valid JSON ({err})")
        return None
    if not isinstance(doc, dict):
        warnings.append(f"{AGGREGATOR_DIR}/{name}: not a JSON object")
        return None
    return doc


def read_manifest(agg_dir: str, warnings: list[str]) -> Manifest | None:
    """The :class:`Manifest` of ``<agg_dir>/manifest.json``; None (and a warning) when it cannot be
    read, is larger than :data:`MAX_JSON_BYTES`, or is not a JSON object."""
    doc = _read_json(os.path.join(agg_dir, MANIFEST), MANIFEST, warnings)
    if doc is None:
        return None
    return Manifest(**{name: v for name in Manifest.__dataclass_fields__
                       if isinstance(v := doc.get(name), (str, int, float))})


def read_finalization_warning(agg_dir: str, warnings: list[str]) -> FinalizationWarning | None:
    """The :class:`FinalizationWarning` of ``<agg_dir>/finalization_warning.json`` (its text
    ``summary`` lines; other entries are left out with a warning); None (and a warning) as
    :func:`read_manifest`, and when ``summary`` is not a list."""
    doc = _read_json(os.path.join(agg_dir, FINALIZATION_WARNING), FINALIZATION_WARNING, warnings)
    if doc is None:
        return None
    found = doc.get("summary")
    if not isinstance(found, list):
        # What the aggregator writes is a list of lines; anything else says nothing about the losses.
        warnings.append(f"{AGGREGATOR_DIR}/{FINALIZATION_WARNING}: 'summary' is not a list of text lines")
        return None
    lines = tuple(s for s in found if isinstance(s, str))
    if len(lines) != len(found):
        warnings.append(f"{AGGREGATOR_DIR}/{FINALIZATION_WARNING}: {len(found) - len(lines)} entries of 'summary' "
                        "are not text; left out")
    return FinalizationWarning(lines)


def read_rank_log_tail(agg_dir: str, name: str, tail_lines: int, warnings: list[str]) -> RankLogTail:
    """The last ``tail_lines`` lines of ``<agg_dir>/<name>`` (a :data:`RANK_LOG` name), from at most
    its last :data:`LOG_TAIL_MAX_BYTES` bytes (undecodable bytes replaced); an empty tail and a
    warning when the file cannot be read."""
    m = RANK_LOG.match(name)
    rank = m.group(1) if m else "unknown"
    try:
        with open_regular(os.path.realpath(os.path.join(agg_dir, name))) as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - LOG_TAIL_MAX_BYTES)
            f.seek(start)
            data = f.read(size - start)
    except OSError as err:
        warnings.append(f"{AGGREGATOR_DIR}/{name}: cannot be read ({err})")
        return RankLogTail(rank, name)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline after the last line
    if start > 0 and lines:
        lines.pop(0)  # began mid-line
    kept = tuple(_log_line(line) for line in lines[-tail_lines:])
    return RankLogTail(rank, name, kept, size, start > 0 or len(lines) > tail_lines)


def _log_line(line: str) -> tuple[str | None, str]:
    line = line.rstrip("\r")
    stream = None
    for prefix, which in _STREAM_PREFIXES:
        if line.startswith(prefix):
            stream, line = which, line[len(prefix):]
            break
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS] + f" … [{len(line) - MAX_LINE_CHARS:,} more characters]"
    return stream, line
