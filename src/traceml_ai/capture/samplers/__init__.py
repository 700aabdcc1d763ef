"""Built-in row sources of a capture session (DESIGN §3.1 row keys).

Each is a :class:`traceml_ai.capture.sources.RowSource`: ``system`` (host CPU/RAM and every GPU,
node-local rank 0 only), ``process`` (this rank's RSS, CPU and torch CUDA memory),
``runtime_environment`` (topology, torch.distributed state, training strategy) and
``stdout_stderr`` (the rank's Python-level output lines).
"""
