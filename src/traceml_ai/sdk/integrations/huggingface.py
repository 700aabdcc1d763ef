"""Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[TraceMLTrainerCallback()])``.

Every optimisation step (``on_step_begin`` to ``on_step_end``, which spans all the micro-batches
of gradient accumulation) is one ``trace_step`` of the Trainer's model.

Import this module only where ``transformers`` is installed; it is never imported by
``import traceml_ai``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from traceml_ai.sdk.integrations._step import OpenStep


class TraceMLTrainerCallback(TrainerCallback):
    """Times each optimisation step of a Hugging Face ``Trainer`` as one TraceML step.

    Example::

        trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TraceMLTrainerCallback()])

    Without a capture session (no ``traceml run``, no ``traceml_ai.init()``) it does nothing.
    """

    def __init__(self) -> None:
        self._step = OpenStep()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step.open(kwargs.get("model"))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step.close()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step.close()
