"""Stormlog compatibility face of :mod:`traceml_ai.catalog` (004 seed; DESIGN §1): the same store
under Stormlog's names, no logic of its own. ``import stormlog.query; stormlog.query.open([...])``.
The ``stormlog query ...`` command is ``traceml query ...`` under that name."""
