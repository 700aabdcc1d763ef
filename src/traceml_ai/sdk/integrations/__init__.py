"""Step telemetry for training frameworks that own the loop (issue: capture, item 7).

- :mod:`.lightning`: ``TraceMLCallback`` for PyTorch Lightning (``lightning.pytorch``).
- :mod:`.huggingface`: ``TraceMLTrainerCallback`` for the Hugging Face ``Trainer``.

Each module imports its framework when it is imported, never before: ``import traceml_ai`` does
not import either. Both wrap every optimisation step in :func:`traceml_ai.trace_step`, so under
``traceml run`` the run gets the same step-time breakdown as a hand-written loop.
"""
