"""The wire contract shared by the training ranks and the aggregator (DESIGN §3.1).

- :mod:`traceml_ai.telemetry.schema`: streams, the seven SQLite tables and their columns (000 seed),
  event names of the built-in phases.
- :mod:`traceml_ai.telemetry.frames`: length-prefixed msgpack frames, the protocol version and the
  control frames (hello, welcome, rank_finished).
- :mod:`traceml_ai.telemetry.envelope`: building and normalising telemetry envelopes.

Imports nothing else of ours, so both sides (``capture`` and ``aggregator``) and ``diagnose`` may use it.
"""
