"""The aggregator: one process per job that receives the ranks' telemetry (DESIGN §1, §3).

- :mod:`~traceml_ai.aggregator.projection`: pure envelope → table-row projection (shared with export records).
- :mod:`~traceml_ai.aggregator.store`: the SQLite writer thread and :func:`~traceml_ai.aggregator.store.open_readonly`.
- :mod:`~traceml_ai.aggregator.server`: the asyncio TCP server (:class:`~traceml_ai.aggregator.server.Aggregator`).
- :mod:`~traceml_ai.aggregator.finalize`: ``finalization_warning.json`` at shutdown.
- ``python -m traceml_ai.aggregator``: the process the launcher starts (:mod:`~traceml_ai.aggregator.__main__`).

Imports only ``telemetry`` (and, later, ``diagnose``) of ours; never torch.
"""
