"""``trace_step`` and ``trace_region``: what a training loop wraps to get step telemetry (DESIGN §3.1).

::

    import traceml_ai

    for x, y in loader:
        with traceml_ai.trace_step(model):
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            with traceml_ai.trace_region("metrics"):
                ...

Each step becomes one ``step_time`` row (phases ``traceml:dataloader_next``, ``traceml:h2d``,
``traceml:forward``, ``traceml:backward``, ``traceml:optimizer_step``, ``traceml:step`` and the
user's region names) and one ``step_memory`` row, collected by the capture session of this process
(:mod:`traceml_ai.capture.session`). How each phase is timed, and what TraceML does to the CUDA
peak-memory counters, is in :mod:`traceml_ai.capture.instrument`; the rows and the step numbering in
:mod:`traceml_ai.capture.steps`.

Without a running capture session (the script was not started by ``traceml run`` and did not call
``traceml_ai.init()``), both are no-ops that cost one function call: nothing is patched, timed or
imported.
"""

from __future__ import annotations

import operator
from contextlib import AbstractContextManager
from typing import Any

from traceml_ai.capture import steps as _steps
from traceml_ai.capture import timing as _timing
from traceml_ai.capture.session import current_session
from traceml_ai.capture.timing import PHASE_PREFIX

__all__ = ["trace_region", "trace_step"]


class _NoOp:
    """The context manager of a call made while no capture session runs."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NOOP = _NoOp()


def trace_step(model: Any = None, *, step: int | None = None) -> AbstractContextManager[None]:
    """A context manager around one training step: ``with traceml_ai.trace_step(model): ...``.

    Times the step (``traceml:step``, from the start of the DataLoader fetch of its batch to the end
    of the block) and, inside it, the DataLoader wait, host-to-device copies (CUDA only), the
    outermost calls of ``model`` (forward), backward and optimizer step; on CUDA also with CUDA
    events, read later on the sampler thread so the training never waits. Records the step's peak
    memory. Results, exceptions and the CUDA peak counters the user reads are what they would be
    without it; an exception in the block propagates unchanged and the step is discarded whole (no
    row, its number not reused; counted in the ``[TraceML]`` note at the end of the run). With
    gradient accumulation (backward in every block, ``optimizer.step()`` every Nth, inside the block
    or right after it) the N blocks of one update are one step (``traceml_ai.capture.steps``).

    Args:
        model: the ``torch.nn.Module`` being trained (its device is the step's device); a
            ``torch.compile``'d one is timed without forward (a note says so). None: no forward.
        step: the step number; default: 0 for the first step of the session, then one more each
            step (after an explicit ``step=N`` the next step is N + 1).

    Returns:
        A context manager (no value). A ``trace_step`` inside an open step, or on a second thread
        while one is open, is ignored with a note. Without a capture session, and under
        ``traceml watch`` (which times no steps; a note says so once): a no-op.

    Raises:
        TypeError: ``step`` is neither None nor an integer (a bool, a float, a str: review 11e,
            ``step="s0"`` lost every step's timing with one note).
        ValueError: ``step`` is negative or does not fit in 64 bits (the export records' range).
    """
    if step is not None:
        step = _step_number(step)
    session = current_session()
    if session is None:
        _timing.TRACING = False
        return _NOOP
    bound = _steps.BOUND
    if bound is not None and bound[0] is session:
        return _steps.StepScope(bound[1], model, step)
    if not _steps.times_steps(session):
        return _NOOP  # traceml watch: no step timing (a one-line note says so once)
    return _steps.StepScope(_steps.tracer_for(session), model, step)


def _step_number(step: Any) -> int:
    """``step`` as a plain int (anything with ``__index__``: numpy and torch integers too)."""
    if isinstance(step, bool):
        raise TypeError("trace_step step must be an integer or None, got bool")
    try:
        number = operator.index(step)
    except TypeError:
        raise TypeError(f"trace_step step must be an integer or None, got {type(step).__name__} {step!r:.50}") from None
    if not 0 <= number <= _INT64_MAX:
        raise ValueError(f"trace_step step must be from 0 to 2**63 - 1, got {number}")
    return number


_INT64_MAX = 2**63 - 1


def trace_region(name: str) -> AbstractContextManager[None]:
    """A context manager timing the user's own phase ``name`` (its event name in the step rows).

    Inside a step the block counts in that step (``n_calls`` for each block, CPU and, on CUDA, GPU
    time). A block that ends outside any step counts in the next step on the same thread (CPU time
    only). Regions may nest; a region inside one of the same name is not counted twice.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or starts with ``traceml:`` (reserved for built-in phases).
    """
    if not isinstance(name, str):
        raise TypeError(f"trace_region name must be a string, got {type(name).__name__}")
    if not name or name.startswith(PHASE_PREFIX):
        raise ValueError(f"trace_region name {name!r} must be non-empty and not start with {PHASE_PREFIX!r}")
    session = current_session()
    if session is None or not _steps.times_steps(session):
        return _NOOP
    return _steps.tracer_for(session).region(name)
