"""PyTorch Lightning callback: ``Trainer(callbacks=[TraceMLCallback()])``.

Every training batch (from ``on_train_batch_start`` to ``on_train_batch_end``) is one ``trace_step``
of the LightningModule; with ``accumulate_grad_batches=N`` the N batches of one optimizer update are
merged into one step. Lightning runs forward and backward inside ``optimizer.step(closure)``;
TraceML counts them as forward and backward and only the rest as the optimizer step. Under
``traceml run`` the callback is attached automatically to a Trainer built without it
(:mod:`traceml_ai.capture.frameworks`).

Import this module only where ``lightning`` is installed (it subclasses
``lightning.pytorch.Callback``); it is never imported by ``import traceml_ai``.
"""

from __future__ import annotations

from traceml_ai.capture.frameworks import lightning_callback_class

TraceMLCallback = lightning_callback_class()
"""A ``lightning.pytorch.Callback``; without a capture session it does nothing."""

__all__ = ["TraceMLCallback"]
