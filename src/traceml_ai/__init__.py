"""TraceML: see inside ML training runs.

The import package of the ``traceml-ai`` distribution. ``traceml_ai.Run`` is the run logger
(003 seed, "Writing runs"); ``init``, ``trace_step`` and ``trace_region`` capture telemetry
(DESIGN §3); ``traceml_ai.runs`` reads run folders. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Run", "__version__", "init", "trace_region", "trace_step"]

if TYPE_CHECKING:
    from traceml_ai.sdk.logger import Run
    from traceml_ai.sdk.session import init
    from traceml_ai.sdk.tracing import trace_region, trace_step


def __getattr__(name: str) -> Any:
    # Lazy so that ``import traceml_ai`` stays cheap for the readers and the CLI.
    if name == "Run":
        from traceml_ai.sdk.logger import Run

        return Run
    if name == "init":
        from traceml_ai.sdk.session import init

        return init
    if name in ("trace_step", "trace_region"):
        from traceml_ai.sdk import tracing

        return getattr(tracing, name)
    raise AttributeError(f"module 'traceml_ai' has no attribute {name!r}")
