"""``traceml_ai.init()``: turn on telemetry capture from inside a training script (DESIGN §3).

Under ``traceml run`` the bootstrap has already started the session and ``init()`` just returns it.
For a script run by hand next to ``traceml serve`` (or any aggregator), ``init()`` starts one from
its arguments and the ``TRACEML_*`` environment (see :mod:`traceml_ai.capture.session`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from traceml_ai.capture import steps
from traceml_ai.capture.session import (
    ENV_AGGREGATOR,
    ENV_JOB_SECRET,
    ENV_SESSION_ID,
    CaptureConfig,
    CaptureSession,
    capture_disabled,
    capture_env,
    current_session,
    parse_address,
    parse_interval,
    start_session,
)


def _off(reason: str) -> None:
    print(f"[TraceML] telemetry capture is off: {reason}", file=sys.stderr)


def init(
    *,
    aggregator: str | None = None,
    session_id: str | None = None,
    interval: float | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> CaptureSession | None:
    """Start (or return) this process's telemetry capture session.

    Args:
        aggregator: ``"host:port"`` of the aggregator (``traceml serve`` prints it); default
            ``TRACEML_AGGREGATOR``.
        session_id: the session the aggregator accepts; default ``TRACEML_SESSION_ID``.
        interval: sampler interval in seconds (> 0); default ``TRACEML_INTERVAL``, else 1.0.
        run_dir: the run folder, carried for the session; default ``TRACEML_RUN_DIR``.

    Explicit arguments win over the environment. When a session already runs (the launcher's
    bootstrap started it) that session is returned as it is.

    Returns:
        The running :class:`~traceml_ai.capture.session.CaptureSession`, or None when capture is
        off: ``TRACEML_DISABLE=1``, no aggregator address or session id anywhere, or a bad value.
        Then one ``[TraceML]`` line on stderr says why and training goes on untouched.

    Raises:
        Nothing for configuration problems (they turn capture off); see above.

    Example::

        import traceml_ai
        traceml_ai.init(aggregator="127.0.0.1:7071", session_id="a3f9c2")
    """
    running = current_session()
    if running is not None:
        return running
    if capture_disabled():
        _off("TRACEML_DISABLE is set")
        return None
    try:
        values: dict[str, Any] = capture_env()
        if aggregator is not None:
            values["aggregator"] = parse_address(aggregator)
        if interval is not None:
            values["interval"] = parse_interval(interval)
    except ValueError as exc:
        _off(str(exc))
        return None
    if session_id is not None:
        values["session_id"] = session_id
    if run_dir is not None:
        values["run_dir"] = os.fspath(run_dir)
    if "aggregator" not in values:
        _off(f"no aggregator address (pass init(aggregator='host:port') or set {ENV_AGGREGATOR})")
        return None
    if not values.get("session_id"):
        _off(f"no session id (pass init(session_id=...) or set {ENV_SESSION_ID})")
        return None
    if not values.get("secret"):
        _off(f"no job secret (set {ENV_JOB_SECRET}; `traceml serve` prints it); the aggregator "
             "accepts only ranks that hold it")
        return None
    try:
        session = start_session(CaptureConfig(**values))
        # After `import torch` (the usual place of init()), start step tracing now so that the
        # DataLoader fetch of the very first step is timed too.
        steps.prepare(session)
        return session
    except Exception as exc:  # telemetry never stops the training
        _off(f"it could not start ({exc!r})")
        return None
