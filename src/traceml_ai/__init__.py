"""TraceML: see inside ML training runs.

The import package of the ``traceml-ai`` distribution. ``traceml_ai.Run`` is the run logger
(003 seed, "Writing runs"); ``traceml_ai.runs`` reads run folders. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Run", "__version__"]

if TYPE_CHECKING:
    from traceml_ai.sdk.logger import Run


def __getattr__(name: str) -> Any:
    # Lazy so that ``import traceml_ai`` stays cheap for the readers and the CLI.
    if name == "Run":
        from traceml_ai.sdk.logger import Run

        return Run
    raise AttributeError(f"module 'traceml_ai' has no attribute {name!r}")
