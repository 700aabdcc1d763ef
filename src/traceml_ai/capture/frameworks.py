"""Step timing for training frameworks that own the loop: Hugging Face ``Trainer`` and Lightning.

Two callbacks open and close TraceML steps from the framework's own hooks (built lazily by
:func:`huggingface_callback_class` and :func:`lightning_callback_class`, because each subclasses its
framework's callback base; ``traceml_ai.sdk.integrations`` re-exports them under their public names):

- Hugging Face: a step opens at ``on_step_begin``; every ``on_substep_end`` (a micro-batch of
  gradient accumulation ended without an update) closes it and opens the next; ``on_step_end``
  (after the optimizer step) closes the last. The tracer merges the micro-batches of one update
  into one step (``steps.StepTracer``), so ``traceml:step``'s ``n_calls`` says how many it held.
- Lightning: one step per training batch (``on_train_batch_start`` to ``on_train_batch_end``); with
  ``accumulate_grad_batches`` the tracer merges the batches of one update the same way. A batch that
  raises (``on_exception``) is discarded.

Under ``traceml run`` (capture mode ``run``) :func:`install_auto_attach` makes this automatic, as
upstream traceml-ai 0.5 does: when the script imports ``transformers.trainer`` or
``lightning.pytorch.trainer.trainer`` (or ``pytorch_lightning.trainer.trainer``, the standalone
package many scripts still import: a copy of Lightning with its own classes, so its Trainers get a
callback built on its own ``Callback``), their ``Trainer.__init__`` is wrapped so that a Trainer
built without TraceML's callback gets one, with a one-line ``[TraceML]`` note saying so. A Trainer
already given TraceML's callback keeps it (nothing added). ``traceml watch`` and
``--disable-traceml`` never call it.

Never raises into the training: a failure to attach is one ``[TraceML]`` line and the Trainer
runs without step timing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from traceml_ai.capture import steps
from traceml_ai.capture.client import warn
from traceml_ai.capture.samplers.runtime_environment import note_model
from traceml_ai.capture.session import current_session
from traceml_ai.capture.timing import Step

HF_MODULE = "transformers.trainer"
LIGHTNING_MODULE = "lightning.pytorch.trainer.trainer"
PTL_MODULE = "pytorch_lightning.trainer.trainer"


class OpenStep:
    """The one TraceML step a framework opened in one callback and closes in another.

    Without a running capture session, and under ``traceml watch`` (no step timing), every call
    is a no-op.
    """

    def __init__(self) -> None:
        self._tracer: steps.StepTracer | None = None
        self._step: Step | None = None
        session = current_session()
        if session is not None:
            # Tracing from now on (torch is imported: the framework is), so that the batches the
            # framework fetches before its first step hook are timed too.
            self._tracer = steps.prepare(session)

    def open(self, model: Any, wrapped: Any = None) -> None:
        """Opens a step of ``model``; a step still open (the framework skipped its end) is closed first.
        ``wrapped``: the framework's DDP/FSDP/DeepSpeed wrapper of ``model`` when it has one (the
        runtime_environment stream names the strategy from its class)."""
        self.close()
        session = current_session()
        if session is None or not steps.times_steps(session):
            return
        if wrapped is not None:
            note_model(wrapped)
        tracer = steps.tracer_for(session)
        self._tracer = tracer
        self._step = tracer.open(model)

    def close(self, raised: bool = False) -> None:
        """Closes the open step, if any; ``raised``: its work ended by an exception (discarded)."""
        st, self._step = self._step, None
        tracer = self._tracer
        if st is not None and tracer is not None:
            tracer.close(st, raised)


_classes: dict[str, type] = {}
_classes_lock = threading.Lock()


def huggingface_callback_class() -> type:
    """``TraceMLTrainerCallback``, a ``transformers.TrainerCallback`` (imports transformers)."""
    with _classes_lock:
        cls = _classes.get("hf")
        if cls is None:
            cls = _classes["hf"] = _make_hf_class()
        return cls


def lightning_callback_class(package: str = "lightning.pytorch") -> type:
    """``TraceMLCallback``, a ``Callback`` of ``package``: ``lightning.pytorch`` (imports lightning) or
    ``pytorch_lightning`` (the standalone package, whose classes are its own)."""
    with _classes_lock:
        cls = _classes.get(package)
        if cls is None:
            cls = _classes[package] = _make_lightning_class(package)
        return cls


def _make_hf_class() -> type:
    from transformers import TrainerCallback

    class TraceMLTrainerCallback(TrainerCallback):
        """Times each optimisation step of a Hugging Face ``Trainer`` as one TraceML step.

        ``Trainer(model=model, args=args, train_dataset=ds, callbacks=[TraceMLTrainerCallback()])``;
        under ``traceml run`` it is attached automatically. Without a capture session it does nothing.
        """

        def __init__(self) -> None:
            self._step = OpenStep()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._step.open(kwargs.get("model"))

        def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # A micro-batch ended without an update: the next one is a step of its own, which the
            # tracer merges with this one when the update comes.
            self._step.open(kwargs.get("model"))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._step.close()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._step.close()

    TraceMLTrainerCallback.__module__ = "traceml_ai.sdk.integrations.huggingface"
    return TraceMLTrainerCallback


def _make_lightning_class(package: str) -> type:
    import importlib

    Callback: Any = importlib.import_module(f"{package}.callbacks").Callback

    class TraceMLCallback(Callback):  # type: ignore[misc]
        """Times each training batch of a Lightning ``Trainer`` as one TraceML step (the batches of one
        accumulated update merged into one step).

        ``lightning.Trainer(callbacks=[TraceMLCallback()])``; under ``traceml run`` it is attached
        automatically. Without a capture session it does nothing.
        """

        def __init__(self) -> None:
            super().__init__()
            self._step = OpenStep()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            # The strategy's model is the DDP/FSDP/DeepSpeed wrapper of pl_module (pl_module itself
            # under a single-device strategy).
            self._step.open(pl_module, getattr(getattr(trainer, "strategy", None), "model", None))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self._step.close()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self._step.close(raised=True)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self._step.close()

    TraceMLCallback.__module__ = "traceml_ai.sdk.integrations.lightning"
    return TraceMLCallback


# -- automatic attachment under `traceml run` ----------------------------------------------------------


def _wrap_trainer_init(module: ModuleType, attach: Callable[[Any], None], framework: str) -> None:
    """Make ``module.Trainer.__init__`` call ``attach(trainer)`` after the original (once per class);
    a failure of ``attach`` is one warning naming ``framework``, never an error of the user's script."""
    trainer_cls: Any = getattr(module, "Trainer", None)
    if trainer_cls is None or getattr(trainer_cls.__init__, "__traceml_patch__", False):
        return
    orig = trainer_cls.__init__

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            attach(self)
        except Exception as exc:
            warn(f"could not attach step timing to the {framework} Trainer: {exc!r}")

    __init__.__traceml_patch__ = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__


def _attach_hf(trainer: Any) -> None:
    cls = huggingface_callback_class()
    handler = getattr(trainer, "callback_handler", None)
    present = getattr(handler, "callbacks", [])
    if any(isinstance(cb, cls) or cb is cls for cb in present):
        return
    auto = cls()
    trainer.add_callback(auto)
    add = trainer.add_callback

    def add_callback(callback: Any) -> None:
        # One the user adds after the Trainer was built takes the automatic one's place (review
        # 11e: both ran, and the second's steps were "nested" inside the first's).
        if (callback is cls or isinstance(callback, cls)) and auto in trainer.callback_handler.callbacks:
            trainer.remove_callback(auto)
        add(callback)

    trainer.add_callback = add_callback
    _note_once("hf", "attached TraceML's Hugging Face Trainer callback (one step per optimizer update); "
                     "pass callbacks=[TraceMLTrainerCallback()] to attach it yourself")


def _attach_lightning(trainer: Any, package: str = "lightning.pytorch") -> None:
    cls = lightning_callback_class(package)
    present = getattr(trainer, "callbacks", [])
    ours = tuple(c for key, c in _classes.items() if key != "hf")
    if any(isinstance(cb, ours) for cb in present):
        return  # TraceML's callback, of either package
    # Lightning reads trainer.callbacks when it calls hooks, so appending is enough.
    trainer.callbacks.append(cls())
    _note_once("lightning", "attached TraceML's Lightning callback (one step per optimizer update); pass "
                            "callbacks=[TraceMLCallback()] to attach it yourself")


def _patch_hf(module: ModuleType) -> None:
    _wrap_trainer_init(module, _attach_hf, "Hugging Face")


def _patch_lightning(module: ModuleType) -> None:
    _wrap_trainer_init(module, _attach_lightning, "Lightning")


def _patch_pytorch_lightning(module: ModuleType) -> None:
    _wrap_trainer_init(module, functools.partial(_attach_lightning, package="pytorch_lightning"), "Lightning")


_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    HF_MODULE: _patch_hf, LIGHTNING_MODULE: _patch_lightning, PTL_MODULE: _patch_pytorch_lightning,
}
_noted: set[str] = set()


def _note_once(key: str, text: str) -> None:
    if key not in _noted:
        _noted.add(key)
        warn(text)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch of the module it loaded."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:
            warn(f"could not prepare automatic step timing for {module.__name__}: {exc!r}")


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the framework modules with the other finders and wraps their loader (see module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec  # type: ignore[no-any-return]
        return None


def install_auto_attach() -> None:
    """Attach the callbacks automatically from now on (idempotent; see the module docstring).

    A framework module imported already is patched at once; the others when they are imported.
    """
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                patch(module)
            except Exception as exc:
                warn(f"could not prepare automatic step timing for {name}: {exc!r}")
