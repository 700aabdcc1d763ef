"""PyTorch Lightning callback: ``Trainer(callbacks=[TraceMLCallback()])``.

Every training batch (from ``on_train_batch_start`` to ``on_train_batch_end``) is one
``trace_step`` of the LightningModule, so the run's step telemetry has forward, backward and
optimizer step per batch. Lightning runs forward and backward inside ``optimizer.step(closure)``;
TraceML counts them as forward and backward and only the rest as the optimizer step.

Import this module only where ``lightning`` is installed (it subclasses
``lightning.pytorch.Callback``); it is never imported by ``import traceml_ai``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from traceml_ai.sdk.integrations._step import OpenStep


class TraceMLCallback(Callback):
    """Times each training batch of a Lightning ``Trainer`` as one TraceML step.

    Example::

        trainer = lightning.Trainer(max_epochs=3, callbacks=[TraceMLCallback()])

    Without a capture session (no ``traceml run``, no ``traceml_ai.init()``) it does nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self._step = OpenStep()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step.open(pl_module)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._step.close(exception)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step.close()
