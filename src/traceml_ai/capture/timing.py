"""Phase timers of one training step: CPU wall clock plus pooled CUDA events (DESIGN §3.1).

This module holds the *state* that the patches of :mod:`traceml_ai.capture.instrument` and the
step tracer of :mod:`traceml_ai.capture.steps` share, and the two clocks:

- **CPU**: ``time.perf_counter_ns`` around each call, summed per phase (``cpu_ms``).
- **GPU** (CUDA steps only): a pair of ``torch.cuda.Event(enable_timing=True)`` recorded before
  and after the call on the stream that was current on the step's device when the step opened
  (:class:`EventPool`). The training thread only records
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
outside a step (:class:`RegionScope`). Nothing in this module imports torch at import time.
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

    ``record`` and ``put`` are safe from the training and the sampler thread at once
    (``list.pop`` and ``list.append`` are atomic). An event handed back while still pending on the
    GPU may be recorded again: CUDA overwrites an event's state on every record.

    Events are recorded on :attr:`stream`, which the tracer sets to the device's current stream
    when a step opens (asking for the current stream on every record would cost more than the
    record): work that a step sends to another stream is timed as the step's stream sees it.

    Args:
        device_index: the CUDA device of the events.
    """

    __slots__ = ("_event_cls", "_free", "_record", "created", "device_index", "stream")

    def __init__(self, device_index: int) -> None:
        import torch

        self.device_index = device_index
        self._free: list[Any] = []
        self._event_cls: Any = torch.cuda.Event
        # The C method itself: torch.cuda.Event.record is a Python wrapper that looks the current
        # stream up again when none is given.
        self._record: Any = torch._C._CudaEventBase.record
        self.stream: Any = torch.cuda.current_stream(device_index)
        self.created = 0

    def refresh_stream(self) -> None:
        """Takes the device's current stream as the one later events are recorded on."""
        import torch

        self.stream = torch.cuda.current_stream(self.device_index)

    def record(self) -> Any:
        """An event recorded now on :attr:`stream` (never blocks)."""
        try:
            event = self._free.pop()
        except IndexError:
            event = self._event_cls(enable_timing=True)
            self.created += 1
        self._record(event, self.stream)
        return event

    def put(self, event: Any) -> None:
        """Hands ``event`` back for reuse."""
        self._free.append(event)


def add_call(phases: dict[str, list[Any]], name: str, cpu_ns: int, pair: tuple[Any, Any] | None) -> None:
    """Adds one call of phase ``name`` to ``phases``.

    A phase's calls within one step are a 3-item list (the training thread's hot path makes one per
    phase per step, and a list costs less than an object): ``[n_calls, cpu_ns, pairs]``, the GPU event
    pairs being None until a call brings one. ``gpu_ms`` is measured only when every call brought a
    pair, that is ``len(pairs) == n_calls`` (000 seed, StepTimeRecord)."""
    entry = phases.get(name)
    if entry is None:
        phases[name] = [1, cpu_ns, None if pair is None else [pair]]
        return
    entry[0] += 1
    entry[1] += cpu_ns
    if pair is not None:
        if entry[2] is None:
            entry[2] = [pair]
        else:
            entry[2].append(pair)


class Step:
    """One traced step: open on :attr:`thread` while the block runs, then closed and handed to the
    sources, which read its GPU events on the sampler thread.

    Args:
        step: the step number.
        device: the step's device key in the events map, ``"cpu"`` or ``"cuda:<index>"``.
        pool: the device's :class:`EventPool` on a CUDA step, None on a CPU step (no GPU clock).
        info: what the tracer knows of the step's model (its forward timers), or None.

    Timer state of calls in progress (``forward_depth`` …) lives in class-level defaults that a
    step overrides only when it uses them: opening a step is on the training thread's hot path.
    """

    # Defaults, shadowed per instance when set (see the class docstring).
    t0 = 0
    ev0: Any = None
    timers: Any = None  # the forward timers attached while the step is open
    forward_depth = 0
    forward_t0 = 0
    forward_ev: Any = None
    backward_depth = 0
    optimizer_depth = 0
    optimizer_id = 0  # id() of the optimizer whose step is running at depth 1 (instrument._optimizer_pre)
    optimizer_t0 = 0
    optimizer_ev: Any = None
    h2d_depth = 0
    # Forward/backward run *inside* optimizer.step(closure) in Lightning and with LBFGS: their time
    # is taken out of the optimizer step so that phases never count the same time twice.
    nested_ns = 0  # CPU ns of forward/backward calls made inside an optimizer step
    optimizer_nested0 = 0  # nested_ns when the current optimizer step began
    nested_pairs: list[Any] | None = None  # their GPU event pairs
    optimizer_pairs0 = 0
    gpu_exclusions: list[Any] | None = None  # GPU pairs to subtract from the optimizer step's GPU time
    region_depth: dict[str, int] | None = None
    end_unix_ns = 0
    closed_perf_ns = 0
    _released = False
    # An optimizer update ran in the step (optimizer.step returned, or GradScaler.step was called):
    # a step with backward and no update is one micro-batch of gradient accumulation (steps.StepTracer).
    updated = False
    requested: int | None = None  # the step number given to trace_step(..., step=N), else None
    raised = False  # its block raised: held in a group only to keep its place (steps.StepTracer._discard)
    alloc: float | None = None  # the step's peak allocated / reserved bytes (CUDA), read at close
    reserved: float | None = None

    def __init__(self, step: int, device: str, pool: EventPool | None, info: Any) -> None:
        self.step = step
        self.device = device
        self.pool = pool
        self.info = info
        self.thread = thread_id()
        self.phases: dict[str, list[Any]] = {}  # name -> [n_calls, cpu_ns, pairs] (add_call)

    # -- training thread, while open ---------------------------------------------------------------

    def mark(self) -> Any:
        """A start event on a CUDA step (record it *before* reading the CPU clock), else None."""
        pool = self.pool
        return None if pool is None else pool.record()

    def add(self, name: str, cpu_ns: int, ev0: Any) -> None:
        """Adds one call of phase ``name``: ``cpu_ns`` of wall time and, when ``ev0`` is an event,
        the (``ev0``, end event recorded now) pair. Read the CPU clock *before* calling this."""
        entry = self.phases.get(name)
        if ev0 is None:
            if entry is None:
                self.phases[name] = [1, cpu_ns, None]
            else:
                entry[0] += 1
                entry[1] += cpu_ns
            return
        assert self.pool is not None
        add_call(self.phases, name, cpu_ns, (ev0, self.pool.record()))

    def add_nested(self, name: str, cpu_ns: int, ev0: Any) -> None:
        """:meth:`add` for a forward/backward call; inside an optimizer step it is also remembered,
        so that the optimizer step's own time excludes it."""
        self.add(name, cpu_ns, ev0)
        if self.optimizer_depth > 0:
            self.nested_ns += cpu_ns
            if ev0 is not None:
                if self.nested_pairs is None:
                    self.nested_pairs = []
                self.nested_pairs.append(self.phases[name][2][-1])

    def release(self, event: Any) -> None:
        """Hands back a start event whose call is not counted."""
        if event is not None and self.pool is not None:
            self.pool.put(event)

    # -- sampler thread, once closed ---------------------------------------------------------------

    def gpu_ready(self) -> bool:
        """True when every GPU event of the step has completed (``event.query()``, never blocks)."""
        for _n, _cpu, pairs in self.phases.values():
            for start, end in pairs or ():
                if not (end.query() and start.query()):
                    return False
        return True

    def cpu_events(self) -> dict[str, dict[str, dict[str, Any]]]:
        """:meth:`events` of a CPU step (no GPU events: every phase has ``gpu_ms`` None)."""
        device = self.device
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, entry in self.phases.items():
            ms = entry[1] / 1e6
            out[name] = {
                device: {"is_gpu": False, "duration_ms": ms, "cpu_ms": ms, "gpu_ms": None, "n_calls": entry[0]}
            }
        return out

    def events(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The step's ``events`` map (DESIGN §3.1): ``{name: {device: {is_gpu, duration_ms,
        cpu_ms, gpu_ms, n_calls}}}`` in ms. A phase gets ``gpu_ms`` only if every call of it
        brought events that have all completed; otherwise ``gpu_ms`` is None, ``is_gpu`` False
        and ``duration_ms`` is ``cpu_ms``. Hands the events back to the pool."""
        device = self.device
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, (n_calls, cpu_ns, pairs) in self.phases.items():
            cpu_ms = cpu_ns / 1e6
            gpu_ms = _gpu_sum(pairs) if pairs is not None and len(pairs) == n_calls else None
            if gpu_ms is not None and name == OPTIMIZER_STEP and self.gpu_exclusions:
                nested = _gpu_sum(self.gpu_exclusions)
                gpu_ms = None if nested is None else max(0.0, gpu_ms - nested)
            if gpu_ms is None:
                stats = {"is_gpu": False, "duration_ms": cpu_ms, "cpu_ms": cpu_ms, "gpu_ms": None, "n_calls": n_calls}
            else:
                stats = {"is_gpu": True, "duration_ms": gpu_ms, "cpu_ms": cpu_ms, "gpu_ms": gpu_ms, "n_calls": n_calls}
            out[name] = {device: stats}
        if self.pool is not None:
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
        for _n, _cpu, pairs in self.phases.values():
            for start, end in pairs or ():
                pool.put(start)
                pool.put(end)


class PreStep:
    """Work on one thread while no step is open there, waiting for that thread's next step.

    One per thread (:func:`pending`; a plain object reached through one thread-local read, since
    every attribute read of a ``threading.local`` costs a lookup of the thread's dict).
    ``fetch`` is the DataLoader wait since the last step as ``(t0_ns, cpu_ns, start_event, pool,
    iterator_id, n_fetches)``: consecutive fetches of one iterator add up (from the first one's
    start); a fetch of another iterator replaces them (a validation loop between two steps leaves
    only its fetches, which the next training fetch then replaces). ``regions`` sums the ``trace_region`` calls that
    ended outside a step, CPU clock only; ``open_regions`` names the regions open outside a step.
    ``generation`` is the :data:`GENERATION` the pending work belongs to: a new tracer (a new capture
    session) does not inherit what was pending for the previous one.
    """

    __slots__ = ("fetch", "generation", "open_regions", "regions")

    def __init__(self) -> None:
        self.generation = 0
        self.fetch: tuple[int, int, Any, EventPool | None, int, int] | None = None
        self.regions: dict[str, list[Any]] = {}  # name -> [n_calls, cpu_ns, pairs] (add_call)
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

UPDATE_OUTSIDE: Any = None
"""``callable(cpu_ns, thread_id)`` the step tracer sets: an optimizer update (``optimizer.step`` or
``GradScaler.step``) that ended while no step was open on that thread, so that the micro-batches
traced before it become its step (gradient accumulation with the update outside ``trace_step``)."""

OUTSIDE_HELD: Any = None
"""``callable(thread_id) -> mark`` the step tracer sets: what it holds for that thread when an optimizer
step begins outside any step (the micro-batches of the update that step ends)."""

UPDATE_RAISED: Any = None
"""``callable(thread_id, mark)`` the step tracer sets: the optimizer step outside any step that began at
``mark`` (:data:`OUTSIDE_HELD`) raised, so the micro-batches held then were an update that never
happened: discarded whole and counted, and those traced since belong to the next update."""

FETCH_POOL: EventPool | None = None
"""Pool of the last CUDA step's device: a pre-step fetch records its start event there, because
``traceml:step`` on that device begins where the fetch of its batch began."""

GENERATION: int = 0
"""Bumped by every new step tracer; pending pre-step work of an older generation is discarded."""

PER_THREAD = threading.local()
"""``PER_THREAD.pre`` is the calling thread's :class:`PreStep` (absent until :func:`pending` makes it)."""


def pending() -> PreStep:
    """This thread's pre-step work, emptied first if it belongs to an older tracer."""
    try:
        pre: PreStep = PER_THREAD.pre
    except AttributeError:
        pre = PER_THREAD.pre = PreStep()
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
    pre.fetch = (t0_ns, cpu_ns, event, pool, 0, 1)


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
            depths = st.region_depth
            if depths is None:
                depths = st.region_depth = {}
            depth = depths.get(name, 0)
            depths[name] = depth + 1
            self._st = st
            if depth:
                self._mode = self._NESTED_IN_STEP
                return
            self._mode = self._IN_STEP
            self._ev = st.mark()
            return
        opened = pending().open_regions
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
            depths = began_in.region_depth
            if depths is not None:
                depths[name] = depths.get(name, 1) - 1
            if mode == self._NESTED_IN_STEP:
                return
            if OPEN is began_in:
                began_in.add(name, cpu, self._ev)
                return
            began_in.release(self._ev)
        else:
            pending().open_regions.discard(name)
        st = OPEN
        if st is not None and st.thread == thread_id():
            st.add(name, cpu, None)
            return
        add_call(pending().regions, name, cpu, None)


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
