"""The ``stdout_stderr`` stream: the rank's Python-level output, line by line (DESIGN §3.1).

:class:`OutputCapture` replaces ``sys.stdout`` and ``sys.stderr`` with :class:`TeeStream` wrappers.
A wrapper first writes to the original stream, unchanged (the user sees exactly their output, and
``isatty``, ``encoding``, ``fileno``, ``buffer`` … answer as before), then keeps a copy: complete
lines with the time their newline was written. Rows: ``timestamp_unix_ns, line, stream`` with
``stream`` ``"stdout"`` or ``"stderr"``; empty lines are not recorded (000 seed).

- A partial line is held until its newline or until the capture closes.
- Progress bars rewrite their line with ``\\r``: a line keeps only its last non-empty ``\\r``
  segment (what the terminal ends up showing), so a bar never grows a line without bound.
- A line longer than :data:`MAX_LINE_CHARS` is cut into several rows.
- At most :data:`MAX_PENDING_LINES` lines wait for the sampler; beyond that the oldest are dropped
  and counted in :attr:`OutputCapture.dropped_lines`.

Only text written through ``sys.stdout``/``sys.stderr`` is seen: bytes written to
``sys.stdout.buffer`` or straight to file descriptors 1 and 2 (C extensions, NCCL) reach the
terminal but not this stream.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, TextIO

from traceml_ai.telemetry.schema import STDOUT_STDERR

MAX_PENDING_LINES = 10_000
MAX_LINE_CHARS = 16_384


def _last_segment(text: str) -> str:
    """The last non-empty ``\\r``-separated segment of ``text`` ("" when there is none)."""
    if "\r" not in text:
        return text
    for segment in reversed(text.split("\r")):
        if segment:
            return segment
    return ""


class _LineBuffer:
    """Complete lines of both streams, bounded, shared by the two tees (thread-safe)."""

    def __init__(self, max_lines: int) -> None:
        self.lock = threading.Lock()
        self.lines: deque[tuple[int, str, str]] = deque()
        self.max_lines = max_lines
        self.dropped = 0

    def add(self, ts: int, line: str, stream: str) -> None:
        # caller holds self.lock
        if len(self.lines) >= self.max_lines:
            self.lines.popleft()
            self.dropped += 1
        self.lines.append((ts, line, stream))


class TeeStream:
    """A text stream that writes through to ``original`` and copies complete lines aside.

    Everything not overridden here (``encoding``, ``errors``, ``isatty``, ``fileno``, ``buffer``,
    ``readable``, ``name``, …) is the original stream's own attribute.
    """

    def __init__(self, original: TextIO, name: str, sink: _LineBuffer) -> None:
        self._original = original
        self._name = name
        self._sink = sink
        self._partial = ""
        self.capturing = True

    @property
    def original(self) -> TextIO:
        """The stream this tee writes through to."""
        return self._original

    def write(self, s: str) -> int:
        written = self._original.write(s)
        if self.capturing and s and isinstance(s, str):
            try:
                self._keep(s)
            except Exception:  # a copy that fails must never fail the user's print
                pass
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._original.flush()

    def _keep(self, s: str) -> None:
        # The training thread pays for this on every write: the common cases (a fragment without a
        # newline, then print's lone "\n") take one lock and no clock read or split beyond need.
        sink = self._sink
        if "\n" not in s:
            with sink.lock:
                partial = self._partial + s
                if "\r" in s:
                    partial = _last_segment(partial) + ("\r" if partial.endswith("\r") else "")
                if len(partial) > MAX_LINE_CHARS:
                    partial = self._spill(partial, time.time_ns())
                self._partial = partial
            return
        now = time.time_ns()
        with sink.lock:
            *complete, tail = (self._partial + s).split("\n")
            for line in complete:
                self._emit(line, now)
            if "\r" in tail:
                tail = _last_segment(tail) + ("\r" if tail.endswith("\r") else "")
            self._partial = self._spill(tail, now) if len(tail) > MAX_LINE_CHARS else tail

    def _spill(self, partial: str, now: int) -> str:
        # caller holds the lock; a line without an end is cut so the partial stays bounded
        while len(partial) > MAX_LINE_CHARS:
            self._sink.add(now, partial[:MAX_LINE_CHARS], self._name)
            partial = partial[MAX_LINE_CHARS:]
        return partial

    def _emit(self, line: str, now: int) -> None:
        if "\r" in line:
            line = _last_segment(line)
        if len(line) <= MAX_LINE_CHARS:
            if line:  # empty lines are not recorded (000 seed)
                self._sink.add(now, line, self._name)
            return
        for start in range(0, len(line), MAX_LINE_CHARS):
            self._sink.add(now, line[start:start + MAX_LINE_CHARS], self._name)

    def finish(self) -> None:
        """Record a held partial line as a line of its own (at close)."""
        with self._sink.lock:
            if self._partial:
                self._emit(self._partial, time.time_ns())
                self._partial = ""

    def __getattr__(self, name: str) -> Any:
        if name == "_original":  # not set yet (copy/pickle): no endless lookup
            raise AttributeError(name)
        return getattr(self._original, name)


class OutputCapture:
    """Row source of the ``stdout_stderr`` stream: installs the tees on :meth:`install`.

    Args:
        max_pending_lines: lines held for the sampler before the oldest are dropped.
    """

    stream = STDOUT_STDERR

    def __init__(self, max_pending_lines: int = MAX_PENDING_LINES) -> None:
        self._buffer = _LineBuffer(max_pending_lines)
        self._tees: list[tuple[str, TeeStream]] = []

    @property
    def dropped_lines(self) -> int:
        """Lines lost because the sampler did not collect them in time."""
        return self._buffer.dropped

    def install(self) -> None:
        """Put tees in front of ``sys.stdout`` and ``sys.stderr`` (a None stream is left alone)."""
        for attr in ("stdout", "stderr"):
            original = getattr(sys, attr)
            if isinstance(original, TeeStream) and not original.capturing:
                original = original.original  # left over from a session of the parent process
            if original is None or isinstance(original, TeeStream):
                continue
            tee = TeeStream(original, attr, self._buffer)
            setattr(sys, attr, tee)
            self._tees.append((attr, tee))

    def uninstall(self) -> None:
        """Stop copying, keep held partial lines, and put the original streams back.

        A stream the user replaced after us is left as it is; our tee in its chain just stops copying.
        """
        for attr, tee in self._tees:
            tee.finish()
            tee.capturing = False
            if getattr(sys, attr) is tee:
                setattr(sys, attr, tee.original)
        self._tees = []

    def detach_in_child(self) -> None:
        """After a fork: stop copying without touching any lock (another thread may have held one)."""
        for _, tee in self._tees:
            tee.capturing = False

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        with self._buffer.lock:
            lines = list(self._buffer.lines)
            self._buffer.lines.clear()
        return [{"timestamp_unix_ns": ts, "line": line, "stream": stream} for ts, line, stream in lines if line]
