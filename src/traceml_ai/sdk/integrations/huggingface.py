"""Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[TraceMLTrainerCallback()])``.

Every optimisation step is one TraceML step of the Trainer's model: with
``gradient_accumulation_steps=N`` its N micro-batches are merged into that step (their phases summed,
``traceml:step``'s ``n_calls`` = N). Under ``traceml run`` the callback is attached automatically to
a Trainer built without it (:mod:`traceml_ai.capture.frameworks`); passing it yourself is the same.

Import this module only where ``transformers`` is installed; it is never imported by
``import traceml_ai``.
"""

from __future__ import annotations

from traceml_ai.capture.frameworks import huggingface_callback_class

TraceMLTrainerCallback = huggingface_callback_class()
"""A ``transformers.TrainerCallback``; without a capture session it does nothing."""

__all__ = ["TraceMLTrainerCallback"]
