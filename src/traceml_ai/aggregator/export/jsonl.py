"""The built-in ``jsonl`` exporter: ``<run>/aggregator/export/<STREAM>.jsonl`` (DESIGN §3.4, 000 seed).

One file per selected stream, created when the exporter opens (so a selected stream with no
record still gets a file with its closing line). Each record is one line: its ``to_dict()`` as
compact JSON, without ``hostname`` unless ``exporter_hostname`` is on (then ``null`` when the rank
sent none). Non-finite floats (NaN, ±inf) are written as ``null``: JSON has no such numbers. The
last line of every file is the closing line::

    {"closing": true, "stream": "<STREAM>", "written_records": N, "dropped_batches": M}

``written_records`` counts the record lines of that file; ``dropped_batches`` is the worker's one
count of payload batches never handed to ``write`` (the same in every file). A file without its
closing line was not closed: the aggregator ended abnormally or the exporter failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO

import msgspec

from traceml_ai.aggregator.export.exporter import ExporterContext
from traceml_ai.aggregator.export.records import ExportRecord

_BUFFER_BYTES = 1 << 20


class JsonlExporter:
    """Writes the selected records as JSON Lines, one file per ``STREAM`` in ``export_dir``.

    Args:
        export_dir: the folder (created by :meth:`open`); normally ``<run>/aggregator/export``.
        streams: the selected record ``STREAM`` names; one file each.
        include_hostname: keep the ``hostname`` field of the records that have one.

    Raises (from :meth:`open`):
        FileExistsError: a ``<STREAM>.jsonl`` is already there (an export is never overwritten).
        OSError: the folder or a file cannot be created.
    """

    def __init__(self, export_dir: Path, streams: Sequence[str], *, include_hostname: bool = False) -> None:
        self.export_dir = Path(export_dir)
        self.streams = tuple(streams)
        self.include_hostname = include_hostname
        self._files: dict[str, IO[bytes]] = {}
        self.written: dict[str, int] = {}
        self._encode = msgspec.json.Encoder().encode

    @classmethod
    def from_context(cls, context: ExporterContext) -> JsonlExporter:
        return cls(context.export_dir, context.streams, include_hostname=context.include_hostname)

    def path(self, stream: str) -> Path:
        """The file of ``stream``: ``<export_dir>/<stream>.jsonl``."""
        return self.export_dir / f"{stream}.jsonl"

    def open(self) -> None:
        self.export_dir.mkdir(parents=True, exist_ok=True)
        for stream in self.streams:
            self._files[stream] = open(self.path(stream), "xb", buffering=_BUFFER_BYTES)
            self.written[stream] = 0

    def write(self, records: Sequence[ExportRecord]) -> None:
        lines: dict[str, list[bytes]] = {}
        encode = self._encode
        keep_hostname = self.include_hostname
        for record in records:
            data = record.to_dict()
            if not keep_hostname:
                data.pop("hostname", None)
            stream = record.STREAM
            found = lines.get(stream)
            if found is None:
                found = lines[stream] = []
            found.append(encode(data))
        for stream, encoded in lines.items():
            # A record of a stream that was not selected is a caller's bug: KeyError ends the export.
            handle = self._files[stream]
            handle.write(b"\n".join(encoded))
            handle.write(b"\n")
            self.written[stream] += len(encoded)

    def flush(self) -> None:
        for handle in self._files.values():
            handle.flush()

    def close(self, *, dropped_batches: int = 0) -> None:
        errors: list[BaseException] = []
        for stream, handle in self._files.items():
            try:
                closing = {"closing": True, "stream": stream, "written_records": self.written[stream],
                           "dropped_batches": dropped_batches}
                handle.write(self._encode(closing) + b"\n")
                handle.close()
            except OSError as exc:  # close the other files all the same, then report
                errors.append(exc)
        self._files.clear()
        if errors:
            raise errors[0]
