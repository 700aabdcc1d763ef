"""The rank side of TraceML telemetry (DESIGN §1, §3).

- :mod:`.identity`: who this rank is (torchrun, Slurm, Open MPI or a single process).
- :mod:`.client`: the transport client (bounded queue, background thread, reconnects, counts).
- :mod:`.session`: the capture session: configuration, the sampler thread, row sources.
- :mod:`.samplers`: the built-in row sources (system, process, runtime_environment, stdout_stderr).
- :mod:`.bootstrap`: ``python -m traceml_ai.capture.bootstrap SCRIPT ARGS`` runs a script under capture.
- :mod:`.sources`: the :class:`~traceml_ai.capture.sources.RowSource` protocol.

Imports only :mod:`traceml_ai.telemetry` of ours, and never torch at import time.
"""
