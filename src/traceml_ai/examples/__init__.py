"""Training scripts shipped with TraceML, run by path (``traceml run``, ``traceml demo``), never
imported by the package. ``examples/`` in the repository links to them."""

from __future__ import annotations

from pathlib import Path

TRAIN_DIGITS = Path(__file__).with_name("train_digits.py")
"""A small MLP on scikit-learn's digits with PyTorch on the CPU, with planted bottlenecks."""
