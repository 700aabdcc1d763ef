"""One open ``trace_step`` at a time, entered and left from framework callbacks."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from traceml_ai.sdk.tracing import trace_step


class OpenStep:
    """Holds the ``trace_step`` a framework opened in one callback and closes in another."""

    def __init__(self) -> None:
        self._cm: AbstractContextManager[None] | None = None

    def open(self, model: Any) -> None:
        self.close()  # a step the framework never ended (skipped batch) is closed first
        cm = trace_step(model)
        cm.__enter__()
        self._cm = cm

    def close(self, exc: BaseException | None = None) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            tb: TracebackType | None = exc.__traceback__ if exc is not None else None
            cm.__exit__(type(exc) if exc is not None else None, exc, tb)
