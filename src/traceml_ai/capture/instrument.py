"""The patches that time the built-in phases inside a step, and the CUDA peak-memory bookkeeping.

What is patched (DESIGN §3.1 phase names), once per process, only when a step tracer first opens a
step (:func:`install`), and for CUDA only at the first CUDA step (:func:`install_cuda`):

==========================  ============================================================================
phase                       how
==========================  ============================================================================
``traceml:dataloader_next`` ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (both the
                            single- and multi-process iterators). A fetch made while no step is open
                            is attributed to the next step on the same thread (see ``timing``).
``traceml:h2d``             ``torch.Tensor.to`` / ``torch.Tensor.cuda`` calls that turn a CPU tensor
                            into a CUDA one, on CUDA steps only (on CPU the phase is absent).
``traceml:forward``         a forward pre-hook and an ``always_call`` forward hook on the model given
                            to ``trace_step`` (see ``steps.StepTracer`` for when its children get
                            them too), set when the step opens and removed when it closes: the
                            *outermost* call of a hooked module is timed, the submodules it calls
                            are not timed separately, and between steps the model carries no hook
                            of ours (``torch.save(model)`` pickles nothing of TraceML). Hooks, not a
                            wrapped ``forward``: ``nn.DataParallel`` replicas share a module's hook
                            dicts, and ignore them, but would call a copied bound ``forward``; and
                            not a patched ``nn.Module.__call__``, which would cost every module call
                            and change how Dynamo traces modules.
``traceml:backward``        ``torch.autograd.backward``, which ``Tensor.backward`` calls (the outermost
                            call when one backward runs inside another).
``traceml:optimizer_step``  the global optimizer step pre/post hooks of ``torch.optim.optimizer``.
==========================  ============================================================================

Every patch is transparent: it calls the original with the same arguments and returns its result
unchanged, and an exception from the original propagates as it is (the patch only records the
call, or forgets it, before re-raising). TraceML's own bookkeeping never raises into the training:
a failure there is counted in :data:`timing.FAULTS` and the call goes on untimed. Outside a step, or on a
thread that is not the step's, a patch costs one global read and a call. Each patch first asks
``torch.compiler.is_compiling()`` so that, when Dynamo traces through it, it folds away to the
original call and reads none of TraceML's state (no guards on it, no graph break).

``torch.compile``: a compiled model (``OptimizedModule``, or ``module.compile()`` in place) gets no
forward hooks, because hooks on the module Dynamo traces would enter its graph; :func:`compiled_reason`
detects it and the tracer records a note. The other phases happen outside the compiled graph and are
still timed.

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


def _never_compiling() -> bool:
    return False


_is_compiling: Callable[[], bool] = _never_compiling


def _mark(st: T.Step) -> Any:
    # A start event on a CUDA step, else None; callers test ``st.pool`` first so a CPU step pays
    # no call here.
    try:
        return st.mark()
    except Exception:
        fault()
        return None


def _add(st: T.Step, name: str, cpu_ns: int, ev0: Any) -> None:
    try:
        st.add(name, cpu_ns, ev0)
    except Exception:
        fault()


def _add_nested(st: T.Step, name: str, cpu_ns: int, ev0: Any) -> None:
    try:
        st.add_nested(name, cpu_ns, ev0)
    except Exception:
        fault()


def install() -> None:
    """Installs the device-independent patches (DataLoader, backward, optimizer); idempotent."""
    global _installed, _is_compiling
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        import torch

        compiler = getattr(torch, "compiler", None)
        _is_compiling = getattr(compiler, "is_compiling", _never_compiling)
        _patch_dataloader()
        _replace(torch.autograd, "backward", _timed_backward(torch.autograd.backward))
        from torch.optim import optimizer

        _optimizer_hooks.append(optimizer.register_optimizer_step_pre_hook(_optimizer_pre))
        _optimizer_hooks.append(optimizer.register_optimizer_step_post_hook(_optimizer_post))
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
    global _installed, _installed_cuda
    with _install_lock:
        T.OPEN = None
        T.TRACING = False
        T.FETCH_POOL = None
        while _originals:
            owner, name, original = _originals.pop()
            setattr(owner, name, original)
        while _optimizer_hooks:
            _optimizer_hooks.pop().remove()
        PEAKS.forget()
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
            _add(st, T.DATALOADER_NEXT, perf_ns() - t0, None)
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
            pre = T.PRE
            if pre.generation != T.GENERATION:
                pre = T.pending()
            old = pre.fetch
            if old is not None and old[2] is not None and old[3] is not None:
                old[3].put(old[2])
            pre.fetch = (t0, cpu, ev, pool)
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
        if _is_compiling():
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
            _add_nested(st, T.BACKWARD, cpu, ev)

    backward.__traceml_patch__ = True  # type: ignore[attr-defined]
    return backward


# -- optimizer step (global hooks) -------------------------------------------------------------------


def _optimizer_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return None
    st = T.OPEN
    if st is None or st.thread != thread_id():
        return None
    if st.optimizer_depth == 0:
        st.optimizer_ev = None if st.pool is None else _mark(st)
        st.optimizer_nested0 = st.nested_ns
        st.optimizer_pairs0 = 0 if st.nested_pairs is None else len(st.nested_pairs)
        st.optimizer_t0 = perf_ns()
    st.optimizer_depth += 1
    return None


def _optimizer_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return None
    st = T.OPEN
    if st is None or st.thread != thread_id() or st.optimizer_depth <= 0:
        return None
    st.optimizer_depth -= 1
    if st.optimizer_depth == 0:
        # forward/backward run by a closure inside this step count as themselves, not as optimizer time
        cpu = perf_ns() - st.optimizer_t0 - (st.nested_ns - st.optimizer_nested0)
        ev, st.optimizer_ev = st.optimizer_ev, None
        if st.nested_pairs is not None and len(st.nested_pairs) > st.optimizer_pairs0:
            if st.gpu_exclusions is None:
                st.gpu_exclusions = []
            st.gpu_exclusions.extend(st.nested_pairs[st.optimizer_pairs0:])
        _add(st, T.OPTIMIZER_STEP, max(0, cpu), ev)
    return None


# -- forward (hooks on the traced model while its step is open) -------------------------------------


def _forward_pre(module: Any, args: Any) -> None:
    if _is_compiling():
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
    if _is_compiling():
        return None
    st = T.OPEN
    if st is None or st.thread != thread_id() or st.forward_depth <= 0:
        return None
    st.forward_depth -= 1
    if st.forward_depth == 0:
        cpu = perf_ns() - st.forward_t0
        ev, st.forward_ev = st.forward_ev, None
        _add_nested(st, T.FORWARD, cpu, ev)
    return None


_HOOK_KEY = -0x7472616365  # never the id of a RemovableHandle (those count up from 0)


def hook_dicts(module: Any) -> tuple[Any, Any, Any] | None:
    """The module's forward pre-hook, hook and always-called dicts, or None when it lacks them (or
    is a ``torch.jit.ScriptModule``).

    TraceML puts its hooks straight into these dicts under a key of its own (:func:`attach`): a
    dict store each, where ``register_forward_*_hook`` builds two ``RemovableHandle`` objects with weak
    references every step.
    """
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        return None  # scripted code does not run Python hooks set after scripting
    attrs = getattr(module, "__dict__", {})
    pre = attrs.get("_forward_pre_hooks")
    post = attrs.get("_forward_hooks")
    always = attrs.get("_forward_hooks_always_called")
    if isinstance(pre, OrderedDict) and isinstance(post, dict) and isinstance(always, dict):
        return (pre, post, always)
    return None


def attach(dicts: tuple[Any, Any, Any]) -> None:
    """Sets the forward timing hooks in ``dicts`` (from :func:`hook_dicts`): the pre-hook first,
    the hook ``always_call`` so that a forward that raises still ends its timer."""
    pre, post, always = dicts
    pre[_HOOK_KEY] = _forward_pre
    pre.move_to_end(_HOOK_KEY, last=False)
    post[_HOOK_KEY] = _forward_post
    always[_HOOK_KEY] = True


def detach(dicts: tuple[Any, Any, Any]) -> None:
    """Removes what :func:`attach` set."""
    pre, post, always = dicts
    pre.pop(_HOOK_KEY, None)
    post.pop(_HOOK_KEY, None)
    always.pop(_HOOK_KEY, None)


def compiled_reason(model: Any) -> str | None:
    """Why ``model`` must not get forward hooks, or None: it is ``torch.compile``'d.

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
        if _is_compiling():
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
        if _is_compiling():
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
