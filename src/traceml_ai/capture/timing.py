"""Phase timers of one training step: CPU wall clock plus pooled CUDA events (DESIGN §3.1).

This module holds the *state* that the patches of :mod:`traceml_ai.capture.instrument` and the
step tracer of :mod:`traceml_ai.capture.steps` share, and the two clocks:

- **CPU**: ``time.perf_counter_ns`` around each call, summed per phase (``cpu_ms``).
- **GPU** (CUDA steps only): a pair of ``torch.cuda.Event(enable_timing=True)`` recorded on the
  step device's *current* stream before and after the call. The training thread only records
  events; it never synchronizes. The sampler thread asks ``event.query()`` and, once both events of
  every call of a step are complete, sums ``start.elapsed_time(end)`` (``gpu_ms``). Events come from
  an :class:`EventPool` per device and go back to it once read, so a long run creates only as many
  events as are in flight at once.

One step is open at a time in the process (:data:`OPEN`), owned by the thread that opened it; every
patch compares ``threading.get_ident()`` with :attr:`Step.thread`, so work on other threads
(DataLoader pin-memory thread, a user's side thread) is never timed.

Work done on the step's thread while no step is open is attributed to the *next* step on that
thread (:class:`PreStep`): the last successful DataLoader fetch (the one that produced the step's
batch in ``for batch in loader: with trace_step(model): ...``) and every ``trace_region`` that ended
outside a step. Nothing in this module imports torch at import time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from traceml_ai.telemetry import schema

perf_ns = time.perf_counter_ns
thread_id = threading.get_ident


class EventPool:
    """Reusable CUDA timing events of one device (``torch.cuda.Event(enable_timing=True)``).

    ``get`` and ``put`` are safe from the training and the sampler thread at once (``list.pop`` and
    ``list.append`` are atomic). An event handed back while still pending on the GPU may be
    recorded again: CUDA overwrites an event's state on every record.

    Args:
        device_index: the CUDA device whose current stream the events are recorded on.
    """

    __slots__ = ("_current_stream", "_event_cls", "_free", "created", "device_index")

    def __init__(self, device_index: int) -> None:
        import torch

        self.device_index = device_index
        self._free: list[Any] = []
        self._event_cls: Any = torch.cuda.Event
        self._current_stream = torch.cuda.current_stream
        self.created = 0

    def record(self) -> Any:
        """An event recorded now on the device's current stream (never blocks)."""
        try:
            event = self._free.pop()
        except IndexError:
            event = self._event_cls(enable_timing=True)
            self.created += 1
        event.record(self._current_stream(self.device_index))
        return event

    def put(self, event: Any) -> None:
        """Hands ``event`` back for reuse."""
        self._free.append(event)


class PhaseStats:
    """One phase's calls within one step: ``n_calls``, summed CPU ns and the GPU event pairs.

    ``all_gpu`` stays True only while every call brought a (start, end) event pair, so ``gpu_ms``
    can be None unless every call measured the GPU clock (000 seed, StepTimeRecord).
    """

    __slots__ = ("all_gpu", "cpu_ns", "n_calls", "pairs")

    def __init__(self) -> None:
        self.n_calls = 0
        self.cpu_ns = 0
        self.pairs: list[tuple[Any, Any]] = []
        self.all_gpu = True

    def add(self, cpu_ns: int, pair: tuple[Any, Any] | None) -> None:
        self.n_calls += 1
        self.cpu_ns += cpu_ns
        if pair is None:
            self.all_gpu = False
        else:
            self.pairs.append(pair)


class Step:
    """One traced step: open on :attr:`thread` while the block runs, then closed and handed to the
    sources, which read its GPU events on the sampler thread.

    Args:
        step: the step number.
        device: the step's device key in the events map, ``"cpu"`` or ``"cuda:<index>"``.
        pool: the device's :class:`EventPool` on a CUDA step, None on a CPU step (no GPU clock).
        info: what the tracer knows of the step's model (its forward hook targets), or None.

    Timer state of calls in progress (``forward_depth`` …) lives in class-level defaults that a
    step overrides only when it uses them: opening a step is on the training thread's hot path.
    """

    # Defaults, shadowed per instance when set (see the class docstring).
    t0 = 0
    ev0: Any = None
    hooks: Any = None
    forward_depth = 0
    forward_t0 = 0
    forward_ev: Any = None
    backward_depth = 0
    optimizer_depth = 0
    optimizer_t0 = 0
    optimizer_ev: Any = None
    h2d_depth = 0
    memory_reset_by_user = False
    end_unix_ns = 0
    closed_perf_ns = 0
    _released = False

    def __init__(self, step: int, device: str, pool: EventPool | None, info: Any) -> None:
        self.step = step
        self.device = device
        self.pool = pool
        self.info = info
        self.thread = thread_id()
        self.phases: dict[str, PhaseStats] = {}
        self.region_depth: dict[str, int] = {}

    # -- training thread, while open ---------------------------------------------------------------

    def mark(self) -> Any:
        """A start event on a CUDA step (record it *before* reading the CPU clock), else None."""
        pool = self.pool
        return None if pool is None else pool.record()

    def add(self, name: str, cpu_ns: int, ev0: Any) -> None:
        """Adds one call of phase ``name``: ``cpu_ns`` of wall time and, when ``ev0`` is an event,
        the (``ev0``, end event recorded now) pair. Read the CPU clock *before* calling this."""
        stats = self.phases.get(name)
        if stats is None:
            stats = self.phases[name] = PhaseStats()
        if ev0 is None:
            stats.add(cpu_ns, None)
        else:
            assert self.pool is not None
            stats.add(cpu_ns, (ev0, self.pool.record()))

    def release(self, event: Any) -> None:
        """Hands back a start event whose call is not counted."""
        if event is not None and self.pool is not None:
            self.pool.put(event)

    # -- sampler thread, once closed ---------------------------------------------------------------

    def gpu_ready(self) -> bool:
        """True when every GPU event of the step has completed (``event.query()``, never blocks)."""
        for stats in self.phases.values():
            for start, end in stats.pairs:
                if not (end.query() and start.query()):
                    return False
        return True

    def events(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The step's ``events`` map (DESIGN §3.1): ``{name: {device: {is_gpu, duration_ms,
        cpu_ms, gpu_ms, n_calls}}}`` in ms. A phase gets ``gpu_ms`` only if every call of it
        brought events that have all completed; otherwise ``gpu_ms`` is None, ``is_gpu`` False
        and ``duration_ms`` is ``cpu_ms``. Hands the events back to the pool."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, stats in self.phases.items():
            gpu_ms: float | None = None
            if stats.all_gpu and stats.pairs:
                gpu_ms = _gpu_sum(stats.pairs)
            cpu_ms = stats.cpu_ns / 1e6
            out[name] = {
                self.device: {
                    "is_gpu": gpu_ms is not None,
                    "duration_ms": cpu_ms if gpu_ms is None else gpu_ms,
                    "cpu_ms": cpu_ms,
                    "gpu_ms": gpu_ms,
                    "n_calls": stats.n_calls,
                }
            }
        self.release_events()
        return out

    def release_events(self) -> None:
        """Hands every event of the step back to its pool (once)."""
        if self._released:
            return
        self._released = True
        pool = self.pool
        if pool is None:
            return
        for stats in self.phases.values():
            for start, end in stats.pairs:
                pool.put(start)
                pool.put(end)


class PreStep(threading.local):
    """Work on one thread while no step is open there, waiting for that thread's next step.

    ``fetch`` is the last successful DataLoader fetch as ``(t0_ns, cpu_ns, start_event, pool)``;
    an earlier one is replaced (a validation loop between two steps leaves only its last fetch,
    which the next training fetch then replaces). ``regions`` sums the ``trace_region`` calls that
    ended outside a step, CPU clock only; ``open_regions`` names the regions open outside a step.
    ``generation`` is the :data:`GENERATION` the pending work belongs to: a new tracer (a new capture
    session) does not inherit what was pending for the previous one.
    """

    def __init__(self) -> None:
        self.generation = 0
        self.fetch: tuple[int, int, Any, EventPool | None] | None = None
        self.regions: dict[str, PhaseStats] = {}
        self.open_regions: set[str] = set()


# -- process-wide state (see the module docstring) -------------------------------------------------

FAULTS = 0
"""Failures of TraceML's own timing bookkeeping; each left one call untimed (the tracer notes them)."""


def fault() -> None:
    """Counts one failure of TraceML's own bookkeeping (the call it concerned goes on untimed)."""
    global FAULTS
    FAULTS += 1


OPEN: Step | None = None
"""The open step, or None. Set last when a step opens and first when it closes."""

TRACING: bool = False
"""True while a step tracer is active; the DataLoader patch records pre-step fetches only then."""

FETCH_POOL: EventPool | None = None
"""Pool of the last CUDA step's device: a pre-step fetch records its start event there, because
``traceml:step`` on that device begins where the fetch of its batch began."""

GENERATION: int = 0
"""Bumped by every new step tracer; pending pre-step work of an older generation is discarded."""

PRE = PreStep()


def pending() -> PreStep:
    """This thread's pre-step work, emptied first if it belongs to an older tracer."""
    pre = PRE
    if pre.generation != GENERATION:
        fetch = pre.fetch
        if fetch is not None and fetch[2] is not None and fetch[3] is not None:
            fetch[3].put(fetch[2])
        pre.fetch = None
        pre.regions = {}
        pre.generation = GENERATION
    return pre


def set_pending_fetch(t0_ns: int, cpu_ns: int, event: Any, pool: EventPool | None) -> None:
    """Remembers a fetch made outside any step on this thread; the previous one is dropped."""
    pre = pending()
    old = pre.fetch
    if old is not None and old[2] is not None and old[3] is not None:
        old[3].put(old[2])
    pre.fetch = (t0_ns, cpu_ns, event, pool)


class RegionScope:
    """Times one ``trace_region(name)`` block on this thread (DESIGN §3.1: event name = ``name``).

    The call counts in the step open on this thread when the block *ends*; a block that ends
    outside any step counts in the next step on this thread. Inside a step both clocks are used (when
    the block also began in that step); otherwise the CPU clock only. A block nested in a block of
    the same name is not counted again: only the outermost one is.
    """

    __slots__ = ("_ev", "_mode", "_name", "_st", "_t0")

    _SKIP = 0  # nested in a same-name block outside a step: not counted
    _IN_STEP = 1
    _NESTED_IN_STEP = 2
    _OUTSIDE = 3

    def __init__(self, name: str) -> None:
        self._name = name
        self._mode = self._SKIP
        self._st: Step | None = None
        self._ev: Any = None
        self._t0 = 0

    def __enter__(self) -> None:
        try:
            self._enter()
        except Exception:
            self._mode = self._SKIP
            fault()
        self._t0 = perf_ns()

    def _enter(self) -> None:
        name = self._name
        st = OPEN
        if st is not None and st.thread == thread_id():
            depth = st.region_depth.get(name, 0)
            st.region_depth[name] = depth + 1
            self._st = st
            if depth:
                self._mode = self._NESTED_IN_STEP
                return
            self._mode = self._IN_STEP
            self._ev = st.mark()
            return
        opened = PRE.open_regions
        if name in opened:
            self._mode = self._SKIP
            return
        opened.add(name)
        self._mode = self._OUTSIDE

    def __exit__(self, *exc_info: object) -> None:
        cpu = perf_ns() - self._t0
        try:
            self._exit(cpu)
        except Exception:
            fault()

    def _exit(self, cpu: int) -> None:
        name = self._name
        mode = self._mode
        if mode == self._SKIP:
            return
        began_in = self._st
        if began_in is not None:
            began_in.region_depth[name] = began_in.region_depth.get(name, 1) - 1
            if mode == self._NESTED_IN_STEP:
                return
            if OPEN is began_in:
                began_in.add(name, cpu, self._ev)
                return
            began_in.release(self._ev)
        else:
            PRE.open_regions.discard(name)
        st = OPEN
        if st is not None and st.thread == thread_id():
            st.add(name, cpu, None)
            return
        regions = pending().regions
        stats = regions.get(name)
        if stats is None:
            stats = regions[name] = PhaseStats()
        stats.add(cpu, None)


def _gpu_sum(pairs: list[tuple[Any, Any]]) -> float | None:
    total = 0.0
    for start, end in pairs:
        try:
            if not (end.query() and start.query()):
                return None
            total += float(start.elapsed_time(end))
        except RuntimeError:
            # An event recorded on another device than its pair, or a CUDA error: not measured.
            return None
    return total


# Phase names, re-exported so the patches (and the SDK, which may not import telemetry) need no second import.
PHASE_PREFIX = schema.PHASE_PREFIX
DATALOADER_NEXT = schema.DATALOADER_NEXT
H2D = schema.H2D
FORWARD = schema.FORWARD
BACKWARD = schema.BACKWARD
OPTIMIZER_STEP = schema.OPTIMIZER_STEP
STEP = schema.STEP
