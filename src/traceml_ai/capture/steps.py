"""Training steps as telemetry: the step tracer and the ``step_time`` / ``step_memory`` row sources.

The :class:`StepTracer` opens and closes steps on the training thread (``trace_step`` in
:mod:`traceml_ai.sdk.tracing` drives it) and hands each closed step to two :class:`RowSource`\\ s
that the capture session's sampler thread collects (DESIGN §3.1):

- :class:`StepTimeSource`, stream ``step_time``, rows ``{seq, timestamp_unix_ns, step, events}``
  with ``events[name][device] = {is_gpu, duration_ms, cpu_ms, gpu_ms, n_calls}``;
- :class:`StepMemorySource`, stream ``step_memory``, rows ``{seq, timestamp_unix_ns, device, step,
  peak_alloc_bytes, peak_reserved_bytes}``; on CPU one row per step with device ``"cpu"`` and null
  peaks.

``timestamp_unix_ns`` is when the step closed; ``seq`` is the tick of the collect that sent the row
(one tick can carry many steps, so rows are keyed on ``step``, 000 seed). Steps are numbered 0, 1,
2, … in the order they are handed over, unless ``trace_step(..., step=N)`` sets the number (later
steps then continue from N + 1).

One step per optimizer update (:class:`StepTracer`): a traced block that ran backward but no
optimizer update (``optimizer.step`` or ``GradScaler.step``) is a micro-batch of gradient
accumulation and waits; the block with the update, or an update right after the block outside any
step, ends the group, whose micro-batches become one step (phases summed: calls, CPU time, GPU
event pairs; peaks the highest; ``traceml:step``'s ``n_calls`` = micro-batches). Micro-batches still
waiting at the session's end are an incomplete update: dropped and counted. A block that raised is
discarded whole (no row; its number, or its update's, is not reused) and counted. Until a first
update is seen at most :data:`MAX_UNCONFIRMED_MICRO_BATCHES` blocks wait; a loop with no optimizer
update then has every block as a step. The counts go in one ``[TraceML]`` note at the end.

Hand-off: each source holds a bounded deque that the training thread appends to without a lock
(``deque.append``/``popleft`` are atomic); when it is full the oldest step is dropped and counted
(``dropped_steps``/``dropped_rows``). A step whose GPU events have not completed stays queued for a
later collect (rows leave in step order); after ``gpu_wait_s`` it is sent anyway with ``gpu_ms``
None for its unfinished phases. :meth:`StepTimeSource.collect_final` (the session's last look at
shutdown) waits up to 2 s, polling on the sampler thread, for the GPU events still pending.

``traceml:step`` spans one iteration: from the start of the DataLoader fetch attributed to the step
(the ``next()`` just before ``with trace_step(...)``) to the end of the ``with`` block, so
``dataloader_next / step`` is the share of the iteration spent waiting for data.

Notes: things the run should show about how it was measured (a ``torch.compile``'d model timed
without forward, a model whose forward could not be found or hooked, a nested ``trace_step``
ignored, bookkeeping faults) go to :attr:`StepTracer.notes`, a list of strings that both sources
expose as their ``notes`` attribute (the same list object), and each is printed once on stderr as
a ``[TraceML]`` line.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from traceml_ai.capture import instrument
from traceml_ai.capture import timing as T
from traceml_ai.capture.client import warn
from traceml_ai.capture.samplers.runtime_environment import note_model
from traceml_ai.capture.timing import EventPool, RegionScope, Step, perf_ns, thread_id
from traceml_ai.telemetry import schema

DEFAULT_MAX_STEPS = 4096
"""Closed steps a source holds between two collects; at 1 ms a step that is 4 s of steps."""

MAX_UNCONFIRMED_MICRO_BATCHES = 64
"""Steps with backward and no optimizer update held before the first update is seen; beyond it the
tracer stops grouping (a loop that updates parameters without ``torch.optim``)."""

DEFAULT_GPU_WAIT_S = 60.0
"""How long a step waits for its GPU events before it is sent with ``gpu_ms`` None."""


class StepTimeSource:
    """Row source of stream ``step_time`` (DESIGN §3.1, 000 seed StepTimeRecord).

    Args:
        max_steps: closed steps held between collects; beyond it the oldest is dropped and counted
            in ``dropped_steps``.
        gpu_wait_s: seconds a step may wait for its CUDA events before it is sent with ``gpu_ms``
            None for the phases whose events had not completed.
        notes: the list that :attr:`notes` exposes (the tracer's), or a new one.
    """

    stream = schema.STEP_TIME

    def __init__(
        self,
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        gpu_wait_s: float = DEFAULT_GPU_WAIT_S,
        notes: list[str] | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps
        self.gpu_wait_ns = int(gpu_wait_s * 1e9)
        self.notes: list[str] = notes if notes is not None else []
        self._dropped_full = 0  # written by the training thread only
        self._dropped_waiting = 0  # written by the sampler thread only
        self._queue: deque[Step] = deque()
        self._waiting: deque[Step] = deque()  # sampler thread only
        self.before_final: Callable[[], None] | None = None  # the tracer's finish, run first by collect_final
        self.step_counts: Callable[[], dict[str, int]] | None = None  # the tracer's step_counts (see there)

    @property
    def dropped_steps(self) -> int:
        """Steps lost because the hand-off queue was full, or their GPU events never came."""
        return self._dropped_full + self._dropped_waiting

    def lost_rows(self) -> int:
        """Rows of ``step_time`` lost (:attr:`dropped_steps`; see ``RowSource``)."""
        return self.dropped_steps

    def put(self, finished: Step) -> None:
        """Hands a closed step over (training thread; O(1), takes no lock).

        ``deque.append``/``popleft`` are atomic, so the sampler may drain the queue meanwhile; a
        full queue drops its oldest step (counted).
        """
        queue = self._queue
        if len(queue) >= self.max_steps:
            try:
                queue.popleft().release_events()
                self._dropped_full += 1
            except IndexError:
                pass
        queue.append(finished)

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        """Rows of the steps whose GPU timings are known (or waited ``gpu_wait_s``), in step order."""
        return self._rows(seq, give_up=False)

    def collect_final(self, seq: int, now_ns: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """Every step still held, as rows, after waiting up to ``timeout_s`` for GPU events.

        The session's last look at shutdown: training has stopped, so its last GPU work finishes
        soon. Polls ``event.query()`` (the sampler thread waits; the GPU is never synchronized);
        steps whose events are still pending at the deadline get ``gpu_ms`` None.
        """
        finisher = self.before_final
        if finisher is not None:
            self.before_final = None
            try:
                finisher()
            except Exception as exc:
                warn(f"step grouping at shutdown failed: {exc!r}")
        deadline = time.monotonic() + max(0.0, timeout_s)
        rows = self._rows(seq, give_up=False)
        while self._pending() and time.monotonic() < deadline:
            time.sleep(0.002)
            rows.extend(self._rows(seq, give_up=False))
        rows.extend(self._rows(seq, give_up=True))
        self._note_orphan_regions()
        return rows

    def _note_orphan_regions(self) -> None:
        """``trace_region`` blocks that ended after the last step on the closing thread (usually the
        training's main thread, where the session closes at exit) wait for a step that never comes:
        say so instead of dropping them silently."""
        pre = getattr(T.PER_THREAD, "pre", None)
        if pre is None or pre.generation != T.GENERATION or not pre.regions:
            return
        calls = sum(int(entry[0]) for entry in pre.regions.values())
        names = ", ".join(sorted(pre.regions))
        pre.regions = {}
        self.notes.append(
            f"{calls} trace_region block(s) ({names}) ended after the last traced step: they belong to no "
            "step and are not in the step rows"
        )
        warn(self.notes[-1])

    def _pending(self) -> bool:
        return bool(self._queue) or bool(self._waiting)

    def _rows(self, seq: int, *, give_up: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        queue = self._queue
        waiting = self._waiting
        if not waiting:
            # CPU steps need no wait: their rows are built straight from the hand-off queue, up to
            # the first step that has GPU events.
            append = rows.append
            while True:
                try:
                    finished = queue.popleft()
                except IndexError:
                    return rows
                if finished.pool is not None:
                    waiting.append(finished)
                    break
                try:
                    events = finished.cpu_events()
                except Exception:
                    self._dropped_waiting += 1
                    continue
                append({"seq": seq, "timestamp_unix_ns": finished.end_unix_ns, "step": finished.step, "events": events})
        _drain(queue, waiting)
        while len(waiting) > self.max_steps:  # GPU stuck: bound what waits too
            waiting.popleft().release_events()
            self._dropped_waiting += 1
        now = perf_ns()
        while waiting:
            finished = waiting[0]
            if not give_up and finished.pool is not None and now - finished.closed_perf_ns < self.gpu_wait_ns:
                try:
                    ready = finished.gpu_ready()
                except RuntimeError:
                    ready = True  # a CUDA error: its GPU times will read as not measured
                if not ready:
                    break
            waiting.popleft()
            try:
                events = finished.events()
            except Exception:
                finished.release_events()
                self._dropped_waiting += 1
                continue
            rows.append(
                {"seq": seq, "timestamp_unix_ns": finished.end_unix_ns, "step": finished.step, "events": events}
            )
        return rows


def _drain(source: deque[Any], into: deque[Any]) -> None:
    """Moves every item of ``source`` to ``into`` in order, safe against a concurrent ``append``."""
    while True:
        try:
            into.append(source.popleft())
        except IndexError:
            return


class StepMemorySource:
    """Row source of stream ``step_memory`` (DESIGN §3.1, 000 seed StepMemoryRecord).

    One row per step: ``device`` (``"cpu"`` or ``"cuda:<index>"``), ``peak_alloc_bytes`` and
    ``peak_reserved_bytes`` (bytes, float; None on CPU or when the user reset the peaks during the
    step). Peaks are read on the training thread at step close, so rows are ready at once.

    Args:
        max_rows: rows held between collects; beyond it the oldest is dropped and counted in
            ``dropped_rows``.
        notes: the list that :attr:`notes` exposes (the tracer's), or a new one.
    """

    stream = schema.STEP_MEMORY

    def __init__(self, *, max_rows: int = DEFAULT_MAX_STEPS, notes: list[str] | None = None) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.max_rows = max_rows
        self.notes: list[str] = notes if notes is not None else []
        self.dropped_rows = 0  # written by the training thread only (see lost_rows)
        self._queue: deque[tuple[int, str, int, float | None, float | None]] = deque()

    def put(
        self, step: int, device: str, end_unix_ns: int, peak_alloc: float | None, peak_reserved: float | None
    ) -> None:
        """Hands one step's peaks over (training thread; O(1), takes no lock)."""
        queue = self._queue
        if len(queue) >= self.max_rows:
            try:
                queue.popleft()
                self.dropped_rows += 1
            except IndexError:
                pass
        queue.append((step, device, end_unix_ns, peak_alloc, peak_reserved))

    def lost_rows(self) -> int:
        """Rows of ``step_memory`` dropped because the hand-off queue was full (see ``RowSource``)."""
        return self.dropped_rows

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        """Rows of every step closed since the last collect, in step order."""
        rows: list[dict[str, Any]] = []
        append = rows.append
        pop = self._queue.popleft
        while True:
            try:
                step, device, end_ns, alloc, reserved = pop()
            except IndexError:
                return rows
            append({
                "seq": seq,
                "timestamp_unix_ns": end_ns,
                "device": device,
                "step": step,
                "peak_alloc_bytes": alloc,
                "peak_reserved_bytes": reserved,
            })



MAX_FORWARD_SEARCH_DEPTH = 3
"""How many levels below the model the search for its outermost module calls goes (see StepTracer)."""


class _ModelInfo:
    """What the tracer knows of one model: its first parameter (the step's device) and the modules
    whose forward is timed (``targets``: the model, then one level deeper per search step)."""

    __slots__ = ("compiled", "first_param", "forward_seen", "frontier", "level", "targets", "timers")

    def __init__(self, model: Any, first_param: Any, compiled: str | None) -> None:
        self.first_param = first_param
        self.compiled = compiled
        self.targets: list[Any] = [] if compiled is not None else [model]
        self.frontier: list[Any] = list(self.targets)  # the deepest level timed so far
        self.level = 0
        self.forward_seen = False
        self.timers: list[instrument.ForwardTimer] = []  # one per target that can be timed
        self.set_targets(self.targets)

    def set_targets(self, targets: list[Any]) -> None:
        """The forward of these modules is timed from the next step on; a module that cannot be
        timed (no hook dicts, scripted) is skipped. Targets kept from before keep their timer."""
        kept = {id(timer.module): timer for timer in self.timers}
        self.targets = targets
        timers = []
        for target in targets:
            timer = kept.get(id(target)) or instrument.forward_timer(target)
            if timer is not None:
                timers.append(timer)
        self.timers = timers


def _dead() -> None:
    return None


class StepTracer:
    """Opens and closes training steps on the training thread and feeds the two sources.

    Use :func:`traceml_ai.trace_step` in training code; this class is what it drives, and what tests
    and integrations can use without a capture session::

        tracer = StepTracer()
        for x, y in loader:
            with tracer.step(model):
                ...
        rows = tracer.time_source.collect(seq=0, now_ns=time.time_ns())

    Only one step is open at a time in the process: a ``step()`` while one is open (nested, or on
    another thread) is ignored, with a note, and its block runs untimed. Never raises into the
    training: a failure of TraceML's own bookkeeping leaves the step untimed and is noted.

    Forward: the outermost calls of the model given to the step. When a step runs backward
    without calling the model (``training_step`` code that calls ``self.net(x)``), the next steps
    also hook the model's children, one level deeper per such step, at most
    :data:`MAX_FORWARD_SEARCH_DEPTH` levels; the first step(s) of such a run have no forward.

    Args:
        max_steps: bound of each source's hand-off queue (see :class:`StepTimeSource`).
        gpu_wait_s: bounded wait for a step's CUDA events.
        echo_notes: print each new note once on stderr as a ``[TraceML]`` line.
    """

    def __init__(
        self, *, max_steps: int = DEFAULT_MAX_STEPS, gpu_wait_s: float = DEFAULT_GPU_WAIT_S, echo_notes: bool = True
    ) -> None:
        self.notes: list[str] = []
        self.echo_notes = echo_notes
        self.time_source = StepTimeSource(max_steps=max_steps, gpu_wait_s=gpu_wait_s, notes=self.notes)
        self.memory_source = StepMemorySource(max_rows=max_steps, notes=self.notes)
        self.steps_closed = 0
        self.discarded_steps = 0
        self.failed_steps = 0  # steps whose timing failed (TraceML's fault): no row, counted as a loss
        self.dropped_groups = 0
        self.dropped_micro_batches = 0
        self.micro_batches: dict[int, int] = {}  # micro-batches per update -> updates
        self._group: list[Step] = []  # micro-batches waiting for their optimizer update
        self._group_tainted = False
        self._updates_seen = False
        self._plain = False
        self._grouping_noted = False
        self._next_step = 0
        self._lock = threading.Lock()
        self._note_keys: set[str] = set()
        self._pools: dict[int, EventPool] = {}
        self._models: weakref.WeakKeyDictionary[Any, _ModelInfo] = weakref.WeakKeyDictionary()
        self._last_model: Callable[[], Any] = _dead  # weak reference to the last step's model
        self._last_info: _ModelInfo | None = None
        self._faults_noted = 0
        self._torch: Any = None
        T.GENERATION += 1
        T.UPDATE_OUTSIDE = self.update_outside
        T.OUTSIDE_HELD = self.held_on
        T.UPDATE_RAISED = self.update_raised
        self.time_source.before_final = self.finish
        self.time_source.step_counts = self.step_counts

    # -- notes -----------------------------------------------------------------------------------

    def note(self, key: str, text: str) -> None:
        """Adds ``text`` to :attr:`notes` once per ``key`` and echoes it on stderr."""
        with self._lock:
            if key in self._note_keys:
                return
            self._note_keys.add(key)
            self.notes.append(text)
        if self.echo_notes:
            warn(text)

    # -- steps -----------------------------------------------------------------------------------

    def step(self, model: Any = None, *, step: int | None = None) -> StepScope:
        """A context manager around one training step of ``model`` (see :meth:`open`)."""
        return StepScope(self, model, step)

    def region(self, name: str) -> RegionScope:
        """A context manager timing the user's phase ``name`` (see ``trace_region``)."""
        return RegionScope(name)

    def open(self, model: Any = None, step: int | None = None) -> Step | None:
        """Opens a step on this thread; returns it, or None when it is ignored (one already open).

        Args:
            model: the ``torch.nn.Module`` of the step (its outermost calls are the forward phase,
                its first parameter's device the step's device), or None.
            step: the step number; None continues from the last one.
        """
        if T.OPEN is not None:
            self._refuse()
            return None
        # The training thread's hot path (once per step): kept to plain statements on a CPU step.
        try:
            if not instrument._installed:
                instrument.install()
            if not instrument.DYNAMO and "torch._dynamo" in sys.modules:
                instrument.watch_compiler()
            T.TRACING = True
            if model is None:
                info = None
                param = None
            else:
                info = self._last_info if self._last_model() is model else self._model_info(model)
                param = None if info is None else info.first_param
            pool: EventPool | None = None
            if param is not None and not param.is_cuda:
                device = "cpu" if param.is_cpu else str(param.device.type)
            else:
                pool, device = self._cuda_pool(param)
            T.FETCH_POOL = pool
            requested = None if step is None else int(step)
            st = Step(-1 if requested is None else requested, device, pool, info)
            st.requested = requested
            try:
                self._begin(st, info, pool)
            except BaseException:
                self._detach(st)
                raise
            T.OPEN = st
            return st
        except Exception as exc:
            T.OPEN = None
            self._failed(exc, step)
            return None

    def close(self, st: Step, raised: bool = False) -> None:
        """Closes ``st`` (opened by :meth:`open` on this thread) and hands it to the sources.

        ``raised``: the step's block ended by an exception; the step is discarded whole (no row, its
        number not reused) and counted in :attr:`discarded_steps` (class docstring).
        """
        t_end = perf_ns()
        if T.OPEN is st:
            T.OPEN = None
        numbered = self._next_step
        # The training thread's hot path (once per step): kept to plain statements on a CPU step.
        try:
            pool = st.pool
            ev_end = None if pool is None else pool.record()
            timers = st.timers
            if timers is not None:
                st.timers = None
                for timer in timers:
                    timer.detach()
                if not st.info.forward_seen:
                    self._search_forward(st)
            alloc: float | None = None
            reserved: float | None = None
            if pool is None:
                st.phases[T.STEP] = [1, t_end - st.t0, None]
            else:
                # Timers left open by an exception (an optimizer step that raised): not counted.
                st.release(st.forward_ev)
                st.release(st.optimizer_ev)
                st.phases[T.STEP] = [1, t_end - st.t0, [(st.ev0, ev_end)]]
                alloc, reserved = instrument.PEAKS.end(pool.device_index)
            st.end_unix_ns = time.time_ns()
            st.closed_perf_ns = t_end
            st.alloc = alloc
            st.reserved = reserved
            if raised:
                self._discard(st)
            elif st.updated:
                if self._group:
                    group = self._group
                    group.append(st)
                    self._group = []
                    self._complete(group)
                else:
                    # An update of one micro-batch (every step without accumulation, or the last,
                    # short group of an epoch, as Lightning ends one): counted like the others.
                    self.micro_batches[1] = self.micro_batches.get(1, 0) + 1
                    self._emit(st)
                self._updates_seen = True
            elif T.BACKWARD in st.phases and not self._plain:
                self._hold(st)
            else:
                if self._group and not self._updates_seen:
                    self._release_group()  # no update came before a step without backward: no accumulation
                self._emit(st)
            if T.FAULTS != self._faults_noted:
                self._faults_noted = T.FAULTS
                self.note("faults", "some phase timings failed and were left out (TraceML bookkeeping fault)")
        except Exception as exc:
            self._failed(exc, st.requested, numbered=self._next_step != numbered)

    def _failed(self, exc: Exception, requested: int | None, *, numbered: bool = False) -> None:
        """A step whose timing failed (a fault of TraceML's, never the training's): no row; counted
        in :attr:`failed_steps` (the ``rank_finished`` frame's ``failed_steps``, a loss in
        finalization_warning.json) and said once per kind of error, then in the note at the end.
        Like a step that raised, it keeps its number (``requested``, or the next one; not when it
        was ``numbered`` already): the rows after it keep the numbers of their iterations, in step
        with the other ranks (review 11f). With gradient accumulation the update's number is taken
        when the update completes."""
        with self._lock:
            self.failed_steps += 1
            if not numbered and not self._group and not any(size > 1 for size in self.micro_batches):
                self._next_step = (self._next_step if requested is None else requested) + 1
        self.note(f"fault:{type(exc).__name__}", f"step timing failed and was skipped for a step: {exc!r} "
                  "(further failures are counted and said at the end)")

    # -- one step per optimizer update --------------------------------------------------------------

    def _emit(self, st: Step) -> None:
        """Numbers ``st`` and hands it to both sources (their common case, room in the queue, inline)."""
        requested = st.requested
        number = self._next_step if requested is None else requested
        if requested is not None and requested < self._next_step:
            # (review 11f: step=0 on every step gave rows all numbered 0, without a word)
            self.note("step-order", f"trace_step(step={requested}) repeats or goes back from step "
                      f"{self._next_step - 1}: the diagnosis and the viewer keep one row per rank and step "
                      "number (the last written)")
        self._next_step = number + 1
        st.step = number
        source = self.time_source
        queue = source._queue
        if len(queue) < source.max_steps:
            queue.append(st)
        else:
            source.put(st)
        memory = self.memory_source
        item = (number, st.device, st.end_unix_ns, st.alloc, st.reserved)
        if len(memory._queue) < memory.max_rows:
            memory._queue.append(item)
        else:
            memory.put(*item)
        self.steps_closed += 1

    def _hold(self, st: Step) -> None:
        """A micro-batch (backward, no update yet): it waits for the update that ends its group."""
        group = self._group
        group.append(st)
        if not self._updates_seen and len(group) >= MAX_UNCONFIRMED_MICRO_BATCHES:
            # No optimizer update in sight (a hand-written parameter update, or none at all): every
            # traced block is a step of its own, from here on.
            self._plain = True
            self._release_group()
            self.note(
                "plain",
                f"no optimizer step was seen in the first {len(group)} traced steps that ran backward: each "
                "trace_step is counted as one step (no gradient-accumulation grouping)",
            )

    def _release_group(self) -> None:
        """Emits the held steps one by one (they were not micro-batches of an update)."""
        group, self._group = self._group, []
        self._group_tainted = False
        for held in group:
            if held.raised:
                self._next_step = (self._next_step if held.requested is None else held.requested) + 1
                self.discarded_steps += 1
            else:
                self._emit(held)

    def _complete(self, group: list[Step]) -> None:
        """Merges the micro-batches of one optimizer update into one step and emits it.

        Phases are summed (calls, CPU time, GPU event pairs), the peaks are the highest (None when a
        micro-batch has none), the end is the last micro-batch's. ``traceml:step``'s ``n_calls`` is
        then the number of micro-batches the step held.
        """
        if self._group_tainted:
            self._group_tainted = False
            # A micro-batch that raised may have been the last of an update that then never reached
            # its optimizer step: the group holds that update and the next. Only the update(s) that
            # raised are discarded; a clean one after them is a step like any other.
            for part in self._updates_in(group):
                if any(held.raised for held in part):
                    self._discard_update(part)
                else:
                    self._complete(part)
            return
        head = group[0]
        if len(group) > 1:
            phases = head.phases
            alloc = head.alloc
            reserved = head.reserved
            for other in group[1:]:
                for name, (n_calls, cpu_ns, pairs) in other.phases.items():
                    entry = phases.get(name)
                    if entry is None:
                        phases[name] = [n_calls, cpu_ns, None if pairs is None else list(pairs)]
                        continue
                    entry[0] += n_calls
                    entry[1] += cpu_ns
                    if pairs:
                        entry[2] = [*(entry[2] or ()), *pairs]
                if other.gpu_exclusions:
                    head.gpu_exclusions = [*(head.gpu_exclusions or ()), *other.gpu_exclusions]
                other._released = True  # its events are the head's now
                alloc = None if alloc is None or other.alloc is None else max(alloc, other.alloc)
                reserved = None if reserved is None or other.reserved is None else max(reserved, other.reserved)
            last = group[-1]
            head.alloc, head.reserved = alloc, reserved
            head.end_unix_ns = last.end_unix_ns
            head.closed_perf_ns = last.closed_perf_ns
            if not self._grouping_noted:
                self._grouping_noted = True
                self.note(
                    "accumulation",
                    f"gradient accumulation: {len(group)} traced micro-batches ended in one optimizer update; "
                    "each update is one step (its micro-batches' phases summed)",
                )
        head.updated = True
        self.micro_batches[len(group)] = self.micro_batches.get(len(group), 0) + 1
        self._emit(head)

    def _discard_update(self, group: list[Step]) -> None:
        """One update whose micro-batch(es) raised: no row, its number not reused, counted once."""
        requested = group[0].requested
        for held in group:
            held.release_events()
        self._next_step = (self._next_step if requested is None else requested) + 1
        self.discarded_steps += 1

    def _usual_update_size(self) -> int:
        """The number of micro-batches most updates held so far (1 when none held several)."""
        grouped = [(n, size) for size, n in self.micro_batches.items() if size > 1]
        return max(grouped)[1] if grouped else 1

    def _updates_in(self, group: list[Step]) -> list[list[Step]]:
        """Splits a group that holds a raised micro-batch into the updates it really held.

        A micro-batch that raised in the slot of an update's last one (the update's other
        micro-batches all held, at the usual update size) ended that update when the user's loop
        skipped it: the update never reached its optimizer step, and the micro-batches after it
        belong to the next update. Only when the very next traced block is the group's last one (it
        ran the update) was it a retry of the same micro-batch, and the group is one update. A run
        of raises in that slot counts as one (retried until it passed). Two skipped micro-batches in
        one update cannot be told from two retries: the update then absorbs the next (a limit).
        """
        size = self._usual_update_size()
        if size < 2:
            return [group]
        parts: list[list[Step]] = []
        start = kept = 0
        last = len(group) - 1
        for i, held in enumerate(group):
            if not held.raised:
                kept += 1
            elif kept >= size - 1 and i + 1 < last and not group[i + 1].raised:
                parts.append(group[start : i + 1])
                start, kept = i + 1, 0
        parts.append(group[start:])
        return parts

    def _discard(self, st: Step) -> None:
        """A step whose block raised: no row; a group it belonged to is discarded when it completes."""
        st.release_events()
        if self._group or (not self._group_tainted and any(size > 1 for size in self.micro_batches)):
            # A micro-batch of an update in progress, or the first of the next one once updates are
            # known to span several micro-batches: the whole update is discarded (and counted)
            # when it ends. It keeps its place in the group: should the group turn out to be plain
            # steps (no update comes), only this one is discarded (_release_group).
            st.raised = True
            self._group.append(st)
            self._group_tainted = True
            if st.updated or st.optimizer_depth > 0:
                # It raised in or after its optimizer step: the update ended here, discarded now,
                # and the next micro-batch starts the next update (not merged into this one).
                group, self._group = self._group, []
                self._updates_seen = True
                self._complete(group)
            return
        self._next_step = (self._next_step if st.requested is None else st.requested) + 1
        self.discarded_steps += 1

    def update_outside(self, cpu_ns: int, thread: int) -> None:
        """An optimizer update that ran while no step was open (``timing.UPDATE_OUTSIDE``): it ends
        the micro-batches held on that thread, and its time is added to their step (optimizer step
        and ``traceml:step``)."""
        group = self._group
        if not group or group[-1].thread != thread:
            return
        last = group[-1]
        if cpu_ns > 0:
            T.add_call(last.phases, T.OPTIMIZER_STEP, cpu_ns, None)
            entry = last.phases.get(T.STEP)
            if entry is not None:
                entry[1] += cpu_ns
        last.end_unix_ns = time.time_ns()
        last.updated = True
        self._group = []
        self._updates_seen = True
        self._complete(group)

    def held_on(self, thread: int) -> tuple[list[Step], int]:
        """``timing.OUTSIDE_HELD``: the held group and how many of its micro-batches were traced on
        ``thread``, when an optimizer step begins there outside any step."""
        group = self._group
        return group, (len(group) if group and group[-1].thread == thread else 0)

    def update_raised(self, thread: int, mark: Any) -> None:
        """``timing.UPDATE_RAISED``: the optimizer step that began at ``mark`` (:meth:`held_on`) raised.
        The micro-batches held then were its update, which never happened: discarded whole (no row,
        counted once); those traced since stay held for the next update."""
        if not isinstance(mark, tuple) or mark[0] is not self._group or not 0 < mark[1] <= len(self._group):
            return  # the group ended since (an update inside a step), or nothing was held
        update, rest = self._group[: mark[1]], self._group[mark[1] :]
        self._group = rest
        self._group_tainted = any(held.raised for held in rest)
        self._updates_seen = True
        self._discard_update(update)

    def finish(self) -> None:
        """The session's end: micro-batches still held are an incomplete update (dropped and counted)
        when updates were seen, else steps of their own; then one note sums up the step grouping."""
        group, self._group = self._group, []
        if group:
            if self._updates_seen:
                *raised_updates, tail = self._updates_in(group) if self._group_tainted else [group]
                for part in raised_updates:
                    self._discard_update(part)
                for held in tail:
                    held.release_events()
                if not any(held.raised for held in tail):
                    self.dropped_groups += 1
                    self.dropped_micro_batches += len(tail)
                else:
                    self.discarded_steps += 1
            else:
                self._group = group
                self._release_group()
        self._group_tainted = False
        parts = []
        grouped = {size: n for size, n in self.micro_batches.items() if size > 1}
        if grouped:
            sizes = ", ".join(f"{n} step{'' if n == 1 else 's'} of {size} micro-batch{'' if size == 1 else 'es'}"
                              for size, n in sorted(self.micro_batches.items(), key=lambda kv: -kv[1]))
            parts.append(f"{sum(self.micro_batches.values())} steps, one per optimizer update ({sizes})")
        if self.dropped_groups:
            parts.append(f"{self.dropped_groups} incomplete update of {self.dropped_micro_batches} micro-batch(es) at "
                         "the end was dropped (no optimizer step followed)")
        if self.discarded_steps:
            whole = (" (with gradient accumulation an update whose micro-batch raised is discarded whole, "
                     "its optimizer step included)" if grouped else "")
            parts.append(f"{self.discarded_steps} step(s) raised and were discarded (no row){whole}")
        if self.failed_steps:
            parts.append(f"the timing of {self.failed_steps} step(s) failed and they were left out (a TraceML fault; "
                         "counted in finalization_warning.json)")
        if parts:
            self.note("finish", "; ".join(parts))

    def step_counts(self) -> dict[str, int]:
        """Steps that left no row by design, for the ``rank_finished`` frame and the run's summary
        (docs/diagnoses.md, ``steps.discarded``): ``{"discarded_steps": blocks that raised (an update
        with a raising micro-batch counts once), "dropped_updates": incomplete updates dropped at the
        end, "dropped_micro_batches": the micro-batches they held, "failed_steps": steps whose timing
        failed (a loss, unlike the others)}``. Final after :meth:`finish`."""
        return {"discarded_steps": self.discarded_steps, "dropped_updates": self.dropped_groups,
                "dropped_micro_batches": self.dropped_micro_batches, "failed_steps": self.failed_steps}

    def _refuse(self) -> None:
        open_step = T.OPEN
        if open_step is not None and open_step.thread != thread_id():
            self.note("concurrent", "trace_step opened on another thread while a step is open: it is not timed")
        else:
            self.note("nested", "trace_step nested inside an open step is ignored: the outer step times the block")

    def _cuda_pool(self, param: Any) -> tuple[EventPool | None, str]:
        """The event pool and device key of a step whose model is on CUDA (or has no parameters)."""
        index = self._cuda_index(param)
        if index is None:
            return None, "cpu"
        instrument.install_cuda()
        pool = self._pools.get(index)
        if pool is None:
            pool = self._pools[index] = EventPool(index)
        else:
            pool.refresh_stream()
        if index not in instrument.PEAKS.armed:
            instrument.PEAKS.arm(index)
        return pool, f"cuda:{index}"

    @staticmethod
    def _begin(st: Step, info: _ModelInfo | None, pool: EventPool | None) -> None:
        """Attaches the forward timers and starts the step's clocks, taking over what this thread did
        since its last step (``timing.PreStep``)."""
        if info is not None and info.timers:
            timers = st.timers = info.timers
            for timer in timers:
                timer.attach()
        try:
            pre = T.PER_THREAD.pre
        except AttributeError:
            pre = T.pending()
        if pre.generation != T.GENERATION:
            pre = T.pending()
        if pre.regions:
            st.phases.update(pre.regions)
            pre.regions = {}
        fetch = pre.fetch
        if fetch is None:
            if pool is not None:
                st.ev0 = pool.record()
            st.t0 = perf_ns()
            return
        # The step began where the fetch of its batch began (module docstring).
        pre.fetch = None
        t0, cpu_ns, ev0, fetch_pool, _iterator, fetches = fetch
        entry = st.phases.get(T.DATALOADER_NEXT)
        if entry is None:
            st.phases[T.DATALOADER_NEXT] = [fetches, cpu_ns, None]
        else:
            entry[0] += fetches
            entry[1] += cpu_ns
        if ev0 is not None and fetch_pool is pool:
            st.ev0 = ev0
        else:
            if ev0 is not None and fetch_pool is not None:
                fetch_pool.put(ev0)
            if pool is not None:
                st.ev0 = pool.record()
        st.t0 = t0

    @staticmethod
    def _detach(st: Step) -> None:
        timers, st.timers = st.timers, None
        for timer in timers or ():
            timer.detach()

    def _search_forward(self, st: Step) -> None:
        """Finds the modules whose calls are the forward phase when the model itself is not called.

        ``training_step`` code (Lightning) often calls submodules (``self.net(x)``) rather than the
        module given to ``trace_step``. A step that ran backward but had no call of a hooked module
        moves the forward timers one level down (to the children of the current targets), at most
        :data:`MAX_FORWARD_SEARCH_DEPTH` levels; once a forward is seen the targets stay.
        """
        info: _ModelInfo = st.info
        if T.FORWARD in st.phases:
            info.forward_seen = True
            return
        if T.BACKWARD not in st.phases:
            return  # nothing ran that needed a forward (an evaluation step, say): keep looking
        known = {id(target) for target in info.targets}
        children = []
        for parent in info.frontier:
            for child in parent.children():
                if id(child) not in known:
                    known.add(id(child))
                    children.append(child)
        info.level += 1
        if not children or info.level > MAX_FORWARD_SEARCH_DEPTH:
            info.set_targets([])
            info.forward_seen = True
            self.note(
                "noforward",
                "forward is not timed: backward ran but no call of the traced model or its modules "
                f"down to {MAX_FORWARD_SEARCH_DEPTH} levels was seen inside the step",
            )
        else:
            # The levels above stay targets: a later step may call the model itself after all.
            info.set_targets([*info.targets, *children])
            info.frontier = children

    def _model_info(self, model: Any) -> _ModelInfo | None:
        try:
            info = self._models.get(model)
        except TypeError:
            info = None
        if info is None:
            info = self._new_model_info(model)
        if info is not None:
            try:
                self._last_model = weakref.ref(model)
                self._last_info = info
            except TypeError:
                pass
        return info

    def _new_model_info(self, model: Any) -> _ModelInfo | None:
        import torch

        self._torch = torch
        note_model(model)  # its wrapper (DDP, FSDP, DeepSpeed) tells the runtime_environment stream the strategy
        if not isinstance(model, torch.nn.Module):
            self.note(
                f"notmodule:{type(model).__name__}",
                f"trace_step got a {type(model).__name__}, not a torch.nn.Module: forward is not timed",
            )
            return None
        first = next(iter(model.parameters()), None)
        compiled = instrument.compiled_reason(model)
        info = _ModelInfo(model, first, compiled)
        if info.targets and not info.timers:
            self.note(
                f"nohook:{type(model).__name__}",
                f"forward is not timed for {type(model).__name__}: it has no forward hook dicts",
            )
        if compiled is not None:
            self.note(
                "compiled",
                f"model is torch.compile'd ({compiled}): forward is not timed (no forward wrapper or hooks, so the "
                "compiled graphs stay whole); step, dataloader, h2d, backward and optimizer timings go on",
            )
        try:
            self._models[model] = info
        except TypeError:
            pass
        return info

    def _cuda_index(self, param: Any) -> int | None:
        """The CUDA device of the step (``param``: its model's first parameter), or None for a CPU step."""
        if param is not None:
            return int(param.get_device()) if param.is_cuda else None
        # No parameters to ask: a CUDA step if CUDA is already in use (never initialise it ourselves).
        if self._torch is None:
            import torch

            self._torch = torch
        cuda = self._torch.cuda
        if cuda.is_initialized():
            return int(cuda.current_device())
        return None


class StepScope:
    """The context manager of one ``trace_step`` (opens on enter, closes on exit, never swallows)."""

    __slots__ = ("_model", "_open", "_step", "_tracer")

    def __init__(self, tracer: StepTracer, model: Any, step: int | None) -> None:
        self._tracer = tracer
        self._model = model
        self._step = step
        self._open: Step | None = None

    def __enter__(self) -> None:
        self._open = self._tracer.open(self._model, self._step)

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        st = self._open
        if st is not None:
            self._open = None
            self._tracer.close(st, exc_type is not None)


# -- the tracer of the running capture session -------------------------------------------------------

_bind_lock = threading.Lock()
BOUND: tuple[Any, StepTracer] | None = None
"""``(session, tracer)`` of the last :func:`tracer_for` (``trace_step`` reads it without a call)."""


_watch_noted: set[int] = set()  # id() of the watch sessions whose "no step timing" note was printed


def times_steps(session: Any) -> bool:
    """Whether ``session`` times steps: not under ``traceml watch``, which records the system, the
    processes, the environment and the output only (README), whatever the script calls. The first
    time a watch session is asked, one ``[TraceML]`` line says that its ``trace_step`` is ignored."""
    if getattr(session, "mode", "run") != "watch":
        return True
    key = id(session)
    if key not in _watch_noted:
        _watch_noted.add(key)
        warn("traceml watch times no steps: trace_step and trace_region are ignored here "
             "(use traceml run for the step-time breakdown)")
    return False


def tracer_for(session: Any) -> StepTracer:
    """The step tracer of ``session``, created and registered on first use.

    Registers the tracer's two sources with ``session.add_source`` (the session's sampler thread
    then collects them) and starts TraceML's phase patches. One tracer per session; a new session
    gets a new tracer, and step numbers start again at 0.
    """
    global BOUND
    bound = BOUND
    if bound is not None and bound[0] is session:
        return bound[1]
    with _bind_lock:
        bound = BOUND
        if bound is not None and bound[0] is session:
            return bound[1]
        tracer = StepTracer()
        session.add_source(tracer.time_source)
        session.add_source(tracer.memory_source)
        BOUND = (session, tracer)
        return tracer


def prepare(session: Any) -> StepTracer | None:
    """Starts step tracing for ``session`` now, if torch is already imported; else None.

    Without it, tracing starts at the first ``trace_step``, and the DataLoader fetch of the first
    step (made before that call) is not measured: that step has no ``traceml:dataloader_next``. A
    caller that starts a session after ``import torch`` (``traceml_ai.init()``) can call this so
    the first step's fetch is timed too. None too under ``traceml watch`` (:func:`times_steps`).
    """
    if "torch" not in sys.modules or getattr(session, "mode", "run") == "watch":
        return None
    tracer = tracer_for(session)
    instrument.install()
    T.TRACING = True
    return tracer
