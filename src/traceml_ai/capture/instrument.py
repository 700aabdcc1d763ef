"""The patches that time the built-in phases inside a step, and the CUDA peak-memory bookkeeping.

What is patched (DESIGN §3.1 phase names), once per process, only when a step tracer first opens a
step (:func:`install`), and for CUDA only at the first CUDA step (:func:`install_cuda`):

==========================  ============================================================================
phase                       how
==========================  ============================================================================
``traceml:dataloader_next`` ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (both the
                            single- and multi-process iterators). A fetch made while no step is open
                            is attributed to the next step on the same thread (see ``timing``);
                            several fetches of one iterator before that step all count in it.
``traceml:h2d``             ``torch.Tensor.to`` / ``torch.Tensor.cuda`` calls that turn a CPU tensor
                            into a CUDA one, on CUDA steps only (on CPU the phase is absent).
``traceml:forward``         the *outermost* calls of the model given to ``trace_step`` (see
                            ``steps.StepTracer`` for when its children are timed too), through a
                            :class:`ForwardTimer` set when the step opens and removed when it closes
                            (between steps the model carries nothing of TraceML's). A module that
                            takes torch's plain call path (no hooks of its own, none global) gets a
                            timing wrapper as its *instance* ``forward`` for the step's duration,
                            which ``Module._call_impl`` calls on that fast path; a module that already
                            takes the hook path (FSDP2, a user's hook) gets a forward pre-hook (run
                            first) and an ``always_call`` forward hook (run last) instead, so its
                            own hooks count in its forward. Why not hooks everywhere: they push the
                            module onto ``_call_impl``'s slow path, several times the wrapper's cost
                            per call. Not a patched ``nn.Module.__call__`` nor global module hooks,
                            which would cost every module call (and change how Dynamo traces modules).
                            So that no copy made during a step carries the wrapper, :func:`install`
                            also patches ``nn.Module.__getstate__`` (behind ``copy.copy``,
                            ``copy.deepcopy``, pickle and ``torch.save``) and
                            ``nn.Module._replicate_for_data_parallel`` (``nn.DataParallel``
                            replicas) to leave it out; a module class that overrides any of those
                            (or ``__reduce__``, ``__reduce_ex__``, ``__copy__``, ``__deepcopy__``)
                            gets the hooks.
``traceml:backward``        ``torch.autograd.backward``, which ``Tensor.backward`` calls (the outermost
                            call when one backward runs inside another).
``traceml:optimizer_step``  the global optimizer step pre/post hooks of ``torch.optim.optimizer``. A
                            call marks the step as an *update* (so does ``GradScaler.step``, which
                            may skip ``optimizer.step``); one that runs while no step is open is
                            handed to the tracer (``timing.UPDATE_OUTSIDE``), which closes the
                            accumulation group it ends (see ``steps.StepTracer``).
==========================  ============================================================================

Every patch is transparent: it calls the original with the same arguments and returns its result
unchanged, and an exception from the original propagates as it is (the patch only records the
call, or forgets it, before re-raising). TraceML's own bookkeeping never raises into the training:
a failure there is counted in :data:`timing.FAULTS` and the call goes on untimed. Outside a step, or on a
thread that is not the step's, a patch costs one global read and a call. Each patch first asks
``torch.compiler.is_compiling()`` so that, when Dynamo traces through it, it folds away to the
original call and reads none of TraceML's state (no guards on it, no graph break). Until
``torch._dynamo`` is imported nothing can be compiling, so that call is skipped (:data:`DYNAMO`);
the tracer turns it on at the first step open after ``torch._dynamo`` appears
(:func:`watch_compiler`; a function that ``torch.compile`` first traces in that same step may
trace into a patch once, and is recompiled at the next step).

``torch.compile``: a compiled model (``OptimizedModule``, or ``module.compile()`` in place) gets no
forward timer, because a wrapper or hooks on the module Dynamo traces would enter its graph;
:func:`compiled_reason` detects it and the tracer records a note. The other phases happen outside
the compiled graph and are still timed.

Peak memory per step on CUDA (``step_memory``): PyTorch keeps one peak per counter that only
``torch.cuda.reset_peak_memory_stats`` lowers, and users read it (``max_memory_allocated``,
``memory_stats``, ``memory_summary``). TraceML needs a peak *per step*, so :class:`CudaPeaks` resets
the device's peaks at each step close (and once before the first step), reads them just before,
and keeps every peak it wiped in a *shadow* (the highest value of each ``…peak`` counter since the
user's own last reset). The reader
``torch.cuda.memory_stats_as_nested_dict`` (which ``memory_stats``, ``max_memory_allocated``,
``max_memory_reserved`` and ``memory_summary`` all go through) is patched to report
``max(counter, shadow)`` for every peak, and ``torch.cuda.reset_peak_memory_stats`` (also behind
``reset_max_memory_allocated``/``_cached``) to clear the shadow. So the user sees the same numbers
as without TraceML, and the step rows get per-step peaks. A step's window is from the previous
step's close to its own close (one allocator read per step instead of two): the gap before a step
(its batch fetch, already part of ``traceml:step``, or an evaluation loop between two training
steps) counts toward that step's peak. Known limits: a reference to
``memory_stats_as_nested_dict`` taken before the first CUDA step, or a direct call of
``torch._C._cuda_memoryStats``, sees the per-step counters; an allocation made on another thread in
the microseconds between TraceML's read and reset is missing from the user's peak; a step during
which the user resets the peaks reports null peaks (not measured).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from traceml_ai.capture import timing as T
from traceml_ai.capture.timing import fault, perf_ns, thread_id

_install_lock = threading.Lock()
_installed = False
_installed_cuda = False
_fork_hook = False
_optimizer_hooks: list[Any] = []
_originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, original), in patch order

DATALOADER_NEXT = T.DATALOADER_NEXT
FORWARD = T.FORWARD
BACKWARD = T.BACKWARD
OPTIMIZER_STEP = T.OPTIMIZER_STEP


def _never_compiling() -> bool:
    return False


_is_compiling: Callable[[], bool] = _never_compiling
"""``torch.compiler.is_compiling`` once ``torch._dynamo`` is imported (:func:`watch_compiler`)."""

DYNAMO = False
"""True once ``torch._dynamo`` is imported; before it nothing can be compiling or exporting
(``torch.compile`` and ``torch.export`` import it first), so every patch starts with
``if DYNAMO and _is_compiling()``: one global read, and no call, on the hot path."""

_full_compiling_check: Callable[[], bool] | None = None  # torch.compiler.is_compiling, once installed

# torch's global module hook dicts (set by install): any entry puts every module on the hook path.
_global_forward_pre: Any = {}
_global_forward: Any = {}
_global_backward_pre: Any = {}
_global_backward: Any = {}


def watch_compiler() -> None:
    """Turns the compiling check on (:data:`DYNAMO`) once ``torch._dynamo`` is imported; the tracer
    calls this when it sees that at a step open. A no-op before."""
    global _is_compiling, DYNAMO
    if _full_compiling_check is not None and "torch._dynamo" in sys.modules:
        _is_compiling = _full_compiling_check
        DYNAMO = True


def _mark(st: T.Step) -> Any:
    # A start event on a CUDA step, else None; callers test ``st.pool`` first so a CPU step pays
    # no call here.
    try:
        return st.mark()
    except Exception:
        fault()
        return None


def _add_nested(st: T.Step, name: str, cpu_ns: int, ev: Any) -> None:
    """One forward/backward call (``Step.add_nested``, its CPU-only case inline), never raising."""
    try:
        if ev is None and not st.optimizer_depth:
            entry = st.phases.get(name)
            if entry is None:
                st.phases[name] = [1, cpu_ns, None]
            else:
                entry[0] += 1
                entry[1] += cpu_ns
        else:
            st.add_nested(name, cpu_ns, ev)
    except Exception:
        fault()


def install() -> None:
    """Installs the device-independent patches (DataLoader, backward, optimizer, module copies); idempotent."""
    global _installed, _full_compiling_check
    global _global_forward_pre, _global_forward, _global_backward_pre, _global_backward
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        import torch
        from torch.nn.modules import module as nn_module

        _full_compiling_check = getattr(getattr(torch, "compiler", None), "is_compiling", _never_compiling)
        watch_compiler()
        _global_forward_pre = getattr(nn_module, "_global_forward_pre_hooks", {})
        _global_forward = getattr(nn_module, "_global_forward_hooks", {})
        _global_backward_pre = getattr(nn_module, "_global_backward_pre_hooks", {})
        _global_backward = getattr(nn_module, "_global_backward_hooks", {})
        _patch_dataloader()
        _replace(torch.autograd, "backward", _timed_backward(torch.autograd.backward))
        _patch_module_copies(torch.nn.Module)
        from torch.optim import optimizer

        _optimizer_hooks.append(optimizer.register_optimizer_step_pre_hook(_optimizer_pre))
        _optimizer_hooks.append(optimizer.register_optimizer_step_post_hook(_optimizer_post))
        _patch_grad_scaler()
        global _fork_hook
        if not _fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_in_child)
            _fork_hook = True
        _installed = True


def uninstall() -> None:
    """Puts back every original that :func:`install` and :func:`install_cuda` replaced.

    For benchmarks and tests that compare against untouched torch in one process; training code
    never needs it. Drops the peak shadow, so afterwards the CUDA peak counters read as TraceML
    last reset them (at the last step's close).
    """
    global _installed, _installed_cuda, _is_compiling, DYNAMO
    with _install_lock:
        T.OPEN = None
        T.TRACING = False
        T.FETCH_POOL = None
        while _originals:
            owner, name, original = _originals.pop()
            setattr(owner, name, original)
        while _optimizer_hooks:
            _optimizer_hooks.pop().remove()
        _outside.clear()
        PEAKS.forget()
        _is_compiling = _never_compiling
        DYNAMO = False
        _installed = _installed_cuda = False


def _replace(owner: Any, name: str, new: Any) -> None:
    original = getattr(owner, name)
    if new is not original:
        _originals.append((owner, name, original))
        setattr(owner, name, new)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) is not the training thread: nothing in it is timed, and
    # its fetches are not the parent's.
    T.OPEN = None
    T.TRACING = False
    T.FETCH_POOL = None
    _outside.clear()


def install_cuda() -> None:
    """Installs the CUDA-only patches (host-to-device copies, peak-memory readers); idempotent."""
    global _installed_cuda
    if _installed_cuda:
        return
    with _install_lock:
        if _installed_cuda:
            return
        import torch

        _replace(torch.Tensor, "to", _timed_to(torch.Tensor.to))
        _replace(torch.Tensor, "cuda", _timed_cuda(torch.Tensor.cuda))
        PEAKS.install()
        _installed_cuda = True


def _is_patch(fn: Any) -> bool:
    return bool(getattr(fn, "__traceml_patch__", False))


# -- DataLoader --------------------------------------------------------------------------------------


def _patch_dataloader() -> None:
    from torch.utils.data import dataloader

    cls: Any = dataloader._BaseDataLoaderIter
    orig = cls.__next__
    if _is_patch(orig):
        return

    @functools.wraps(orig)
    def __next__(self: Any) -> Any:
        if not T.TRACING:
            return orig(self)
        st = T.OPEN
        if st is not None and st.thread == thread_id():
            t0 = perf_ns()
            batch = orig(self)
            cpu = perf_ns() - t0
            try:
                entry = st.phases.get(DATALOADER_NEXT)
                if entry is None:
                    st.phases[DATALOADER_NEXT] = [1, cpu, None]
                else:
                    entry[0] += 1
                    entry[1] += cpu
            except Exception:
                fault()
            return batch
        pool = T.FETCH_POOL
        ev = None
        if pool is not None:
            try:
                ev = pool.record()
            except Exception:
                fault()
        t0 = perf_ns()
        try:
            batch = orig(self)
        except BaseException:
            # StopIteration at the end of an epoch, or a worker error: not a batch the next step got.
            if ev is not None and pool is not None:
                pool.put(ev)
            raise
        cpu = perf_ns() - t0
        try:
            # timing.set_pending_fetch, inlined: this runs before every step.
            try:
                pre = T.PER_THREAD.pre
            except AttributeError:
                pre = T.pending()
            if pre.generation != T.GENERATION:
                pre = T.pending()
            old = pre.fetch
            if old is not None and old[4] == id(self):
                # More batches of the same iterator before the next step (the micro-batches of a
                # Hugging Face update are all fetched before it begins): the step waited for each.
                if ev is not None and pool is not None:
                    pool.put(ev)
                pre.fetch = (old[0], old[1] + cpu, old[2], old[3], old[4], old[5] + 1)
            else:
                if old is not None and old[2] is not None and old[3] is not None:
                    old[3].put(old[2])
                pre.fetch = (t0, cpu, ev, pool, id(self), 1)
        except Exception:
            fault()
        return batch

    __next__.__traceml_patch__ = True  # type: ignore[attr-defined]
    _replace(cls, "__next__", __next__)


# -- backward ----------------------------------------------------------------------------------------


def _timed_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    if _is_patch(orig):
        return orig

    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if DYNAMO and _is_compiling():
            return orig(*args, **kwargs)
        st = T.OPEN
        if st is None or st.backward_depth or st.thread != thread_id():
            return orig(*args, **kwargs)
        st.backward_depth = 1
        ev = None if st.pool is None else _mark(st)
        t0 = perf_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            cpu = perf_ns() - t0
            st.backward_depth = 0
            try:
                if ev is None and not st.optimizer_depth:  # _add_nested's common case, inline
                    entry = st.phases.get(BACKWARD)
                    if entry is None:
                        st.phases[BACKWARD] = [1, cpu, None]
                    else:
                        entry[0] += 1
                        entry[1] += cpu
                else:
                    st.add_nested(BACKWARD, cpu, ev)
            except Exception:
                fault()

    backward.__traceml_patch__ = True  # type: ignore[attr-defined]
    return backward


# -- optimizer step (global hooks) -------------------------------------------------------------------


_outside: dict[int, list[Any]] = {}
"""thread -> [depth, t0_ns, id of the outermost optimizer, the tracer's mark when it began
(``timing.OUTSIDE_HELD``)] of an optimizer step running outside any step."""

# An optimizer.step() that raises never reaches its post hook, so its depth would stay counted and
# every later update look nested inside it (no update ever ending again). A step of an optimizer
# already running on that thread is therefore the same optimizer called again after such a raise
# (an optimizer does not step itself; a wrapper that steps an inner optimizer is another object):
# the depth starts again from it.


def _optimizer_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    if DYNAMO and _is_compiling():
        return None
    st = T.OPEN
    if st is None:
        if T.TRACING and T.UPDATE_OUTSIDE is not None:
            tid = thread_id()
            state = _outside.setdefault(tid, [0, 0, 0, None])
            if state[0] and state[2] == id(optimizer):
                state[0] = 0  # its previous step raised (see above): that update never happened
                try:
                    if T.UPDATE_RAISED is not None:
                        T.UPDATE_RAISED(tid, state[3])
                except Exception:
                    fault()
            state[0] += 1
            if state[0] == 1:
                state[1] = perf_ns()
                state[2] = id(optimizer)
                try:
                    state[3] = None if T.OUTSIDE_HELD is None else T.OUTSIDE_HELD(tid)
                except Exception:
                    state[3] = None
                    fault()
        return None
    if st.thread != thread_id():
        return None
    depth = st.optimizer_depth
    if depth and st.optimizer_id == id(optimizer):
        # Its previous step in this traced step raised, caught inside the block: not counted.
        st.release(st.optimizer_ev)
        st.optimizer_ev = None
        depth = 0
    st.optimizer_depth = depth + 1
    if depth == 0:
        st.optimizer_id = id(optimizer)
        if st.pool is not None:
            st.optimizer_ev = _mark(st)
        pairs = st.nested_pairs
        if pairs is not None:  # GPU pairs of forward/backward so far (only ever grows within a step)
            st.optimizer_pairs0 = len(pairs)
        st.optimizer_nested0 = st.nested_ns
        st.optimizer_t0 = perf_ns()
    return None


def _optimizer_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    if DYNAMO and _is_compiling():
        return None
    st = T.OPEN
    if st is None:
        _update_outside()
        return None
    if st.thread != thread_id():
        return None
    depth = st.optimizer_depth - 1
    if depth < 0:
        return None
    st.optimizer_depth = depth
    if depth:
        return None
    st.updated = True
    # forward/backward run by a closure inside this step count as themselves, not as optimizer time
    cpu = perf_ns() - st.optimizer_t0 - (st.nested_ns - st.optimizer_nested0)
    if cpu < 0:
        cpu = 0
    try:
        ev = st.optimizer_ev
        if ev is None:  # Step.add's CPU case, inline
            entry = st.phases.get(OPTIMIZER_STEP)
            if entry is None:
                st.phases[OPTIMIZER_STEP] = [1, cpu, None]
            else:
                entry[0] += 1
                entry[1] += cpu
            return None
        st.optimizer_ev = None
        pairs = st.nested_pairs
        if pairs is not None and len(pairs) > st.optimizer_pairs0:
            if st.gpu_exclusions is None:
                st.gpu_exclusions = []
            st.gpu_exclusions.extend(pairs[st.optimizer_pairs0 :])
        st.add(OPTIMIZER_STEP, cpu, ev)
    except Exception:
        fault()
    return None


def _update_outside() -> None:
    """An optimizer step ended while no step is open: hand its CPU time to the tracer (timing.UPDATE_OUTSIDE)."""
    hook = T.UPDATE_OUTSIDE
    if hook is None or not T.TRACING:
        return
    tid = thread_id()
    state = _outside.get(tid)
    if state is None or state[0] <= 0:
        return
    state[0] -= 1
    if state[0]:
        return
    cpu = perf_ns() - state[1]
    try:
        hook(cpu, tid)
    except Exception:
        fault()


def _patch_grad_scaler() -> None:
    """``GradScaler.step`` marks an update even when it skips ``optimizer.step`` (inf/NaN gradients):
    with mixed precision the first steps of a run are often skipped, and they are still updates."""
    try:
        from torch.amp import grad_scaler
    except ImportError:  # pragma: no cover - torch without torch.amp
        return
    cls: Any = grad_scaler.GradScaler
    orig = cls.step
    if _is_patch(orig):
        return

    @functools.wraps(orig)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        if not T.TRACING:
            return result
        st = T.OPEN
        if st is not None:
            if st.thread == thread_id():
                st.updated = True
        elif T.UPDATE_OUTSIDE is not None:
            try:
                T.UPDATE_OUTSIDE(0, thread_id())  # a no-op when the optimizer's own hook already closed the group
            except Exception:
                fault()
        return result

    step.__traceml_patch__ = True  # type: ignore[attr-defined]
    _replace(cls, "step", step)


# -- forward (a wrapper or hooks on the traced model while its step is open) ----------------------


def _forward_pre(module: Any, args: Any) -> None:
    if DYNAMO and _is_compiling():
        return None
    st = T.OPEN
    if st is None or st.thread != thread_id():
        return None
    if st.forward_depth == 0:
        st.forward_ev = None if st.pool is None else _mark(st)
        st.forward_t0 = perf_ns()
    st.forward_depth += 1
    return None


def _forward_post(module: Any, args: Any, output: Any) -> None:
    if DYNAMO and _is_compiling():
        return None
    st = T.OPEN
    if st is None or st.thread != thread_id() or st.forward_depth <= 0:
        return None
    st.forward_depth -= 1
    if st.forward_depth == 0:
        cpu = perf_ns() - st.forward_t0
        ev, st.forward_ev = st.forward_ev, None
        _add_nested(st, FORWARD, cpu, ev)
    return None


def _timed_forward(inner: Callable[..., Any]) -> Callable[..., Any]:
    """The instance ``forward`` of a wrapped module during a step: ``inner`` timed when it is the
    outermost forward on the step's thread, else ``inner`` alone."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        if DYNAMO and _is_compiling():
            return inner(*args, **kwargs)
        st = T.OPEN
        if st is None or st.forward_depth or st.thread != thread_id():
            return inner(*args, **kwargs)
        st.forward_depth = 1
        ev = None if st.pool is None else _mark(st)
        t0 = perf_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            cpu = perf_ns() - t0
            st.forward_depth = 0
            try:
                if ev is None and not st.optimizer_depth:  # _add_nested's common case, inline
                    entry = st.phases.get(FORWARD)
                    if entry is None:
                        st.phases[FORWARD] = [1, cpu, None]
                    else:
                        entry[0] += 1
                        entry[1] += cpu
                else:
                    st.add_nested(FORWARD, cpu, ev)
            except Exception:
                fault()

    forward.__wrapped__ = inner  # type: ignore[attr-defined]  # inspect.signature(model.forward) as without it
    return forward


_HOOK_KEY = -0x7472616365  # never the id of a RemovableHandle (those count up from 0)
_ABSENT: Any = object()  # no instance ``forward`` before the wrapper went in
_NONE, _WRAPPED, _HOOKED = 0, 1, 2
_COPY_METHODS = ("__getstate__", "_replicate_for_data_parallel", "__reduce__", "__reduce_ex__")


class ForwardTimer:
    """Times the outermost calls of one module while a step is open (module docstring, forward row).

    :meth:`attach` at the step's open picks the mechanism for this step: the instance-``forward``
    wrapper when the module takes torch's plain call path and its class copies through
    ``nn.Module``'s own methods (:attr:`wrappable`), else the two hooks; :meth:`detach` at close
    takes it out again. Built by :func:`forward_timer`; used by the training thread only.
    """

    __slots__ = (
        "always",
        "attached",
        "backward",
        "backward_pre",
        "cls",
        "cls_forward",
        "module",
        "post",
        "pre",
        "prev",
        "wrappable",
        "wrapper",
    )

    def __init__(self, module: Any, dicts: tuple[Any, Any, Any], backward_hooks: tuple[Any, Any]) -> None:
        self.module = module
        self.pre, self.post, self.always = dicts  # the forward pre-hook, hook and always-called dicts
        self.backward, self.backward_pre = backward_hooks  # the backward hook and pre-hook dicts
        self.attached = _NONE
        self.cls: Any = None
        self.cls_forward: Any = None
        self.wrappable = False
        self.prev: Any = _ABSENT
        self.wrapper: Callable[..., Any] | None = None

    def _retype(self, cls: Any) -> None:
        """Whether modules of ``cls`` may carry the wrapper: its copies go through what
        :func:`install` patched (no override of those methods, nor ``__copy__``/``__deepcopy__``)."""
        import torch

        base = torch.nn.Module
        self.cls = cls
        self.wrapper = None
        self.wrappable = (
            isinstance(getattr(cls, "forward", None), types.FunctionType)  # a method to bind, not some descriptor
            and getattr(cls, "__copy__", None) is None
            and getattr(cls, "__deepcopy__", None) is None
            and all(getattr(cls, name, None) is getattr(base, name, None) for name in _COPY_METHODS)
        )

    def attach(self) -> None:
        """Sets the wrapper (or the hooks) for the step now opening."""
        module = self.module
        cls = type(module)
        if cls is not self.cls:
            self._retype(cls)
        if self.wrappable and not (
            self.pre
            or self.post
            or self.backward
            or self.backward_pre
            or _global_forward_pre
            or _global_forward
            or _global_backward_pre
            or _global_backward
        ):
            attrs = module.__dict__
            prev = attrs.get("forward", _ABSENT)
            wrapper = self.wrapper
            if prev is not wrapper:
                cls_forward = cls.forward
                if wrapper is None or prev is not self.prev or cls_forward is not self.cls_forward:
                    self.prev = prev
                    self.cls_forward = cls_forward
                    inner = prev if prev is not _ABSENT else cls_forward.__get__(module, cls)
                    wrapper = self.wrapper = _timed_forward(inner)
                    wrapper.__traceml_timer__ = self  # type: ignore[attr-defined]
                attrs["forward"] = wrapper
            self.attached = _WRAPPED
            return
        pre = self.pre
        pre[_HOOK_KEY] = _forward_pre
        pre.move_to_end(_HOOK_KEY, last=False)
        self.post[_HOOK_KEY] = _forward_post
        self.always[_HOOK_KEY] = True
        self.attached = _HOOKED

    def detach(self) -> None:
        """Takes out what :meth:`attach` set (an instance ``forward`` set by others meanwhile stays)."""
        mode = self.attached
        self.attached = _NONE
        if mode == _WRAPPED:
            attrs = self.module.__dict__
            if attrs.get("forward") is self.wrapper:
                prev = self.prev
                if prev is _ABSENT:
                    del attrs["forward"]
                else:
                    attrs["forward"] = prev
        elif mode == _HOOKED:
            self.pre.pop(_HOOK_KEY, None)
            self.post.pop(_HOOK_KEY, None)
            self.always.pop(_HOOK_KEY, None)

    def restore(self, attrs: dict[str, Any]) -> None:
        """Puts in ``attrs`` (the module's ``__dict__``, or a copy of it) the ``forward`` the wrapper replaced."""
        if self.prev is _ABSENT:
            attrs.pop("forward", None)
        else:
            attrs["forward"] = self.prev


def forward_timer(module: Any) -> ForwardTimer | None:
    """A :class:`ForwardTimer` for ``module``, or None when its forward cannot be timed: it lacks
    torch's hook dicts, or is a ``torch.jit.ScriptModule`` (scripted code calls neither a wrapper nor
    hooks set after scripting)."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        return None
    attrs = getattr(module, "__dict__", {})
    pre = attrs.get("_forward_pre_hooks")
    post = attrs.get("_forward_hooks")
    always = attrs.get("_forward_hooks_always_called")
    backward = attrs.get("_backward_hooks", {})
    backward_pre = attrs.get("_backward_pre_hooks", {})
    if isinstance(pre, OrderedDict) and isinstance(post, dict) and isinstance(always, dict):
        return ForwardTimer(module, (pre, post, always), (backward, backward_pre))
    return None


def _without_timer(state: dict[str, Any]) -> None:
    """Takes a TraceML forward wrapper out of ``state`` (a module ``__dict__`` copy), if there is one."""
    timer = getattr(state.get("forward"), "__traceml_timer__", None)
    if isinstance(timer, ForwardTimer):
        timer.restore(state)


def _without_hooks(state: dict[str, Any]) -> None:
    """Replaces, in ``state`` (a module ``__dict__`` copy), each forward hook dict holding TraceML's
    hook by a copy without it (the module's own dicts keep it until its step closes)."""
    for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called"):
        hooks = state.get(name)
        if isinstance(hooks, dict) and _HOOK_KEY in hooks:
            kept = hooks.copy()
            del kept[_HOOK_KEY]
            state[name] = kept


def _patch_module_copies(module_cls: Any) -> None:
    """``nn.Module.__getstate__`` leaves TraceML's wrapper and hooks out of copies and pickles,
    ``_replicate_for_data_parallel`` the wrapper out of ``nn.DataParallel`` replicas (which share the
    module's hook dicts by design; on their threads TraceML's hooks time nothing)."""
    orig_getstate = module_cls.__getstate__
    orig_replicate = module_cls._replicate_for_data_parallel
    if _is_patch(orig_getstate):
        return

    @functools.wraps(orig_getstate)
    def __getstate__(self: Any) -> Any:
        state = orig_getstate(self)
        if type(state) is dict:
            try:
                pre = state.get("_forward_pre_hooks")
                if "forward" in state or (isinstance(pre, dict) and _HOOK_KEY in pre):
                    if state is self.__dict__:
                        state = dict(state)
                    _without_timer(state)
                    _without_hooks(state)
            except Exception:
                fault()
        return state

    @functools.wraps(orig_replicate)
    def _replicate_for_data_parallel(self: Any) -> Any:
        replica = orig_replicate(self)
        attrs = getattr(replica, "__dict__", None)
        if type(attrs) is dict and "forward" in attrs:
            try:
                _without_timer(attrs)
            except Exception:
                fault()
        return replica

    __getstate__.__traceml_patch__ = True  # type: ignore[attr-defined]
    _replicate_for_data_parallel.__traceml_patch__ = True  # type: ignore[attr-defined]
    _replace(module_cls, "__getstate__", __getstate__)
    _replace(module_cls, "_replicate_for_data_parallel", _replicate_for_data_parallel)


def compiled_reason(model: Any) -> str | None:
    """Why ``model`` must not get a forward timer, or None: it is ``torch.compile``'d.

    Detects ``torch._dynamo.eval_frame.OptimizedModule`` (what ``torch.compile(model)`` returns,
    holding the original as ``_orig_mod``) and ``model.compile()`` done in place
    (``_compiled_call_impl`` set). Without ``torch._dynamo`` imported nothing can be compiled, so
    the check never imports it.
    """
    if "torch._dynamo" in sys.modules:
        try:
            from torch._dynamo.eval_frame import OptimizedModule

            if isinstance(model, OptimizedModule):
                return "torch.compile(model)"
        except ImportError:
            pass
    attrs = getattr(model, "__dict__", None)
    if isinstance(attrs, dict) and attrs.get("_compiled_call_impl") is not None:
        return "model.compile()"
    return None


# -- host-to-device copies (CUDA steps only) ---------------------------------------------------------


def _timed_to(orig: Callable[..., Any]) -> Callable[..., Any]:
    if _is_patch(orig):
        return orig
    import torch

    dtype_type = torch.dtype

    @functools.wraps(orig)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if DYNAMO and _is_compiling():
            return orig(self, *args, **kwargs)
        st = T.OPEN
        if st is None or st.pool is None or st.h2d_depth or not self.is_cpu or st.thread != thread_id():
            return orig(self, *args, **kwargs)
        if args and type(args[0]) is dtype_type and "device" not in kwargs:
            return orig(self, *args, **kwargs)  # .to(dtype): stays on the CPU
        return _time_copy(st, orig, self, args, kwargs)

    to.__traceml_patch__ = True  # type: ignore[attr-defined]
    return to


def _timed_cuda(orig: Callable[..., Any]) -> Callable[..., Any]:
    if _is_patch(orig):
        return orig

    @functools.wraps(orig)
    def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        if DYNAMO and _is_compiling():
            return orig(self, *args, **kwargs)
        st = T.OPEN
        if st is None or st.pool is None or st.h2d_depth or not self.is_cpu or st.thread != thread_id():
            return orig(self, *args, **kwargs)
        return _time_copy(st, orig, self, args, kwargs)

    cuda.__traceml_patch__ = True  # type: ignore[attr-defined]
    return cuda


def _time_copy(st: T.Step, orig: Callable[..., Any], tensor: Any, args: Any, kwargs: Any) -> Any:
    # The depth guard: a Tensor subclass's __torch_function__ calls back into the patched method.
    st.h2d_depth = 1
    ev = _mark(st)
    t0 = perf_ns()
    try:
        out = orig(tensor, *args, **kwargs)
    except BaseException:
        st.h2d_depth = 0
        st.release(ev)
        raise
    cpu = perf_ns() - t0
    st.h2d_depth = 0
    try:
        if out is not tensor and out.is_cuda:
            st.add(T.H2D, cpu, ev)
        else:
            st.release(ev)
    except Exception:
        fault()
    return out


# -- CUDA peak memory per step -----------------------------------------------------------------------


class CudaPeaks:
    """Per-step CUDA peaks that leave the user's peak counters as they would be (module docstring).

    One allocator read per step (it costs tens of microseconds): :meth:`end` at each step close
    reads the peaks, folds them into the shadow and resets them, so a step's window runs from the
    previous step's close on that device to its own close; :meth:`arm` starts the first window.
    Thread-safe: the patched readers may run on any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shadow: dict[int, dict[tuple[str, ...], int]] = {}
        self._reset_by_user: set[int] = set()
        self.armed: set[int] = set()
        self._stats: Callable[[int], dict[str, Any]] | None = None
        self._reset: Callable[[int], None] | None = None

    def install(self) -> None:
        import torch
        import torch.cuda.memory as cuda_memory
        from torch.cuda._utils import _get_device_index

        self._stats = torch._C._cuda_memoryStats
        self._reset = torch._C._cuda_resetPeakMemoryStats
        orig_stats = cuda_memory.memory_stats_as_nested_dict
        orig_reset = cuda_memory.reset_peak_memory_stats
        if _is_patch(orig_stats):
            return
        peaks = self

        @functools.wraps(orig_stats)
        def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
            stats = orig_stats(device=device)
            if stats and peaks._shadow:
                peaks._merge(_get_device_index(device, optional=True), stats)
            return stats

        @functools.wraps(orig_reset)
        def reset_peak_memory_stats(device: Any = None) -> None:
            index = _get_device_index(device, optional=True)
            with peaks._lock:
                peaks._shadow.pop(index, None)
                peaks._reset_by_user.add(index)
            return orig_reset(device=device)

        memory_stats_as_nested_dict.__traceml_patch__ = True  # type: ignore[attr-defined]
        reset_peak_memory_stats.__traceml_patch__ = True  # type: ignore[attr-defined]
        # Both the torch.cuda.memory functions (what memory_stats / reset_max_* call) and the
        # torch.cuda names users call.
        _replace(cuda_memory, "memory_stats_as_nested_dict", memory_stats_as_nested_dict)
        _replace(cuda_memory, "reset_peak_memory_stats", reset_peak_memory_stats)
        _replace(torch.cuda, "memory_stats_as_nested_dict", memory_stats_as_nested_dict)
        _replace(torch.cuda, "reset_peak_memory_stats", reset_peak_memory_stats)

    def forget(self) -> None:
        """Drops the shadow and the armed devices (see :func:`uninstall`)."""
        with self._lock:
            self._shadow.clear()
            self._reset_by_user.clear()
            self.armed.clear()

    def arm(self, index: int) -> None:
        """Starts the first window on ``index``: folds the peaks so far into the shadow, resets them."""
        assert self._stats is not None and self._reset is not None
        stats = self._stats(index)
        with self._lock:
            _fold(self._shadow.setdefault(index, {}), stats, ())
            self._reset(index)
            self._reset_by_user.discard(index)
            self.armed.add(index)

    def end(self, index: int) -> tuple[float | None, float | None]:
        """The window's ``allocated_bytes.all.peak`` and ``reserved_bytes.all.peak`` (bytes); folds
        every peak into the shadow and resets them, which starts the next window. (None, None)
        when the user reset the peaks during the window: its peak is then unknown."""
        assert self._stats is not None and self._reset is not None
        stats = self._stats(index)
        with self._lock:
            _fold(self._shadow.setdefault(index, {}), stats, ())
            self._reset(index)
            if index in self._reset_by_user:
                self._reset_by_user.discard(index)
                return None, None
        return float(stats["allocated_bytes"]["all"]["peak"]), float(stats["reserved_bytes"]["all"]["peak"])

    def _merge(self, index: int, stats: dict[str, Any]) -> None:
        with self._lock:
            shadow = dict(self._shadow.get(index, ()))
        for path, peak in shadow.items():
            node: Any = stats
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and isinstance(node.get("peak"), int) and node["peak"] < peak:
                node["peak"] = peak


def _fold(shadow: dict[tuple[str, ...], int], stats: dict[str, Any], prefix: tuple[str, ...]) -> None:
    """Raises each ``shadow[path]`` to the ``peak`` of the stat at ``path`` in ``stats``."""
    for key, value in stats.items():
        if type(value) is dict:
            peak = value.get("peak")
            path = (*prefix, key)
            if peak is None:
                _fold(shadow, value, path)
            elif peak > shadow.get(path, -1):
                shadow[path] = peak


PEAKS = CudaPeaks()
