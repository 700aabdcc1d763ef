"""``python -m traceml_ai`` is the ``traceml`` command."""

from traceml_ai.cli.main import main

main()
